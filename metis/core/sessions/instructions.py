"""Project instructions: the workspace root's `AGENTS.md` (else `CLAUDE.md`) in the system prompt.

At every turn the file is looked up again. A `stat` (mtime, size, inode) that matches the last
read answers from memory, so an unchanged file costs one or two `stat` calls; a changed one is
read (in a thread) and hashed. The text sent to the model is capped at 32 KiB, with a note
saying so. A session announces the file it uses with `session.instructions_loaded` whenever
that file (or its content hash) differs from the one its previous turn used.

Only a regular file whose real path lies inside the workspace, and not among the daemon's own
files in METIS_HOME, is read: a link leading out of the workspace, or to the daemon's key, is
ignored, like any path a tool could not read either. The file opened is checked again (what the
kernel opened, `Sandbox.check_opened`): a process writing the workspace could swap the file for
such a link between the check and the read. A file not used (a link out, not text, too large)
gives way to the next name: a broken AGENTS.md never hides a good CLAUDE.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import stat
from dataclasses import dataclass
from typing import Any

from metis.core.events.bus import EventBus
from metis.core.tools.base import PermissionDenied, ToolError
from metis.core.tools.sandbox import MetisHome, Sandbox

log = logging.getLogger(__name__)

INSTRUCTION_FILES: tuple[str, ...] = ("AGENTS.md", "CLAUDE.md")
MAX_INSTRUCTIONS_BYTES = 32 * 1024
MAX_FILE_BYTES = 8 * 1024 * 1024
"""The largest instruction file read at all: each one is hashed whole (its identity in
`session.instructions_loaded`) when it changes, and a file of gigabytes (`truncate -s 1T`)
would hold a turn's start for minutes. Only the first `MAX_INSTRUCTIONS_BYTES` would be used."""
_CHUNK = 1 << 16


@dataclass(frozen=True)
class ProjectInstructions:
    """One instruction file as read: `bytes` and `sha256` are the whole file's."""

    file: str  # the name at the workspace root: AGENTS.md or CLAUDE.md
    sha256: str
    bytes: int
    truncated: bool
    text: str  # what the system prompt carries (cut to the cap, with the note)

    def wire(self) -> dict[str, Any]:
        """`GET /sessions/{id}`'s `instructions` object."""
        return {"file": self.file, "sha256": self.sha256, "truncated": self.truncated}

    def event_payload(self) -> dict[str, Any]:
        """The `session.instructions_loaded` payload for this file."""
        return {
            "file": self.file,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "truncated": self.truncated,
        }

    def prompt_section(self) -> str:
        """The system prompt's section for these instructions."""
        return (
            f"Project instructions (from {self.file} at the workspace root; follow them "
            f"unless the user says otherwise):\n{self.text}"
        )


def truncation_note(file: str, size: int, cap: int) -> str:
    """The note appended to an instruction file cut at the cap, so the model knows it sees only the
    beginning."""
    return f"[{file} is {size:,} bytes; only its first {cap:,} bytes are included here.]"


def _cut(data: bytes, cap: int) -> str:
    """The first `cap` bytes as text, never ending inside a UTF-8 sequence."""
    end = min(cap, len(data))
    if end < len(data):
        while end > 0 and (data[end] & 0xC0) == 0x80:
            end -= 1
    return data[:end].decode("utf-8", "replace")


class NotText(ValueError):
    """An instruction file with NUL bytes: not text a model should be given as instructions."""


def read_instruction_file(
    path: str, name: str, cap: int, sandbox: Sandbox
) -> tuple[ProjectInstructions, _StatKey]:
    """Read and hash one file (runs in a thread), with the stat key of the file actually read.
    `NotText` for a binary one or one that is no longer a regular file (opened without
    blocking: a FIFO swapped in after the `stat` would otherwise hold the thread for good);
    `PermissionDenied` for one that is no longer inside the workspace or is the daemon's own."""
    digest = hashlib.sha256()
    head = bytearray()
    size = 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotText(path)
        sandbox.check_opened(fd, name)
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if len(head) <= cap:
                head.extend(chunk[: cap + 1 - len(head)])
                if b"\0" in head:  # known from the head: the rest need not be read
                    raise NotText(path)
    truncated = size > cap
    text = _cut(bytes(head), cap)
    if truncated:
        text = f"{text}\n{truncation_note(name, size, cap)}"
    return ProjectInstructions(name, digest.hexdigest(), size, truncated, text), _stat_key(info)


_StatKey = tuple[int, int, int, int]  # (device, inode, size, mtime_ns)


def _stat_key(info: os.stat_result) -> _StatKey:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


class InstructionsReader:
    """Looks up a workspace's instruction file; answers from memory while its `stat` holds."""

    def __init__(
        self, max_bytes: int = MAX_INSTRUCTIONS_BYTES, metis_home: MetisHome | None = None
    ) -> None:
        self.max_bytes = max_bytes
        self.metis_home = metis_home
        # what each instruction file read as, by path, while its stat holds (None: not used,
        # and said so once)
        self._known: dict[str, tuple[_StatKey, ProjectInstructions | None]] = {}
        self.reads = 0  # files actually read (tests check that an unchanged file is not)

    async def read(self, workspace: str) -> ProjectInstructions | None:
        """The workspace's instructions now: its first instruction file that can be used, or
        None when it has none."""
        sandbox = Sandbox(workspace, (), self.metis_home)
        for name in INSTRUCTION_FILES:
            found = await self._file(sandbox, name)
            if found is not None:
                return found
        return None

    async def _file(self, sandbox: Sandbox, name: str) -> ProjectInstructions | None:
        """One instruction file, if it exists and can be used."""
        path = os.path.join(sandbox.root, name)
        try:
            info = os.stat(path)
        except (OSError, ValueError):
            info = None
        if info is None or not stat.S_ISREG(info.st_mode):
            self._known.pop(path, None)
            return None
        key = _stat_key(info)
        known = self._known.get(path)
        if known is not None and known[0] == key:
            return known[1]
        refusal = _refusal(sandbox, name, info)
        if refusal is not None:
            log.warning("%s %s; not used as instructions", path, refusal)
            self._known[path] = (key, None)  # said once, not at every turn
            return None
        try:
            loaded, key = await asyncio.to_thread(
                read_instruction_file, path, name, self.max_bytes, sandbox
            )
        except (NotText, PermissionDenied) as exc:
            reason = "is not a text file" if isinstance(exc, NotText) else _LINKS_OUT
            log.warning("%s %s; not used as instructions", path, reason)
            self.reads += 1
            self._known[path] = (key, None)
            return None
        except OSError as exc:
            log.warning("could not read %s: %s", path, exc)
            return None
        self.reads += 1
        before = known[1] if known is not None else None
        if before is not None and before.sha256 == loaded.sha256:
            loaded = before  # touched, not changed: keep the object (and the prompt) as is
        self._known[path] = (key, loaded)
        return loaded


_LINKS_OUT = "links outside the workspace or into METIS_HOME"


def _refusal(sandbox: Sandbox, name: str, info: os.stat_result) -> str | None:
    """Why a file found by its stat is not read, or None: the sandbox would not let a tool
    read it (a link out of the workspace, the daemon's own files), or it is too large."""
    try:
        sandbox.resolve(name)
    except (PermissionDenied, ToolError):  # the workspace itself gone: nothing to read either
        return _LINKS_OUT
    if info.st_size > MAX_FILE_BYTES:
        return f"is {info.st_size} bytes, over {MAX_FILE_BYTES}"
    return None


class SessionInstructions:
    """The instruction file each session uses, and its `session.instructions_loaded` events."""

    def __init__(self, bus: EventBus, reader: InstructionsReader | None = None) -> None:
        self.bus = bus
        self.reader = reader or InstructionsReader()
        self._in_use: dict[str, ProjectInstructions | None] = {}

    async def for_turn(
        self, session_id: str, turn_id: str, workspace: str, parent_event_id: str | None
    ) -> ProjectInstructions | None:
        """Read the instructions for a turn; announce them when they differ from the last turn's.

        A session's first turn in this daemon's life announces the file it finds (none: no
        event); a later one announces a changed file, or `file: null` when it went away.
        """
        current = await self.reader.read(workspace)
        known = session_id in self._in_use
        previous = self._in_use.get(session_id)
        self._in_use[session_id] = current
        if _identity(current) == _identity(previous) and (known or current is None):
            return current
        payload = (
            current.event_payload()
            if current is not None
            else {"file": None, "sha256": None, "bytes": None, "truncated": None}
        )
        self.bus.emit(
            session_id,
            "session.instructions_loaded",
            payload,
            actor="system",
            turn_id=turn_id,
            parent_event_id=parent_event_id,
        )
        return current

    async def in_use(self, session_id: str, workspace: str) -> ProjectInstructions | None:
        """What the session's last turn used; before any turn, what its next turn would use."""
        if session_id in self._in_use:
            return self._in_use[session_id]
        return await self.reader.read(workspace)

    def holds(self, session_id: str) -> bool:
        """Whether the session's instruction file is still remembered; the memory test checks that
        an ended session leaves nothing."""
        return session_id in self._in_use

    def forget(self, session_id: str) -> None:
        """Drop the session's instruction file (the session ended)."""
        self._in_use.pop(session_id, None)


def _identity(value: ProjectInstructions | None) -> tuple[str, str] | None:
    return None if value is None else (value.file, value.sha256)
