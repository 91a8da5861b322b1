"""Where `metis sessions export --output` and the terminal app's `/export` write a session."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from metis.private_file import write_private


def export_path(given: str | None, session_id: str, fmt: str) -> Path:
    """The file asked for; inside a directory asked for (one that exists, or a path ending in
    `/`), the name the dashboard's download gives (`<id>.<fmt>`), as with `cp FILE DIR`;
    with nothing asked, that name in the current directory."""
    name = f"{session_id}.{fmt}"
    if not given:
        return Path(name)
    path = Path(given).expanduser()
    return path / name if given.endswith("/") or path.is_dir() else path


def write_export(path: Path, data: bytes) -> None:
    """Write an export as a new private file, or in place of a regular one. Anything else found
    there (a symlink, a device such as /dev/null, a pipe) is refused, not replaced: the export is
    written as a new file renamed over the old, which would put a file where the device was."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        what = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
        raise OSError(errno.EEXIST, f"{what}; an export only creates or replaces a file", str(path))
    write_private(path, data)
