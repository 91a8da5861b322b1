"""File access under the sandbox rules, shared by the file tools.

These functions block; the tools call them from a worker thread. The final path component is
opened with `O_NOFOLLOW` (a file swapped for a symlink after the sandbox check fails instead
of escaping) and `O_NONBLOCK` (opening a FIFO never blocks, the type check then refuses it).

`O_NOFOLLOW` guards the last component only: a directory above it may have been swapped for a
link since `Sandbox.resolve` checked the path (the model's shell writes the workspace while
another tool of the batch runs). So what is opened is checked again by what the kernel opened
(`open_checked`), and a write acts only relative to its checked parent directory's fd.
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
# never through a symlink, never blocking on a FIFO or a device
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# A parent directory is held only to act in it: Linux's O_PATH needs no read permission on it.
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC


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


def open_checked(
    sandbox: Sandbox, path: str, shown: str, flags: int, dir_fd: int | None = None
) -> int:
    """`os.open`, then `Sandbox.check_opened` on what the kernel opened: the path was checked
    before, and a directory on it may have been swapped for a link since. The fd is closed when
    the check fails; `shown` names the path in its error."""
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        sandbox.check_opened(fd, shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(
    sandbox: Sandbox, target: ResolvedPath, access: int = os.O_RDONLY, dir_fd: int | None = None
) -> tuple[int, os.stat_result]:
    """Open an existing regular file (for reading, or `access`); the fd and its stat, or
    `ToolError`. With `dir_fd` (target's parent directory, open and checked) it is opened by
    name in that directory."""
    path = target.real if dir_fd is None else os.path.basename(target.real)
    try:
        fd = open_checked(sandbox, path, target.rel, access | _OPEN_FLAGS, dir_fd)
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
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(
                f"{display(target.rel)} is a directory, not a file; list_dir lists its entries."
            )
        raise not_regular(target.rel)
    return fd, info


def open_parent(sandbox: Sandbox, target: ResolvedPath) -> int:
    """The directory `target` goes in, open and checked, its missing directories created first.

    The nearest existing directory is opened by path and checked; each missing one below it is
    made and opened relative to the one above (never by path again), without following a link,
    and checked too. A directory swapped for a link after `resolve` thus cannot carry the write
    outside the workspace. The missing names are parts of `target.rel`, which `resolve` already
    held to the protected directories."""
    parent = os.path.dirname(target.real)
    missing: list[str] = []
    while not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise _parent_not_a_directory(target)
        missing.append(os.path.basename(parent))
        parent = os.path.dirname(parent)
    fd = _open_directory(sandbox, target, parent, _DIR_FLAGS)
    for name in reversed(missing):
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=fd)
            below = _open_directory(sandbox, target, name, _DIR_FLAGS | os.O_NOFOLLOW, fd)
        finally:
            os.close(fd)
        fd = below
    return fd


def _open_directory(
    sandbox: Sandbox, target: ResolvedPath, path: str, flags: int, dir_fd: int | None = None
) -> int:
    """A parent directory of `target`, open and checked; a name on the way that is no longer a
    directory (a file, a link, gone) fails the write like a parent that is not one."""
    try:
        return open_checked(sandbox, path, target.rel, flags, dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.ENOENT):
            raise _parent_not_a_directory(target) from None
        raise


def _parent_not_a_directory(target: ResolvedPath) -> ToolError:
    return ToolError(f"Cannot create {display(target.rel)}: a parent is not a directory.")


def replace_file(
    sandbox: Sandbox,
    target: ResolvedPath,
    data: bytes,
    *,
    cancelled: Callable[[], bool],
) -> bool:
    """Write `data` to `target`; True when the file was created.

    A temp file in the target directory is renamed over the target, so a reader never sees a
    half-written file and a cancel before the rename leaves the old content. Every step names
    files relative to the directory `open_parent` opened and checked, never by path again. An existing
    file's mode, owner and group are kept; a new file gets the process umask and user like any
    other created file.

    Two existing files are written through their own inode instead (`_write_in_place`), where a
    reader may see a partial file: one with several hard links, which a rename would split
    (the other names keeping the old content), and one whose owner or group this process may
    not give away (it is not root and the file is someone else's), which a rename would hand to
    the daemon's user. Writing in place needs write permission on the file itself, so a file
    the daemon may not write is refused, not replaced behind its mode's back.
    """
    if cancelled():
        raise ToolCancelled()
    directory = open_parent(sandbox, target)
    try:
        name = os.path.basename(target.real)
        try:
            info: os.stat_result | None = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{display(target.rel)} is a directory.")
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise not_regular(target.rel)
        hard_linked = info is not None and info.st_nlink > 1
        if hard_linked or not _write_by_rename(directory, name, data, info, cancelled):
            _write_in_place(sandbox, directory, target, data, cancelled)
    finally:
        os.close(directory)
    return info is None


def _write_by_rename(
    directory: int,
    name: str,
    data: bytes,
    info: os.stat_result | None,
    cancelled: Callable[[], bool],
) -> bool:
    """Replace the file `name` in the open `directory` (its stat is `info`, None when it does
    not exist) by renaming a temp file over it; False, with nothing changed, when the temp file
    cannot take the owner and group of the file it would replace."""
    tmp = f".{name}.{secrets.token_hex(6)}.metis-tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666, dir_fd=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            if info is not None:
                if not _take_owner(handle.fileno(), info):
                    os.unlink(tmp, dir_fd=directory)
                    return False
                # After the chown, which may clear the set-user-ID and set-group-ID bits.
                os.fchmod(handle.fileno(), stat.S_IMODE(info.st_mode))
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if cancelled():
            raise ToolCancelled()
        os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=directory)
        raise
    return True


def _take_owner(fd: int, info: os.stat_result) -> bool:
    """Give the open file `fd` the owner and group in `info`; False when not permitted."""
    own = os.fstat(fd)
    if (own.st_uid, own.st_gid) == (info.st_uid, info.st_gid):
        return True
    try:
        os.fchown(fd, info.st_uid, info.st_gid)
    except PermissionError:
        return False
    return True


def _write_in_place(
    sandbox: Sandbox,
    directory: int,
    target: ResolvedPath,
    data: bytes,
    cancelled: Callable[[], bool],
) -> None:
    """Truncate the existing `target` (opened by name in its open parent `directory`) and write
    `data` through the same inode, so its links, owner, group and mode stay as they are. A
    cancel seen before the truncate leaves the old content; after it, a reader (or a failed
    write) sees a prefix of the new content."""
    fd, _ = open_regular(sandbox, target, os.O_WRONLY, directory)
    with os.fdopen(fd, "wb") as handle:
        if cancelled():
            raise ToolCancelled()
        os.ftruncate(fd, 0)
        handle.write(data)
        handle.flush()
        os.fsync(fd)
