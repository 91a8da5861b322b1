"""The repository stands on its own: no tracked file points to files outside it.

Code, tests, docs and shipped config must not cite or read the private design notes that
lived next to the repository: a fresh clone placed anywhere else has to read and test the same.
The rules a reader needs are stated in `docs/` instead.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Built from parts so that this file does not match its own patterns.
_DOT_DOT = re.escape("..") + "/"
_SHARED = "shared"
_DESIGN = "design"
_DOCS = "providers|events|tools|routing|websocket|aap|rest-api"
_SECTION = "\u00a7"
FORBIDDEN = re.compile(
    "|".join(
        [
            _DOT_DOT + _SHARED + r"\b",  # the sibling folder
            _SHARED + "/" + _DESIGN + r"\b",  # its design folder
            r"(?<![\w.-])" + _DESIGN + r"/[\w.-]+\.md\b",  # a design note by path
            r"\b(?:" + _DOCS + r")\.md`?\s*" + _SECTION,  # a design note's section
        ]
    )
)

SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".ruff_cache", ".pytest_cache", ".mypy_cache"}
SKIP_SUFFIXES = {".pyc", ".db", ".sqlite", ".png", ".jpg", ".gif", ".whl", ".gz", ".zip"}


def tracked_files() -> list[Path]:
    """`git ls-files` when this is a git checkout, else every file under the root."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = b""
    if out:
        return [ROOT / name for name in out.decode().split("\0") if name]
    found: list[Path] = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found.extend(Path(folder) / name for name in names)
    return found


def test_patterns_catch_what_they_are_for() -> None:
    bad = [
        "see " + "../" + _SHARED + "/" + _DESIGN + "/examples/routing.yaml",
        "schema: " + _DESIGN + "/routing.md",
        "(" + "routing.md " + _SECTION + "2.4)",
        "`tools.md` " + _SECTION + "9",
        "rest-api.md" + _SECTION + "5",
    ]
    good = ["RFC 6455 " + _SECTION + "5.2", "docs/api.md", "docs/configuration.md", "README.md"]
    assert all(FORBIDDEN.search(text) for text in bad)
    assert not any(FORBIDDEN.search(text) for text in good)


def test_no_file_points_outside_the_repository() -> None:
    hits: list[str] = []
    for path in tracked_files():
        if path.suffix in SKIP_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "lines that point outside the repository:\n" + "\n".join(hits)
