"""`shell`: run a command in the workspace.

With bubblewrap present the command runs in a sandbox (`bwrap.py`); without it, unsandboxed
and confirmed every time (the dispatcher sees `ToolExecutor.unsandboxed`).

The command gets a scrubbed environment (provider keys never reach it) and its own process
group, so timeout and cancel can stop everything it started; processes that leave the group
are found by the run marker in their environment (`groups.py`) and stopped with it. Output
memory is bounded for any amount of output (head + rolling tail), and a background job that
keeps the pipe open can neither hang the call nor outlive it.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
import time
from collections.abc import Iterable, Mapping
from typing import Any

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import (
    ToolCancelled,
    ToolContext,
    ToolError,
    ToolLimits,
    ToolOutput,
    ToolTimedOut,
)
from metis.core.tools.builtins._common import object_schema
from metis.core.tools.bwrap import ShellSandbox
from metis.core.tools.groups import MARKER_ENV, group_members, kill_marked, new_marker

SAFE_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ", "TMPDIR"})
FIXED_ENV = {
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "NO_COLOR": "1",
}
MAX_COMMAND_CHARS = 16384
_READ_CHUNK = 64 * 1024
# After SIGKILL the main process is gone; a pipe still open belongs to a process that left the
# group (setsid). Waiting longer for it would only hang the call.
_AFTER_KILL_PIPE_WAIT = 1.0


def definition(
    default_timeout: int = 120, max_timeout: int = 600, sandbox: ShellSandbox | None = None
) -> ToolDefinition:
    """The shell's definition; the schema's `maximum` is the configured cap. With `sandbox`,
    the description says what the sandbox allows, so the model expects a write outside the
    workspace or a download to fail instead of learning it from a "Read-only file system"."""
    return ToolDefinition(
        name="shell",
        title="Run shell command",
        description=(
            "Run a command with /bin/sh -c in the workspace root and return its exit code and "
            "combined stdout/stderr. stdin is empty; there is no terminal. Very long output "
            "keeps its beginning and end. The command and everything it starts are stopped "
            "at the timeout; background processes do not survive the call."
            + ("" if sandbox is None else _contained(sandbox))
        ),
        input_schema=object_schema(
            {
                "command": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_COMMAND_CHARS,
                    "description": "The shell command line.",
                },
                "timeout_seconds": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": max_timeout,
                    "default": default_timeout,
                    "description": "Seconds before the command is stopped.",
                },
            },
            required=("command",),
        ),
        side_effects="execute",
    )


def _contained(sandbox: ShellSandbox) -> str:
    network = "the network is reachable" if sandbox.network else "there is no network access"
    return (
        " It runs in a sandbox: only the workspace and a private, empty /tmp are writable, "
        f"the user's credential folders are hidden, and {network}."
    )


def scrubbed_env(
    root: str,
    passthrough: Iterable[str],
    forbidden: Iterable[str],
    source: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Start empty; copy the safe names, `LC_*` and the passthrough; never a forbidden name."""
    source = os.environ if source is None else source
    allowed = set(passthrough)
    env = {
        name: value
        for name, value in source.items()
        if name in SAFE_ENV or name.startswith("LC_") or name in allowed
    }
    for name in forbidden:
        env.pop(name, None)
    env["PWD"] = root
    env.update(FIXED_ENV)
    return env


class OutputCapture:
    """The first `head_limit` and the last `tail_limit` bytes of a stream, plus its size."""

    def __init__(self, head_limit: int, tail_limit: int) -> None:
        self.head_limit = head_limit
        self.tail_limit = tail_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        """Count `data` and keep it only while the head has room or as part of the tail; the middle
        is dropped, so memory stays bounded whatever the command prints."""
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            excess = len(self.tail) - self.tail_limit
            if excess > 0:
                del self.tail[:excess]

    @property
    def omitted(self) -> int:
        """Bytes dropped between the head and the tail."""
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        """The kept output as text, with the omission marker between head and tail."""
        if not self.total:
            return "(no output)"
        if not self.omitted:
            return bytes(self.head + self.tail).decode("utf-8", "replace")
        head = codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(self.head))
        tail = bytes(self.tail).lstrip(bytes(range(0x80, 0xC0)))  # resume on a char start
        # How to get at the rest too: the model can rerun the command into a file.
        marker = (
            f"[… {self.omitted} bytes omitted; to see them, send the output to a file and "
            "read it in parts …]"
        )
        return f"{head}\n{marker}\n{tail.decode('utf-8', 'replace')}"


class ShellTool:
    """The builtin `shell`: a command in the workspace with a scrubbed environment, in the sandbox
    when one is available."""

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        ctx.workspace.ensure_root()
        root = ctx.workspace.root
        env = scrubbed_env(root, ctx.limits.env_passthrough, ctx.limits.forbidden_env)
        if ctx.shell_sandbox is not None:
            env["TMPDIR"] = "/tmp"  # the sandbox's private tmpfs; the host's TMPDIR is read-only
        return await _Run(input["command"], root, env, ctx).execute()


class _Run:
    """One command: spawn, pump output, stop the group, build the result."""

    def __init__(self, command: str, root: str, env: dict[str, str], ctx: ToolContext) -> None:
        self.command = command
        self.root = root
        self.env = env
        self.ctx = ctx
        self.limits: ToolLimits = ctx.limits
        self.capture = OutputCapture(ctx.limits.shell_head_bytes, ctx.limits.shell_tail_bytes)
        self.stopped = False
        self.pgid = 0
        self.marker = new_marker()
        sandbox = ctx.shell_sandbox
        self.argv = ["/bin/sh", "-c", command] if sandbox is None else sandbox.argv(command, root)

    async def execute(self) -> ToolOutput:
        read_fd, write_fd = os.pipe()
        transport, reader = await self._open_reader(read_fd)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv,
                cwd=self.root,
                env={**self.env, MARKER_ENV: self.marker},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=write_fd,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:
            transport.close()
            raise ToolError(f"Could not start the shell: {exc}") from None
        finally:
            os.close(write_fd)  # the child holds its copy; EOF comes when the group lets go
        self.pgid = proc.pid  # start_new_session: the child (sh, or bwrap) leads its own group
        groups = self.ctx.groups
        if groups is not None:
            groups.enter(self.pgid, self.marker)
        pump = asyncio.create_task(self._pump(reader))
        exited = asyncio.create_task(proc.wait())
        stop = asyncio.create_task(self.ctx.cancel_event.wait())
        try:
            await asyncio.wait(
                {exited, stop}, timeout=self.ctx.remaining(), return_when=asyncio.FIRST_COMPLETED
            )
            if exited.done():
                # The main process is done; give background jobs holding the pipe 2 s.
                await asyncio.wait({pump}, timeout=self.limits.shell_pipe_wait_seconds)
                await self._stop_group(exited, pump)
                return self._result(exited.result())
            await self._stop_group(exited, pump)
            if stop.done():
                raise ToolCancelled(self.capture.text())
            raise ToolTimedOut(self.capture.text())
        finally:
            stop.cancel()
            if not self.stopped:  # unwinding abnormally (task cancelled): leave nothing behind
                self._signal(signal.SIGKILL)
                kill_marked(self.marker)
            if groups is not None:
                groups.leave(self.pgid)
            pump.cancel()
            exited.cancel()
            transport.close()

    async def _open_reader(self, fd: int) -> tuple[asyncio.ReadTransport, asyncio.StreamReader]:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_READ_CHUNK, loop=loop)
        pipe = os.fdopen(fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe
        )
        return transport, reader

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(_READ_CHUNK):
            self.capture.feed(chunk)

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    def _terminate(self) -> None:
        """SIGTERM the command's processes. In the sandbox the group leader is bwrap: a SIGTERM
        would kill it, and `--die-with-parent` would then SIGKILL the whole sandbox at once,
        leaving the command no grace. So there every member but bwrap gets it (bwrap's init in
        the sandbox ignores it from outside); a process forked between scan and kill misses
        the SIGTERM only, never the SIGKILL."""
        if self.ctx.shell_sandbox is None:
            self._signal(signal.SIGTERM)
            return
        for pid in group_members(self.pgid):
            if pid != self.pgid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)

    async def _stop_group(self, exited: asyncio.Task[int], pump: asyncio.Task[None]) -> None:
        """SIGTERM the group, allow the grace period, then SIGKILL it; always reap the child.

        The grace ends early once the main process has exited and the pipe is closed. The
        final SIGKILL also reaches members that ignore SIGTERM and hold no pipe.
        """
        self._terminate()
        started = time.monotonic()
        await asyncio.wait({exited, pump}, timeout=self.limits.shell_kill_grace_seconds)
        self._signal(signal.SIGKILL)
        self.stopped = True
        escaped = await asyncio.to_thread(kill_marked, self.marker)
        if escaped:
            self.ctx.log.info(
                "shell %s: killed %d process(es) that had left its group",
                self.ctx.tool_use_id,
                escaped,
            )
        await asyncio.wait({exited})
        if not pump.done():
            await asyncio.wait({pump}, timeout=_AFTER_KILL_PIPE_WAIT)
        self.ctx.log.debug(
            "shell %s: process group %d stopped in %.2f s",
            self.ctx.tool_use_id,
            self.pgid,
            time.monotonic() - started,
        )

    def _result(self, returncode: int) -> ToolOutput:
        code = returncode if returncode >= 0 else 128 - returncode
        return ToolOutput.text(
            f"exit_code: {code}\n{self.capture.text()}",
            is_error=code != 0,
            exit_code=code,
            truncated=self.capture.omitted > 0,
        )
