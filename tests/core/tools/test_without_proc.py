"""On Linux the file tools check what the kernel opened through /proc/self/fd; without a
readable /proc (a container that does not mount it) they refuse instead of going unchecked.
Run in a real process whose /proc is an empty tmpfs (bubblewrap)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.shell_sandbox import require_bwrap

ROOT = Path(__file__).resolve().parents[3]
BUILTINS = ROOT / "metis" / "core" / "tools" / "builtins"

CHECK = """
import os, sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {builtins!r})
from metis.core.tools.sandbox import Sandbox
from _grep_search import _opened_as_checked
fd = os.open({file!r}, os.O_RDONLY)
info = os.fstat(fd)
print("grep reads it:", _opened_as_checked(fd, info, {file!r}, info.st_dev, info.st_ino))
try:
    Sandbox({workspace!r}).check_opened(fd, "notes.txt")
    print("opened: unchecked")
except Exception as exc:
    print("opened:", type(exc).__name__)
"""


def test_without_proc_a_file_tool_refuses_rather_than_go_unchecked(tmp_path: Path) -> None:
    bwrap = require_bwrap()
    (tmp_path / "notes.txt").write_text("mine\n")
    script = CHECK.format(
        root=str(ROOT),
        builtins=str(BUILTINS),
        file=str(tmp_path / "notes.txt"),
        workspace=str(tmp_path),
    )
    done = subprocess.run(
        [bwrap, "--dev-bind", "/", "/", "--tmpfs", "/proc", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["grep reads it: False", "opened: PathOutsideWorkspace"]
