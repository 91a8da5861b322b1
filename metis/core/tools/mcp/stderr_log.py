"""A stdio MCP server's stderr log, kept to a bounded size.

A server's stderr is where it says why it failed, most often in its last lines (a traceback
just before it exits). Given the file directly, a server that logs without end, or loops on an
error, would fill the disk. So the daemon reads the server's stderr through a pipe it owns and
copies it into `<key>.stderr.log`, which never grows past `MAX_STDERR_LOG_BYTES`: once it
would, the oldest half goes and a first line says how much was dropped; the newest lines, a
crash's traceback among them, are always kept. The pipe is read as soon as anything is in it,
so a server is never held up by a full pipe, however much it writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import anyio

log = logging.getLogger(__name__)

MAX_STDERR_LOG_BYTES = 4 * 1024 * 1024
"""The most one run's stderr log holds: the last tens of thousands of lines, enough for any
traceback and what led to it; with the previous run's log (`.1`) a server takes at most twice
this on disk."""

READ_BYTES = 64 * 1024  # the most read from the pipe at once


def keep_previous_log(path: Path) -> None:
    """Move a non-empty stderr log to `<name>.1` before a (re)start writes a new one: the run
    that died, whose traceback says why, stays readable next to the one that replaced it."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > 0:
            path.replace(path.with_name(path.name + ".1"))


class CappedLog:
    """One run's stderr log (mode 0600), cut to its newest part whenever it would pass `cap`
    bytes. A write that fails (the disk is full) stops the writing, never the server: its
    output is still read, and dropped."""

    def __init__(self, path: Path, cap: int = MAX_STDERR_LOG_BYTES) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        keep_previous_log(path)
        self.path = path
        self._cap = cap
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.fchmod(self._fd, 0o600)  # an empty log left by an earlier run keeps its own mode
        self._size = 0  # of the file
        self._head = 0  # of its first line when it says what was dropped
        self._written = 0  # all the run wrote
        self._failed = False

    def write(self, data: bytes) -> None:
        """Append `data`; past the cap, keep only the newest part."""
        if self._failed or self._fd < 0:
            return
        try:
            _write_all(self._fd, data, self._size)
            self._size += len(data)
            self._written += len(data)
            if self._size > self._cap:
                self._keep_newest()
        except OSError as exc:
            self._failed = True
            log.warning("stderr log %s: writing stopped (%s)", self.path, exc)

    def _keep_newest(self) -> None:
        """Rewrite the log as its newest half (from the first line that starts in it), after a
        line saying how much of the run's output is gone: a person reading it knows that it
        does not start where the server started."""
        start = max(self._size - self._cap // 2, self._head)  # never within the last such line
        tail = os.pread(self._fd, self._size - start, start)
        newline = tail.find(b"\n")
        if 0 <= newline < len(tail) - 1:
            tail = tail[newline + 1 :]
        head = (
            f"[metis: {self._written - len(tail):,} earlier bytes of this run's stderr "
            f"dropped; the log keeps its newest part, at most {self._cap:,} bytes]\n"
        ).encode()
        _write_all(self._fd, head + tail, 0)
        os.ftruncate(self._fd, len(head) + len(tail))
        self._head, self._size = len(head), len(head) + len(tail)

    def close(self) -> None:
        """Close the file (once; later writes are dropped)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


class StderrPipe:
    """The pipe a server's stderr goes into: `child_fd` is given to the process (and closed here
    once it has it), the daemon reads the other end into the `CappedLog` at `path` until the
    end of file, which comes when every process holding the pipe has exited."""

    def __init__(self, path: Path) -> None:
        self._read_fd, self.child_fd = os.pipe()
        try:
            os.set_blocking(self._read_fd, False)
            self.log_file = CappedLog(path)
        except BaseException:
            os.close(self._read_fd)
            os.close(self.child_fd)
            raise
        self.ended = anyio.Event()

    def started(self) -> None:
        """The process has its copy of the write end: the daemon's goes, so that the end of
        file comes with the process's exit."""
        self._close_child_end()

    def _close_child_end(self) -> None:
        if self.child_fd >= 0:
            os.close(self.child_fd)
            self.child_fd = -1

    async def copy(self) -> None:
        """Copy the server's stderr into the log as it comes, until the end of file."""
        try:
            while True:
                await anyio.wait_readable(self._read_fd)
                try:
                    chunk = os.read(self._read_fd, READ_BYTES)
                except BlockingIOError:
                    continue
                if not chunk:
                    return
                self.log_file.write(chunk)
        finally:
            self.ended.set()

    def close(self) -> None:
        """Close both ends still open and the log. Only once `copy` no longer runs: a
        descriptor closed under a pending wait would be watched in vain."""
        self._close_child_end()
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1
        self.log_file.close()
