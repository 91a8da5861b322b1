"""File access under the sandbox rules, shared by the file tools.

These functions block; the tools call them from a worker thread. The final path component is
opened with `O_NOFOLLOW` (a file swapped for a symlink after the sandbox check fails instead
of escaping) and `O_NONBLOCK` (opening a FIFO never blocks, the type check then refuses it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable

from metis.core.tools.base import ToolCancelled, ToolError
from metis.core.tools.sandbox import ResolvedPath, Sandbox, display

BINARY_SNIFF_BYTES = 8192
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def not_regular(rel: str) -> ToolError:
    """The error for a path that is a directory, device, FIFO or socket: file tools read and write
    regular files only."""
    return ToolError(f"{display(rel)} is not a regular file.")


def binary_file(rel: str, size: int) -> ToolError:
    """The error for a file that is not UTF-8 text; its size tells the model what it skipped."""
    return ToolError(f"{display(rel)} is a binary file ({size} bytes).")


def is_binary(head: bytes) -> bool:
    """A NUL byte in the first 8 KiB marks a binary file."""
    return b"\0" in head[:BINARY_SNIFF_BYTES]


def open_regular(target: ResolvedPath) -> tuple[int, os.stat_result]:
    """Open an existing regular file for reading; a readable fd and its stat, or `ToolError`."""
    try:
        fd = os.open(target.real, _READ_FLAGS)
    except FileNotFoundError:
        raise ToolError(f"File not found: {display(target.rel)}") from None
    except NotADirectoryError:
        raise ToolError(f"File not found: {display(target.rel)}") from None
    except PermissionError:
        raise ToolError(f"Permission denied: {display(target.rel)}") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise not_regular(target.rel) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise not_regular(target.rel)
    return fd, info


def make_parents(sandbox: Sandbox, target: ResolvedPath) -> None:
    """Create missing parent directories of `target`, re-checking each one against the sandbox first."""
    parent = os.path.dirname(target.real)
    missing: list[str] = []
    while not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise ToolError(f"Cannot create {display(target.rel)}: a parent is not a directory.")
        missing.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(missing):
        checked = sandbox.resolve(directory, write=True)
        try:
            os.mkdir(checked.real)
        except FileExistsError:
            if not os.path.isdir(checked.real):
                raise ToolError(
                    f"Cannot create {display(target.rel)}: a parent is not a directory."
                ) from None


def atomic_write(
    sandbox: Sandbox,
    target: ResolvedPath,
    data: bytes,
    *,
    cancelled: Callable[[], bool],
) -> bool:
    """Write `data` to `target` atomically; True when the file was created.

    A temp file in the target directory is renamed over the target, so a reader never sees a
    half-written file and a cancel before the rename leaves the old content. An existing
    file's mode is kept; a new file gets the process umask like any other created file.
    """
    if cancelled():
        raise ToolCancelled()
    make_parents(sandbox, target)
    try:
        info: os.stat_result | None = os.stat(target.real, follow_symlinks=False)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{display(target.rel)} is a directory.")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise not_regular(target.rel)
    directory, name = os.path.split(target.real)
    tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.metis-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if info is not None:
                os.fchmod(handle.fileno(), stat.S_IMODE(info.st_mode))
            os.fsync(handle.fileno())
        if cancelled():
            raise ToolCancelled()
        os.replace(tmp, target.real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return info is None
