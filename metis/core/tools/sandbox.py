"""The workspace sandbox: every file tool path is resolved here.

The sandbox stops model mistakes and injected paths (`../`, absolute paths, symlinks leading
out, writes into `.git`). Tools then act on the resolved real path, never on the string the
model sent. A check made on a path can be raced: between it and the open, a process that may
write the workspace (the model's own sandboxed shell, running beside a file tool) can swap a
directory for a link to a place the shell itself cannot see. So what a tool opens is checked
again by what the kernel opened (`Sandbox.check_opened`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from metis.core.tools.base import (
    MetisHomePath,
    PathOutsideWorkspace,
    ProtectedPath,
    ToolError,
    WorkspaceRootPath,
)

MAX_PATH_CHARS = 4096
WORKSPACE_GONE = "The workspace directory no longer exists."


def is_within(root: str, path: str) -> bool:
    """`path` equals `root` or lies under it by whole components (`/ws-other` is not in `/ws`)."""
    if path == root:
        return True
    prefix = root if root.endswith(os.sep) else root + os.sep
    return path.startswith(prefix)


# The kernel's own limits on a path walk (ELOOP after 40 links); the step bound caps the work a
# chain of long link targets (`d/../d/../…`) can cost, since resolution runs on the event loop.
MAX_LINKS = 40
MAX_STEPS = 4096


class UnresolvablePath(Exception):
    """Too many links or components, or a name the filesystem cannot encode."""


def bounded_realpath(path: str) -> str:
    """`os.path.realpath` of an absolute path (missing parts taken literally, as it does) that
    gives up on a link loop or a chain past the kernel's limits instead of recursing without
    bound: a symlink chain committed to a repository must cost a tool call, not the daemon.

    Raises `UnresolvablePath`, which `Sandbox.resolve` reports as outside the workspace.
    """
    resolved = "/"
    pending = path.split("/")[::-1]  # the next component is last
    links = steps = 0
    while pending:
        part = pending.pop()
        steps += 1
        if steps > MAX_STEPS:
            raise UnresolvablePath
        if part in ("", "."):
            continue
        if part == "..":
            resolved = os.path.dirname(resolved)
            continue
        candidate = os.path.join(resolved, part)
        try:
            target = os.readlink(candidate)
        except (OSError, ValueError) as exc:  # not a link, missing, or not encodable
            if isinstance(exc, ValueError):
                raise UnresolvablePath from None
            resolved = candidate
            continue
        links += 1
        if links > MAX_LINKS:
            raise UnresolvablePath
        if target.startswith("/"):
            resolved = "/"
        pending.extend(target.split("/")[::-1])
    return resolved


ASKS_THE_KERNEL = sys.platform.startswith("linux")
"""Whether the kernel says what an fd is open on (`/proc/self/fd`). Where it should and cannot
(a Linux without `/proc` mounted), a file tool refuses rather than go unchecked."""


def opened_path(fd: int) -> str | None:
    """The real path of the file `fd` is open on, as the kernel resolved it at the open
    (Linux's `/proc/self/fd`); None where the system does not say."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def display(text: str, limit: int = 300) -> str:
    """A path or name safe to show: undecodable bytes and control characters made visible."""
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        # Undecodable file-name bytes (surrogate escapes) become U+FFFD; other lone
        # surrogates are escaped below like control characters.
        with contextlib.suppress(UnicodeEncodeError):
            text = os.fsencode(text).decode("utf-8", "replace")
    text = "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def writes_paths(side_effects: str) -> bool:
    """Tools beyond `read` resolve their path fields as writes (protected directories apply)."""
    return side_effects not in ("none", "read")


OWN_FILES_TTL_S = 1.0
"""How long a walk of METIS_HOME's files (for the hard link check) is reused."""


@dataclass(frozen=True)
class MetisHome:
    """METIS_HOME as workspaces and tools see it (real paths): the daemon's own files (its key,
    database, settings) are out of every tool's reach; the scratch workspaces under it are
    ordinary workspaces."""

    root: str
    scratch: str
    _walked: list[tuple[float, frozenset[tuple[int, int]]]] = field(
        default_factory=list, compare=False, repr=False
    )

    @classmethod
    def at(cls, home: str | os.PathLike[str], scratch: str | os.PathLike[str]) -> MetisHome:
        return cls(os.path.realpath(home), os.path.realpath(scratch))

    def private(self, real: str, info: os.stat_result | None = None) -> bool:
        """Whether a real path is one of the daemon's own: in METIS_HOME, not in its scratch
        workspaces, or a hard link to one of its files (a path check alone lets `ln
        METIS_HOME/api_key notes.txt` through). `info` is the file's stat when it is already
        open (what was opened, not what the path names now)."""
        if is_within(self.root, real) and not is_within(self.scratch, real):
            return True
        if info is None:
            try:  # elsewhere, the scratch workspaces included
                info = os.stat(real)
            except (OSError, ValueError):
                return False
        if not stat.S_ISREG(info.st_mode) or info.st_nlink < 2:
            return False
        return (info.st_dev, info.st_ino) in self._own_files()

    def _own_files(self) -> frozenset[tuple[int, int]]:
        """(device, inode) of every file in METIS_HOME but its scratch workspaces. Walked only
        for a file with more than one link, and again after `OWN_FILES_TTL_S` (the store and the
        logs change), so a search through a tree of hard links (pnpm's `node_modules`) walks it
        once, not once a file."""
        now = time.monotonic()
        if self._walked and now - self._walked[0][0] < OWN_FILES_TTL_S:
            return self._walked[0][1]
        found: set[tuple[int, int]] = set()
        for top, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if not is_within(self.scratch, os.path.join(top, d))]
            for name in files:
                with contextlib.suppress(OSError):
                    info = os.stat(os.path.join(top, name), follow_symlinks=False)
                    found.add((info.st_dev, info.st_ino))
        self._walked[:] = [(now, frozenset(found))]
        return self._walked[0][1]


@dataclass(frozen=True)
class ResolvedPath:
    """A path inside the workspace: `real` to act on, `rel` (POSIX, `.` = root) to show."""

    real: str
    rel: str


class Sandbox:
    """One session's workspace root and the rules for resolving paths under it."""

    def __init__(
        self,
        workspace: str | os.PathLike[str],
        protected_dirs: Iterable[str] = (".git",),
        metis_home: MetisHome | None = None,
    ):
        self.root = os.path.realpath(os.fspath(workspace))
        self.protected_dirs = frozenset(protected_dirs)
        self.metis_home = metis_home  # its own files are never reached, whatever the workspace

    def in_metis_home(self, real: str, info: os.stat_result | None = None) -> bool:
        """Whether a real path is one of the daemon's own files (a workspace walk skips them
        too); `info` is its stat when already taken (see `MetisHome.private`)."""
        return self.metis_home is not None and self.metis_home.private(real, info)

    def check_opened(self, fd: int, shown: str) -> None:
        """Raise as `resolve` would if the file or directory `fd` is open on lies outside the
        workspace or is one of the daemon's own: the path was checked before the open, and a
        directory on it may have been swapped for a link since. `shown` names it in the error."""
        real = opened_path(fd)
        if real is None:
            if ASKS_THE_KERNEL:  # Linux without a readable /proc: refused, never unchecked
                raise PathOutsideWorkspace(display(shown))
            return  # no way to ask on this system: the check before the open stands alone
        if not is_within(self.root, real):
            raise PathOutsideWorkspace(display(shown))
        if self.in_metis_home(real, os.fstat(fd)):
            raise MetisHomePath(display(shown))

    def ensure_root(self) -> None:
        """File tools fail cleanly when the workspace directory vanished under the session."""
        if not os.path.isdir(self.root):
            raise ToolError(WORKSPACE_GONE)

    def relative(self, real: str) -> str:
        """The workspace-relative POSIX form of a real path known to lie inside the root."""
        rel = os.path.relpath(real, self.root)
        return rel.replace(os.sep, "/")

    def resolve(self, path: str, *, write: bool = False) -> ResolvedPath:
        """Resolve `path` in the sandbox or raise `PathOutsideWorkspace` / `ProtectedPath`."""
        if not isinstance(path, str) or not 1 <= len(path) <= MAX_PATH_CHARS or "\0" in path:
            raise PathOutsideWorkspace(display(str(path)))
        self.ensure_root()
        try:
            # `~/…` is the home directory, as in a shell: taken literally it made a directory
            # called `~` in the workspace. An absolute `path` is taken as is.
            real = bounded_realpath(os.path.join(self.root, os.path.expanduser(path)))
        except (UnresolvablePath, ValueError):  # ValueError: a `~user` no system can encode
            raise PathOutsideWorkspace(display(path)) from None
        if not is_within(self.root, real):
            raise PathOutsideWorkspace(display(path))
        if self.in_metis_home(real):
            raise MetisHomePath(display(path))
        rel = self.relative(real)
        if write:
            if real == self.root:
                raise WorkspaceRootPath(display(path))
            if any(part in self.protected_dirs for part in rel.split("/")):
                raise ProtectedPath(display(rel))
        return ResolvedPath(real=real, rel=rel)


class Sandboxes:
    """Makes a `Sandbox` for a workspace under the configured protected directories.

    A turn asks for a fresh one per tool batch: the workspace's real path is read when the
    sandbox is made, so a workspace moved mid-session is seen by the next batch.
    """

    def __init__(self, protected_dirs: Iterable[str], metis_home: MetisHome | None = None) -> None:
        self._protected_dirs = tuple(protected_dirs)
        self._metis_home = metis_home

    def for_workspace(self, workspace: str) -> Sandbox:
        """A sandbox rooted at one session's workspace, with the configured protected directories
        and METIS_HOME out of reach."""
        return Sandbox(workspace, self._protected_dirs, self._metis_home)
