"""Child-process half of `grep_files`: match a regex over a list of files.

CPython's `re` holds the GIL for the whole of a match, so a catastrophic pattern run in a
thread would freeze the daemon's event loop and could not be stopped. Matching therefore runs
in this small stdlib-only script (started with `python -I -S`), which the tool kills on
timeout or cancel. Request: one JSON object on stdin. Reply: one JSON object on stdout.
"""

import json
import os
import re
import stat
import sys
from typing import Any

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
SNIFF_BYTES = 8192
SEARCH_CHARS = 4096
SHOW_CHARS = 300


class Changed(Exception):
    """The file is gone or is no longer the one the daemon checked (replaced by a rename, or a
    directory on its path swapped for a link): it is not read, and the reply says so."""


def _read(real: str, dev: int, ino: int, max_bytes: int) -> bytes | None:
    """The file's bytes, or None for anything that is not a small regular text file; `Changed`
    for one that is not the file the daemon checked."""
    try:
        fd = os.open(real, _FLAGS)
    except PermissionError:
        return None  # unreadable, as it was at the walk: skipped like any unreadable file
    except OSError:
        raise Changed from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not _opened_as_checked(fd, info, real, dev, ino):
            raise Changed
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes or b"\0" in data[:SNIFF_BYTES]:
        return None
    return data


def _opened_as_checked(fd: int, info: os.stat_result, real: str, dev: int, ino: int) -> bool:
    """Whether `fd` is open on the file the daemon checked: the same device and inode and,
    where the kernel says (Linux's `/proc`), the same real path. Between the check and this
    open, a directory on `real` may have been swapped for a link (the model's shell writes the
    workspace meanwhile); the kernel then names where the open really led. The rule itself
    stays in the daemon (`Sandbox.check_opened`): this script imports nothing of metis, so it
    only compares."""
    if (info.st_dev, info.st_ino) != (dev, ino):
        return False
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == real
    except OSError:  # where Linux should say and cannot (no /proc), not read
        return not sys.platform.startswith("linux")


def search(request: dict[str, Any]) -> dict[str, Any]:
    regex = re.compile(request["pattern"], re.IGNORECASE if request["ignore_case"] else 0)
    limit = request["max_results"]
    matches: list[list[Any]] = []
    changed: list[str] = []
    for rel, real, dev, ino in request["files"]:
        try:
            data = _read(real, dev, ino, request["max_file_bytes"])
        except Changed:
            changed.append(rel)
            continue
        if data is None:
            continue
        lines = data.decode("utf-8", "replace").split("\n")
        if lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, 1):
            if line.endswith("\r"):
                line = line[:-1]
            if regex.search(line[:SEARCH_CHARS]) is None:
                continue
            if len(matches) == limit:
                return {"matches": matches, "stopped": True, "changed": changed}
            shown = line if len(line) <= SHOW_CHARS else line[:SHOW_CHARS] + "…"
            matches.append([rel, number, shown])
    return {"matches": matches, "stopped": False, "changed": changed}


def main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    reply = json.dumps(search(request), ensure_ascii=True)
    sys.stdout.write(reply)


if __name__ == "__main__":
    main()
