"""One configured MCP server: its connection, its lifecycle, its tools.

A single owner task holds the connection (the SDK's anyio contexts must be entered and left
in one task): connect → `initialize` → `tools/list` → ready, its tools registered → wait until
the connection ends (the process exits, its output closes, a ping fails) or the daemon stops →
restart after a backoff (1 s doubling to 60 s; reset once a connection became ready). Tool
calls run in the dispatcher's tasks and use the ready session; a server that is not ready
fails them at once with a reason (`McpUnavailable`), and a call in flight when the connection
ends fails with the reason it ended.

A restart asked for by a person (`restart()`: the server was fixed, or is stuck starting) ends
the connection in whatever phase it is — waiting for an answer to `initialize`, ready, or
waiting out a backoff — through the same unwinding as a connection that ended by itself, and
connects again at once with the backoff starting over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import httpx2
import mcp_types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED
from pydantic import ValidationError

from metis.core.canonical.redaction import redact, register_secret
from metis.core.connect_errors import exception_chain, os_refusal
from metis.core.errors import ConfigError, McpServerDisabled
from metis.core.tools.base import ToolError
from metis.core.tools.groups import ProcessGroupLedger
from metis.core.tools.mcp import tools as mcp_tools
from metis.core.tools.mcp.listing import tolerant_tool_listings
from metis.core.tools.mcp.settings import (
    McpServerSettings,
    McpSettings,
    args_secrets,
    configured_secrets,
    displayed_args,
    displayed_url,
    expand,
    server_key,
    url_secrets,
)
from metis.core.tools.mcp.transport import (
    Liveness,
    StdioProcess,
    kill_now,
    server_environment,
    stdio_transport,
)
from metis.core.tools.registry import RegisteredTool

log = logging.getLogger(__name__)

State = Literal["starting", "ready", "restarting", "stopped", "disabled"]
CLIENT_INFO = mcp_types.Implementation(name="metis", version="1")
MAX_TOOLS_PAGES = 20
STABLE_AFTER_S = 30.0
"""A connection up this long resets the restart backoff; one that dies sooner counts as a failed
start, so a server that crashes a second after each start is not restarted every second."""


class McpUnavailable(ToolError):
    """The server cannot take the call (down, restarting, or it died mid-call)."""


@dataclass(frozen=True)
class ToolInfo:
    """One tool a server listed: its offered name, its name on the server and its confirmation mode
    (shown by the status endpoints)."""

    name: str  # as offered: mcp__<server>__<tool>
    remote_name: str
    description: str
    mode: str


class McpServer:
    """One configured MCP server: its state, its restarts and the tools it registered, driven by a
    single owner task."""

    def __init__(
        self,
        name: str,
        settings: McpServerSettings,
        section: McpSettings,
        *,
        on_tools: Callable[[McpServer], None],
        ledger: ProcessGroupLedger | None,
        log_dir: Path | None,
    ) -> None:
        self.name = name
        self.key = server_key(name)
        self.settings = settings
        self.section = section
        self.on_tools = on_tools
        self.ledger = ledger
        self.log_dir = log_dir
        self.state: State = "disabled" if not settings.enabled else "stopped"
        self.last_error: str | None = None
        self.tools: list[ToolInfo] = []
        self.restarts = 0
        self.connected_at: float | None = None
        self.pid: int | None = None
        self._session: ClientSession | None = None
        self._liveness: Liveness | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._restart_now = asyncio.Event()
        self._connecting: anyio.CancelScope | None = None
        self._processes: list[StdioProcess] = []
        self._skipped: list[str] = []
        self._listed_notes: list[str] = []  # of its own listing: the tools it cannot offer
        self.offered: list[tuple[ToolInfo, RegisteredTool]] = []  # as it would offer them
        self._held_elsewhere: dict[str, str] = {}  # names of `offered` it does not hold
        self._http_refusal: str | None = None  # `HTTP 401 Unauthorized`, seen in this attempt

    # -- wire view --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """`GET /mcp`'s object: names of env variables and headers, never their values, and
        the command and URL with the credentials written into them hidden."""
        s = self.settings
        return {
            "name": self.name,
            "transport": s.transport,
            "enabled": s.enabled,
            "state": self.state,
            "command": s.command,
            "args": displayed_args(s.args),
            "url": displayed_url(s.url) if s.url else None,
            "env": sorted(s.env),
            "headers": sorted(s.headers),
            "policy": s.policy,
            "tools": [
                {
                    "name": t.name,
                    "remote_name": t.remote_name,
                    "policy": t.mode,
                    "description": t.description,
                }
                for t in self.tools
            ],
            "restarts": self.restarts,
            "last_error": self.last_error,
        }

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the owner task (once; a disabled server never starts)."""
        if self.settings.enabled and self._task is None:
            self.state = "starting"
            self._task = asyncio.create_task(self._run(), name=f"mcp-server-{self.name}")

    async def stop(self) -> None:
        """Stop the owner task and wait for it to close the connection and the process. A
        connection still starting (a server slow to answer `initialize`) is ended through its
        cancel scope, as `restart()` ends it: it does not hold the daemon's shutdown until its
        connect timeout. Never by cancelling the task: a native cancel also cuts short the
        shielded stop of a process being stopped (a failed start), which would then run on."""
        self._stop.set()
        if self._connecting is not None:
            self._connecting.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.settings.enabled:
            self.state = "stopped"

    def restart(self) -> None:
        """End the current connection and connect again now, the backoff starting over. The
        state says `restarting` at once; the old `last_error` goes (the next attempt says its
        own). A server not started yet is started."""
        if not self.settings.enabled:
            raise McpServerDisabled(self.name)
        if self._stop.is_set():
            return  # the daemon is stopping
        if self._task is None:
            self.start()
            return
        log.info("MCP server %s: restart requested", self.name)
        self.state = "restarting"
        self.last_error = None
        self._restart_now.set()
        if self._connecting is not None:
            self._connecting.cancel()

    def reconfigure(self, settings: McpServerSettings, section: McpSettings) -> None:
        """Take the server's entry and the `mcp` section as config.yaml has them now. The
        next connection uses them (`restart` starts one); the current one goes on until then."""
        self.settings, self.section = settings, section

    async def withdraw(self) -> None:
        """Stop the server for good and take its tools back from the registry: config.yaml no
        longer runs it (disabled, or removed). Enabled again, `restart` starts it afresh."""
        await self.stop()
        self._listed_notes, self.offered = [], []
        self.on_tools(self)
        self.state = "disabled"
        self.last_error = None
        self._task = None
        self._stop = asyncio.Event()
        self._restart_now.clear()

    def kill(self) -> None:
        """Past the shutdown grace: kill the process groups without awaiting anything."""
        kill_now(self._processes)

    async def wait_ready(self, timeout: float) -> bool:
        """Wait until the server is ready or `timeout` passes; True if ready."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)
        return self._ready.is_set()

    async def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            became_ready = False
            retried = True
            try:
                became_ready = await self._connect_and_serve()
            except ConfigError as exc:
                # a `${VAR}` the daemon's environment lacks: trying again cannot help, only an
                # edit of config.yaml applied by a reload or a restart can
                retried = False
                self._fail(
                    f"{exc.message}; not retried until config.yaml changes (then `metis mcp reload`)"
                )
            except Exception as exc:
                if not self._restart_now.is_set():
                    self._fail(self._start_failure(exc))
            finally:
                self._session = None
                self._ready.clear()
                self.pid = None
            if self._stop.is_set():
                break
            if self._restart_now.is_set():  # asked for: again at once, as a fresh start
                self._restart_now.clear()
                failures = 0
                self.state = "restarting"
                self.restarts += 1
                continue
            if not retried:
                self.state = "stopped"
                log.warning("MCP server %s cannot start (%s)", self.name, self.last_error)
                await _any_of(self._stop, self._restart_now)
                if self._restart_now.is_set():  # asked for: counted as any restart on request
                    self._restart_now.clear()
                    self.restarts += 1
                continue
            # a server that dies soon after each start backs off as one that never starts
            up_s = time.monotonic() - self.connected_at if self.connected_at is not None else 0.0
            stable = became_ready and up_s >= STABLE_AFTER_S
            failures = 0 if stable else failures + 1
            delay = min(
                self.section.restart_max_seconds,
                self.section.restart_initial_seconds * 2 ** max(0, failures - 1),
            )
            self.state = "restarting"
            self.restarts += 1
            log.warning(
                "MCP server %s is down (%s); restarting in %.1f s",
                self.name,
                self.last_error,
                delay,
            )
            await _any_of(self._stop, self._restart_now, timeout=delay)
            if self._restart_now.is_set():  # the restart counted above, only sooner
                self._restart_now.clear()
                failures = 0
        self.state = "stopped"

    def _fail(self, reason: str) -> None:
        self.last_error = redact(reason, limit=500)

    def _start_failure(self, exc: BaseException) -> str:
        """Why a connection failed, in the user's terms: a missing working directory is not a
        missing command; the server's own answer (an MCP error, an invalid answer) comes first,
        then an exit of its own, with which status and where its stderr went (the SDK only sees
        its pipe close), then what metis saw (no answer in time). The exit metis caused by
        stopping the process says nothing and is never the reason. A line the server wrote to
        stdout that is not JSON-RPC (its logs) is quoted: it is why a server never answers."""
        process = self._attempt_process()
        reason = self._failure_cause(exc, process)
        if process is not None and process.stray_line is not None:
            reason += (
                f"; the server wrote non-JSON-RPC to stdout: {process.stray_line} "
                "(stdout carries MCP messages only; logs belong on stderr)"
            )
        return reason

    def _failure_cause(self, exc: BaseException, process: StdioProcess | None) -> str:
        cwd = self.settings.cwd
        if isinstance(exc, FileNotFoundError) and cwd and not os.path.isdir(cwd):
            return f"working directory not found: {cwd}"
        invalid = _found_in(exc, ValidationError)
        if invalid is not None:  # the client hung up on it: the process's exit is not the cause
            return _describe_invalid_answer(invalid)
        refused = _found_in(exc, MCPError)
        if self.settings.transport == "http" and self._http_refusal is not None:
            return self._describe_http_refusal(self._http_refusal, refused)
        if refused is not None and refused.code != CONNECTION_CLOSED:
            return self._describe(refused)
        if process is not None and process.liveness.ended_by_itself:
            where = f" (its stderr: {self._stderr_path()})" if self.log_dir is not None else ""
            return f"{process.liveness.reason}{where}"
        return self._describe(exc)

    def _attempt_process(self) -> StdioProcess | None:
        """The process of the attempt that just failed; None when it failed before one ran
        (the last one started is then an earlier attempt's)."""
        if self.pid is None or not self._processes or self._processes[-1].pid != self.pid:
            return None
        return self._processes[-1]

    def _stderr_path(self) -> Path | None:
        return self.log_dir / f"{self.key}.stderr.log" if self.log_dir is not None else None

    def _describe_http_refusal(self, status: str, refused: MCPError | None) -> str:
        """An HTTP server's refusal by its status: the SDK turns a 401 into `Server returned an
        error response`, which does not tell a person that the token is wrong. The server's own
        JSON-RPC error, when it sent one, follows."""
        hint = _refusal_hint(status)
        said = ""
        if refused is not None and refused.message not in _SDK_STAND_INS:
            said = f": {self._describe(refused)}"
        return f"the server refused the request: {status}{hint}{said}"

    def _describe_unreachable(self, exc: httpx2.TransportError) -> str:
        """`cannot connect to 127.0.0.1:8768 (connection refused)` rather than the HTTP
        client's `ConnectError: All connection attempts failed`, which names neither."""
        url = httpx2.URL(self.settings.url or "")
        where = f"{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"
        if isinstance(exc, httpx2.ConnectTimeout):
            return f"cannot connect to {where} (no answer in time)"
        if isinstance(exc, httpx2.ConnectError):
            why = os_refusal(exception_chain(exc)) or str(exc) or type(exc).__name__
            return f"cannot connect to {where} ({why})"
        if isinstance(exc, httpx2.TimeoutException):
            return f"no answer from {where} in time"
        return f"the connection to {where} failed: {str(exc) or type(exc).__name__}"

    def _describe(self, exc: BaseException) -> str:
        """An error as a person reads it: what went wrong, not which Python class said so."""
        if isinstance(exc, httpx2.TransportError):
            return self._describe_unreachable(exc)
        if isinstance(exc, ValidationError):
            return _describe_invalid_answer(exc)
        if isinstance(exc, MCPError):
            return f"MCP error {exc.code}: {exc.message}"
        if isinstance(exc, ExceptionGroup):
            inner = exc.exceptions[0] if exc.exceptions else exc
            return self._describe(inner)
        if isinstance(exc, FileNotFoundError):
            return f"command not found: {exc.filename or exc}"
        if isinstance(exc, TimeoutError):  # an OSError too: before those
            limit = self.settings.connect_timeout_seconds
            return (
                f"no answer to initialize / tools/list within {limit:g} s (connect_timeout_seconds)"
            )
        if isinstance(exc, PermissionError):
            if exc.filename is not None and exc.filename == self.settings.cwd:
                return f"working directory not accessible: {exc.filename}"
            return f"command is not executable: {exc.filename or self.settings.command}"
        if isinstance(exc, OSError) and exc.strerror:
            return (
                f"cannot run the command: {exc.strerror}: {exc.filename or self.settings.command}"
            )
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    async def _connect_and_serve(self) -> bool:
        """One connection: returns whether it became ready (it ended or failed after that)."""
        async with contextlib.AsyncExitStack() as stack:
            liveness = Liveness()
            if self.settings.transport == "stdio":
                streams = await stack.enter_async_context(self._stdio())
                liveness = self._processes[-1].liveness
                self.pid = self._processes[-1].pid
            else:
                streams = await stack.enter_async_context(self._http())
            read, write = streams
            unreadable: list[str] = []  # tools dropped from the listing, with why
            read = await stack.enter_async_context(tolerant_tool_listings(read, unreadable))
            tools_changed = asyncio.Event()

            async def on_message(message: Any) -> None:
                # only noted here: the session's own reader runs this, and a listing awaited
                # from it would wait on itself; the owner task lists again (`_until_down`)
                if isinstance(message, mcp_types.ToolListChangedNotification):
                    tools_changed.set()

            session = await stack.enter_async_context(
                ClientSession(read, write, message_handler=on_message, client_info=CLIENT_INFO)
            )
            with anyio.CancelScope() as connecting:  # `restart()` cancels it
                self._connecting = connecting
                if self._restart_now.is_set() or self._stop.is_set():
                    connecting.cancel()
                try:
                    with anyio.fail_after(self.settings.connect_timeout_seconds):
                        await session.initialize()
                        listed = await self._list_tools(session)
                finally:
                    self._connecting = None
            if connecting.cancelled_caught:
                return False
            self._register(listed, unreadable)
            self._session, self._liveness = session, liveness
            self.state = "ready"
            self.connected_at = time.monotonic()
            self.last_error = self._skipped_notes()
            self._ready.set()
            log.info("MCP server %s ready with %d tool(s)", self.name, len(self.tools))
            reason = await self._until_down(session, liveness, tools_changed, unreadable)
            if not self._stop.is_set() and not self._restart_now.is_set():
                self._fail(reason)
            liveness.end(reason)
            return True

    async def _until_down(
        self,
        session: ClientSession,
        liveness: Liveness,
        tools_changed: asyncio.Event,
        unreadable: list[str],
    ) -> str:
        """Wait until the connection ends or the daemon stops; the reason it ended. An HTTP
        server has no process to watch: it is pinged every `ping_interval_seconds`. A server
        that says its tools changed (`notifications/tools/list_changed`) is listed again and
        its tools replaced: one that adds tools as it goes would otherwise offer only those
        of its start, and a withdrawn one would stay offered until the next restart."""
        http = self.settings.transport == "http"
        while True:
            await _any_of(
                liveness.dead,
                self._stop,
                self._restart_now,
                tools_changed,
                timeout=self.section.ping_interval_seconds if http else None,
            )
            if self._stop.is_set():
                return "stopped"
            if self._restart_now.is_set():
                return "restarted on request"
            if liveness.dead.is_set():
                return liveness.reason
            if tools_changed.is_set():
                tools_changed.clear()
                unreadable.clear()
                # a stop or a restart ends a listing the server is slow to answer, as at start
                with anyio.CancelScope() as listing:
                    self._connecting = listing
                    try:
                        with anyio.fail_after(self.settings.connect_timeout_seconds):
                            listed = await self._list_tools(session)
                    except Exception as exc:
                        return f"listing its changed tools failed: {self._describe(exc)}"
                    finally:
                        self._connecting = None
                if listing.cancelled_caught:
                    continue  # the loop's next wait sees the stop or the restart
                self._register(listed, unreadable)  # its `last_error` follows (`settle`)
                log.info("MCP server %s: tools changed, now %d", self.name, len(self.tools))
                continue
            try:
                with anyio.fail_after(10):
                    await session.send_ping()
            except MCPError as exc:
                refusal = self._http_refusal
                if refusal is not None and exc.message in _SDK_STAND_INS:  # a revoked token
                    return f"ping refused: {refusal}{_refusal_hint(refusal)}"
                return f"ping failed: {self._describe(exc)}"
            except Exception as exc:
                return f"ping failed: {self._describe(exc)}"

    def _stdio(self) -> contextlib.AbstractAsyncContextManager[Any]:
        s = self.settings
        assert s.command is not None
        env = {k: expand(v, where=f"mcp.servers.{self.name}.env.{k}") for k, v in s.env.items()}
        for value in [*configured_secrets(s.env, env), *args_secrets(s.args)]:
            register_secret(value)  # redacted wherever it might surface
        stderr = self._stderr_path()
        if len(self._processes) > 8:
            del self._processes[:-8]
        return stdio_transport(
            s.command,
            s.args,
            server_environment(env),
            s.cwd,
            ledger=self.ledger,
            stderr_path=stderr,
            started=self._processes,
        )

    @contextlib.asynccontextmanager
    async def _http(self) -> Any:
        s = self.settings
        assert s.url is not None
        headers = {
            k: expand(v, where=f"mcp.servers.{self.name}.headers.{k}") for k, v in s.headers.items()
        }
        for value in [*configured_secrets(s.headers, headers), *url_secrets(s.url)]:
            register_secret(value)  # an error naming the URL shows it without them
        self._http_refusal = None

        async def note_refusal(response: httpx2.Response) -> None:
            # the SDK keeps only a stand-in JSON-RPC error of a refused POST: its status says why
            if response.status_code >= 400 and response.request.method == "POST":
                self._http_refusal = f"HTTP {response.status_code} {response.reason_phrase}"

        client = httpx2.AsyncClient(
            headers=headers,
            timeout=httpx2.Timeout(30.0, read=300.0),
            event_hooks={"response": [note_refusal]},
        )
        async with client, streamable_http_client(s.url, http_client=client) as streams:
            yield streams

    async def _list_tools(self, session: ClientSession) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_TOOLS_PAGES):
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def _register(self, listed: list[mcp_types.Tool], unreadable: list[str]) -> None:
        """Make the tools of `listed` offerable, noting those skipped, and have the manager
        register them (`on_tools`, which then `settle`s which of them this server holds)."""
        notes = list(unreadable)
        offered: list[tuple[ToolInfo, RegisteredTool]] = []
        taken: set[str] = set()
        for tool in listed:
            if not tool.name.strip():  # offered as a bare `mcp__<server>__`, named by nothing
                notes.append("a tool with an empty name skipped")
                continue
            name = mcp_tools.tool_name(self.key, tool.name)
            if name in taken:
                notes.append(f"tool {tool.name!r} skipped: its name clashes as {name}")
                continue
            schema = mcp_tools.offered_schema(tool.input_schema)
            try:
                validator = mcp_tools.compile_validator(schema)
            except mcp_tools.UnusableSchema as exc:
                notes.append(f"tool {tool.name!r} skipped: invalid input schema ({exc.message})")
                continue
            length = len(tool.description or "")
            if length > mcp_tools.MAX_DESCRIPTION_CHARS:
                notes.append(
                    f"tool {tool.name!r}: its description cut to "
                    f"{mcp_tools.MAX_DESCRIPTION_CHARS:,} of its {length:,} characters"
                )
            mode = self.settings.mode_for(tool.name)
            entry = mcp_tools.registered(
                self,
                tool,
                name=name,
                validator=validator,
                mode=mode,
                timeout_seconds=self.settings.timeout_for(tool.name),
            )
            offered.append((ToolInfo(name, tool.name, mcp_tools.description_of(tool), mode), entry))
            taken.add(name)
        self._listed_notes, self.offered = notes, offered
        self.on_tools(self)

    def settle(self, held_elsewhere: dict[str, str]) -> None:
        """Take the outcome of a registration: of the tools it offers, those whose name is
        `held_elsewhere` (name → by whom) are not its own and are noted as skipped; a ready
        server's `last_error` says so at once (another server's start or reload may take a
        name from it, or give one back, while it runs)."""
        if held_elsewhere and held_elsewhere != self._held_elsewhere:  # not again at each listing
            log.warning(
                "MCP server %s: tools not registered: %s", self.name, ", ".join(held_elsewhere)
            )
        self._held_elsewhere = held_elsewhere
        self.tools = [info for info, _ in self.offered if info.name not in held_elsewhere]
        self._skipped = [
            *self._listed_notes,
            *(
                f"tool {info.remote_name!r} skipped: {info.name} is taken by "
                f"{held_elsewhere[info.name]}"
                for info, _ in self.offered
                if info.name in held_elsewhere
            ),
        ]
        if self.state == "ready":
            self.last_error = self._skipped_notes()

    def _skipped_notes(self) -> str | None:
        """The tools not offered, each with why (cut and redacted as any error)."""
        return redact("; ".join(self._skipped), limit=1000) or None

    # -- calls ------------------------------------------------------------------------------

    async def call(
        self, remote_name: str, arguments: dict[str, Any], remaining: float
    ) -> mcp_types.CallToolResult:
        """Call a tool on the ready server; fails at once when it is not ready, and with the
        connection's reason when it ends mid-call."""
        session, liveness = self._session, self._liveness
        if session is None or liveness is None or self.state != "ready":
            why = f": {self.last_error}" if self.last_error else ""
            raise McpUnavailable(
                f'MCP server "{self.name}" is not available ({self.state}{why}); '
                "the tool was not run."
            )
        request = asyncio.ensure_future(
            session.call_tool(remote_name, arguments, read_timeout_seconds=remaining + 5)
        )
        dead = asyncio.ensure_future(liveness.dead.wait())
        try:
            await asyncio.wait({request, dead}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            request.cancel()  # the SDK tells the server (notifications/cancelled)
            with contextlib.suppress(BaseException):
                await request
            raise
        finally:
            dead.cancel()
        if not request.done():
            request.cancel()
            with contextlib.suppress(BaseException):
                await request
            raise McpUnavailable(
                f'MCP server "{self.name}" stopped during the call ({liveness.reason}); '
                "the call's outcome is unknown."
            )
        try:
            return request.result()
        except MCPError as exc:
            if liveness.dead.is_set():
                raise McpUnavailable(
                    f'MCP server "{self.name}" stopped during the call ({liveness.reason}); '
                    "the call's outcome is unknown."
                ) from None
            refusal = self._http_refusal if self.settings.transport == "http" else None
            if refusal is not None and exc.message in _SDK_STAND_INS:
                # the SDK's stand-in for a refused POST: the status says why (an expired token)
                raise ToolError(
                    f'MCP server "{self.name}" refused the call: {refusal}{_refusal_hint(refusal)}'
                ) from None
            raise ToolError(f'MCP server "{self.name}": {exc.message}') from None
        except Exception as exc:
            raise McpUnavailable(
                f'MCP server "{self.name}" failed the call: {self._describe(exc)}'
            ) from None


_SDK_STAND_INS = frozenset({"Server returned an error response", "Not Found", "Session terminated"})
"""The errors the SDK makes up for a refused HTTP request: they say nothing the status does not."""


def _refusal_hint(status: str) -> str:
    """What a person checks for an HTTP refusal that the configuration can cause."""
    if status.startswith(("HTTP 401", "HTTP 403")):
        return " (check the credentials in its headers or url)"
    if status.startswith("HTTP 404"):
        return " (check the url's path)"
    return ""


async def _any_of(*events: asyncio.Event | anyio.Event, timeout: float | None = None) -> None:
    """Until one of `events` is set (or `timeout` passes)."""
    waits = {asyncio.ensure_future(event.wait()) for event in events}
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


_Found = TypeVar("_Found", bound=BaseException)


def _found_in(exc: BaseException, kind: type[_Found]) -> _Found | None:
    """An error of `kind` wherever the task groups put it: the SDK's refusal of an answer that is
    not valid MCP (a malformed `initialize` answer, a `tools/list` answer that is not a list of
    tools), or the server's error answer."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _found_in(inner, kind)
            if found is not None:
                return found
    return None


def _describe_invalid_answer(exc: ValidationError, shown: int = 3) -> str:
    """`its tools/list answer is not valid MCP: tool #2, inputSchema: Field required; …`"""
    what = {"ListToolsResult": "tools/list", "InitializeResult": "initialize"}.get(
        exc.title, exc.title
    )
    problems = []
    for error in exc.errors()[:shown]:
        loc = list(error["loc"])
        if len(loc) >= 2 and loc[0] == "tools" and isinstance(loc[1], int):
            field = ".".join(str(part) for part in loc[2:])
            where = f"tool #{loc[1] + 1}" + (f", {field}" if field else "")
        else:
            where = ".".join(str(part) for part in loc)
        problems.append(f"{where}: {error['msg']}")
    more = f" (and {exc.error_count() - shown} more)" if exc.error_count() > shown else ""
    return f"its {what} answer is not valid MCP: {'; '.join(problems)}{more}"
