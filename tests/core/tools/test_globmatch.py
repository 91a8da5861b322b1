"""`glob_matches`: how grep_files' `glob` selects workspace-relative paths."""

from __future__ import annotations

import pytest

from metis.core.tools.globmatch import glob_matches


@pytest.mark.parametrize(
    ("glob", "rel", "expected"),
    [
        ("*.py", "a.py", True),
        ("*.py", "src/pkg/a.py", True),  # a bare name matches at any depth
        ("**/*.py", "a.py", True),
        ("**/*.py", "src/pkg/a.py", True),
        ("src/**/*.py", "src/a.py", True),
        ("src/**/*.py", "src/x/y/a.py", True),
        ("src/**/*.py", "lib/src/a.py", False),
        ("src/*.py", "src/a.py", True),
        ("src/*.py", "src/x/a.py", False),  # `*` stays within one name
        ("./src/*.py", "src/a.py", True),
        ("src/**", "src/x/a.py", True),
        ("a/**/b/**/c.py", "a/b/x/c.py", True),
        ("a/**/b/**/c.py", "a/x/y/b/c.py", True),
        ("a/**/b/**/c.py", "a/x/c.py", False),
        ("test_?.py", "tests/test_1.py", True),
        ("[ab].txt", "b.txt", True),
        ("*.PY", "a.py", False),  # case-sensitive, as file names are
    ],
)
def test_glob_matches(glob: str, rel: str, expected: bool) -> None:
    assert glob_matches(rel, glob) is expected


def test_many_double_stars_cost_no_backtracking() -> None:
    """A pattern of many `**` against a deep path that does not match answers at once (a
    regex translation would backtrack for ages); no timing: the work is bounded by design."""
    rel = "/".join(["d"] * 60) + "/f.txt"
    assert glob_matches(rel, "**/" * 80 + "nope/*.py") is False
