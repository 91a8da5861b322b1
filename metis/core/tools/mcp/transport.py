"""The stdio transport of an MCP server, contained like the shell's commands.

The SDK's `stdio_client` runs the server in its own session but does not say which process it
started. metis must know: the server's process group is noted in the `ProcessGroupLedger`
while it runs (start-up recovery kills what a SIGKILLed daemon left behind), and the server
carries the ledger's run marker, so a process that leaves the group is found and killed too.
This transport spawns the process itself and speaks the same newline-delimited JSON-RPC. The
server's stderr goes through the daemon into a log of bounded size (`stderr_log`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import mcp_types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from metis.core.tools.groups import MARKER_ENV, ProcessGroupLedger, kill_marked, new_marker
from metis.core.tools.mcp.stderr_log import StderrPipe
from metis.core.tools.textutil import cut

log = logging.getLogger(__name__)

# What the server process inherits from the daemon; everything else comes from its `env`.
INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR")
EXIT_GRACE_SECONDS = 2.0  # after stdin closes, before SIGTERM to the group
KILL_GRACE_SECONDS = 2.0  # after SIGTERM, before SIGKILL
STDERR_DRAIN_SECONDS = 1.0
"""After the server's group is stopped, how long its stderr is still read for the end of file:
what it wrote last is in the pipe until then. A process that escaped both the group and the
marker may hold the pipe open for ever; the log then ends here."""


def server_environment(
    configured: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A minimal inherited environment plus the server's own `env` (which wins)."""
    source = os.environ if environ is None else environ
    env = {name: source[name] for name in INHERITED_ENV if name in source}
    env.update(configured)
    return env


STOPPED = "stopped by metis"
"""The reason of a connection metis ended itself (a timeout, a restart, shutdown): the exit
that follows is not the server's doing, and its status says nothing of why it failed."""


@dataclass
class Liveness:
    """Set once the connection is over: the process exited or its stdout ended."""

    dead: anyio.Event = field(default_factory=anyio.Event)
    reason: str = ""

    def end(self, reason: str) -> None:
        """Mark the connection over; the first reason is kept."""
        if not self.dead.is_set():
            self.reason = reason
            self.dead.set()

    @property
    def ended_by_itself(self) -> bool:
        """Whether the server ended the connection (exited, closed its output) before metis
        stopped it."""
        return self.dead.is_set() and self.reason != STOPPED


MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The longest message (one line) a stdio server may send. Its lines are held in memory until
they end, so a server writing without end (or a result of hundreds of MB, of which the model
would see `max_result_bytes`) would otherwise grow the daemon until the kernel kills it. Past
this, the connection is closed as broken: the call in flight fails and the server restarts.
16 MiB holds any result the tools keep (a 5 MiB image is ~7 MiB of base64)."""

_TOO_LONG = f"the server sent a message over {MAX_MESSAGE_BYTES // (1024 * 1024)} MiB"


STRAY_SHOWN = 80  # characters of a stray stdout line quoted in a start failure


@dataclass
class StdioProcess:
    """A stdio server process as started: its pid, its run marker and whether it is still alive, for
    the ledger and for a kill at shutdown; and the first line of its stdout that was not JSON-RPC
    (a server logging on stdout), which says why it never answered."""

    pid: int
    marker: str
    liveness: Liveness
    stray_line: str | None = None

    def note_stray(self, line: str) -> None:
        """Keep the first stray line, escaped and cut: it is the server's text, shown to a
        person in `last_error`."""
        if self.stray_line is None:
            self.stray_line = repr(cut(line.strip(), STRAY_SHOWN))


def _parse(line: str) -> SessionMessage | Exception:
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return exc
    return SessionMessage(message)


@contextlib.asynccontextmanager
async def stdio_transport(
    command: str,
    args: tuple[str, ...],
    env: dict[str, str],
    cwd: str | None,
    *,
    ledger: ProcessGroupLedger | None,
    stderr_path: Path | None,
    started: list[StdioProcess],
) -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """Spawn the server in its own session and bridge its pipes to the session's streams.

    `started` receives the process (pid, marker, liveness) once it runs.
    """
    marker = new_marker()
    errpipe = StderrPipe(stderr_path) if stderr_path is not None else None
    try:
        process = await anyio.open_process(
            [command, *args],
            env={**env, MARKER_ENV: marker},
            cwd=cwd,
            stderr=subprocess.DEVNULL if errpipe is None else errpipe.child_fd,
            start_new_session=True,
        )
    except BaseException:
        if errpipe is not None:
            errpipe.close()
        raise
    if errpipe is not None:
        errpipe.started()
    if ledger is not None:
        ledger.enter(process.pid, marker)
    liveness = Liveness()
    entry = StdioProcess(process.pid, marker, liveness)
    started.append(entry)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    def exited() -> None:
        liveness.end(f"the server process exited with status {process.returncode}")

    def output_ended() -> None:
        if process.returncode is not None:
            exited()
        liveness.end("the server closed its output")

    async def stdout_reader() -> None:
        assert process.stdout is not None
        unfinished: list[bytes] = []  # a line's chunks so far: joined once, when it ends
        held = 0  # their bytes
        too_long = False
        try:
            async with read_writer:
                async for chunk in process.stdout:
                    end = chunk.find(b"\n")  # the later lines of a chunk are shorter than it
                    if held + (len(chunk) if end < 0 else end) > MAX_MESSAGE_BYTES:
                        liveness.end(_TOO_LONG)
                        too_long = True
                        break
                    if end < 0:
                        unfinished.append(chunk)
                        held += len(chunk)
                        continue
                    first, *rest = chunk.split(b"\n")
                    lines = [b"".join([*unfinished, first]), *rest[:-1]]
                    unfinished = [rest[-1]] if rest[-1] else []
                    held = len(rest[-1])
                    for line in lines:
                        if line.strip():
                            parsed = _parse(line.decode("utf-8", "replace"))
                            if isinstance(parsed, Exception):
                                entry.note_stray(line.decode("utf-8", "replace"))
                            await read_writer.send(parsed)
                else:
                    # most often the process is exiting, and its status says why: known before
                    # the session sees its stream close
                    await _wait_exit(process, 0.5)
                    output_ended()
            if too_long:
                # the rest is dropped as it comes, until the stopped server's pipe ends: a pipe
                # left unread stays paused, and its process's transport is never closed
                async for _ in process.stdout:
                    pass
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            output_ended()

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # most often the process exited: its status, not the closed pipe, says why
            if await _wait_exit(process, 0.5):
                exited()
            await read_writer.aclose()

    async def exit_watcher() -> None:
        while process.returncode is None:
            await anyio.sleep(0.05)
        exited()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stdout_reader)
            tg.start_soon(stdin_writer)
            tg.start_soon(exit_watcher)
            if errpipe is not None:
                tg.start_soon(errpipe.copy)
            try:
                yield read_stream, write_stream
            finally:
                liveness.end(STOPPED)
                with anyio.CancelScope(shield=True):
                    await _stop(process, marker)
                    if errpipe is not None:  # its last lines, a crash's traceback, are kept
                        with anyio.move_on_after(STDERR_DRAIN_SECONDS):
                            await errpipe.ended.wait()
                    for stream in (read_stream, write_stream, read_writer, write_reader):
                        await stream.aclose()
                tg.cancel_scope.cancel()
    finally:
        _stopped(process, entry, ledger)
        if errpipe is not None:
            errpipe.close()


def _stopped(
    process: anyio.abc.Process, entry: StdioProcess, ledger: ProcessGroupLedger | None
) -> None:
    """After the stop: a process still running (its stop was cut short: the owner task was
    cancelled, a shield does not hold against that) is killed now, without awaiting. Its note
    leaves the ledger only once it is known to have exited, so that a note kept lets the next
    start reap whatever the kill missed."""
    if process.returncode is None:
        kill_now([entry])
    elif ledger is not None:
        ledger.leave(process.pid)


async def _wait_exit(process: anyio.abc.Process, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        while process.returncode is None:
            await anyio.sleep(0.02)
    return process.returncode is not None


async def _stop(process: anyio.abc.Process, marker: str) -> None:
    """Close stdin, give the server a moment, then SIGTERM and SIGKILL its whole group, and
    kill whatever still carries its marker (a process that left the group)."""
    if process.stdin is not None:
        with contextlib.suppress(Exception):
            await process.stdin.aclose()
    if process.returncode is None and not await _wait_exit(process, EXIT_GRACE_SECONDS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        if not await _wait_exit(process, KILL_GRACE_SECONDS):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await _wait_exit(process, KILL_GRACE_SECONDS)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # members left behind by an exited leader
    kill_marked(marker)
    if process.stdout is not None:
        with contextlib.suppress(Exception):
            await process.stdout.aclose()


def kill_now(started: list[StdioProcess]) -> None:
    """Past the shutdown grace: SIGKILL the groups at once (no awaiting)."""
    for proc in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        kill_marked(proc.marker)
