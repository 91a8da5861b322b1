"""One daemon per METIS_HOME: an exclusive `flock` on `METIS_HOME/daemon.lock`.

`metis serve` takes the lock before it opens the store and holds it for the life of the
process; the file says which process holds it (`pid`) and where it listens (`url`), so a second
`metis serve` on the same home can name them. The kernel releases a `flock` when its holder
dies, however it dies (kill -9 included): a lock file left behind never blocks a start, and the
file is never deleted (deleting it would let two processes lock two different files).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

LOCK_FILE = "daemon.lock"
PROBE_WAIT_S = 0.2
"""How long a start waits out a lock held only shared: a client's look (`is_held`) lasts an
instant, a daemon's hold is exclusive and lasts its life."""


class DaemonAlreadyRunning(Exception):
    """Another process holds this METIS_HOME's lock."""

    def __init__(self, home: Path, pid: int | None, url: str | None) -> None:
        self.home, self.pid, self.url = home, pid, url
        who = f"pid {pid}" if pid is not None else "another process"
        where = f" at {url}" if url else " (still starting; no URL yet)"
        super().__init__(
            f"a metis daemon is already running on {home}: {who}{where}. "
            f"Use it (`metis chat`), stop it (`metis stop`), or start this one on another home "
            f"(`metis serve --home DIR` or METIS_HOME=DIR)."
        )


class LockFileUnwritable(OSError):
    """The lock file cannot be written (a full disk): said naming the file, which the bare
    error of a write to an open descriptor does not."""

    def __init__(self, path: Path, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.path = path

    def __str__(self) -> str:
        return f"cannot write {self.path}: {self.strerror}"


class DaemonLock:
    """The held lock; `record(url)` once the address is known, `release()` at exit."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def record(self, url: str | None) -> None:
        assert self._fd is not None, "lock released"
        data = json.dumps({"pid": os.getpid(), "url": url}).encode() + b"\n"
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)
        except OSError as exc:
            raise LockFileUnwritable(self.path, exc) from None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no stale pid/URL for the next reader
            os.close(fd)  # closing the only descriptor releases the flock


def read_holder(path: Path) -> tuple[int | None, str | None]:
    """The pid and URL a lock file names (None for what it does not say)."""
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    pid, url = data.get("pid"), data.get("url")
    return (pid if isinstance(pid, int) else None, url if isinstance(url, str) else None)


def running_url(path: Path) -> str | None:
    """The URL of the daemon holding this lock file; None when the file says no URL or no one
    holds the lock. A daemon killed with -9 leaves its file as it was, naming a pid another
    process may have by now (after a reboot, surely): a live pid alone is not a daemon."""
    pid, url = read_holder(path)
    if pid is None or url is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, under another user
        pass
    return url if is_held(path) else None


def is_held(path: Path) -> bool:
    """Whether a live process holds this lock file's lock, asked of the kernel rather than of
    the file's contents (a pid a killed daemon left may since name another process).

    The probe takes a shared lock for an instant; a daemon starting in that instant waits it
    out (`acquire`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):  # no lock file, or no home to hold one
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the probe's lock
    return False


def _lock_exclusively(fd: int, path: Path) -> None:
    """`flock(LOCK_EX)` without blocking on a daemon, but past a client's look at the lock:
    while nobody holds it exclusively (the test: a shared lock can be had), try again for
    `PROBE_WAIT_S`. Raises BlockingIOError when a daemon holds it."""
    deadline = time.monotonic() + PROBE_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline or _held_exclusively(path):
                raise
        time.sleep(0.005)


def _held_exclusively(path: Path) -> bool:
    """Whether a shared lock cannot be had: someone (a daemon) holds the lock exclusively."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def acquire(home: Path) -> DaemonLock:
    """Take the home's lock or raise DaemonAlreadyRunning naming its holder."""
    path = home / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        _lock_exclusively(fd, path)
    except BlockingIOError:
        os.close(fd)
        raise DaemonAlreadyRunning(home, *read_holder(path)) from None
    except BaseException:
        os.close(fd)
        raise
    lock = DaemonLock(path, fd)
    try:
        lock.record(None)
    except BaseException:
        lock.release()
        raise
    return lock
