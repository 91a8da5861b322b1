"""Running the daemon: bind loopback, start core before accepting, shut down in contract order.

Used by `metis serve` and by the integration tests alike, so tests exercise the real start-up
and shutdown paths (not a test-only server).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import gc
import logging
import socket
import sys

from aiohttp import web
from aiohttp.http import HttpProcessingError

from metis.config import Settings
from metis.core.application import Application
from metis.core.runtime import Core
from metis.server.app import create_app, new_state
from metis.server.malformed import EnvelopeAppRunner
from metis.server.state import ServerState

log = logging.getLogger(__name__)


class BindError(Exception):
    """The daemon's address cannot be bound (in use, not allowed): start-up stops at once."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        self.host, self.port = host, port
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if cause.errno == errno.EADDRINUSE:
            problem = "the address is already in use (another metis or another program)"
        else:
            problem = cause.strerror or str(cause)
        super().__init__(
            f"cannot listen on {where}: {problem}. Choose another port with "
            f"`metis serve --port N` or METIS_PORT=N (0 picks a free one)."
        )


def bind_port(host: str, port: int) -> socket.socket:
    """Bind without listening: a busy port fails here, before the store is opened, and
    connections are refused (not queued) until `Daemon.start` listens. `metis serve` binds
    before it builds the daemon, which creates the home's files (the API key, the default
    workspace): a start that cannot listen leaves nothing behind for a daemon that never ran."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host if host != "localhost" else "127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise BindError(host, port, exc) from None
    sock.setblocking(False)
    return sock


def freeze_startup_heap() -> None:
    """Take everything alive after start-up out of the cyclic collector's reach, once.

    Start-up leaves objects that live as long as the process (the pydantic types, the catalog,
    the registry; the SDKs' ~220k come later, see `ModelRegistry.on_warm`). Every full
    collection walks them all: 100-500 ms pauses on a slow VM, landing in the middle of a
    stream or a cancel. Collect once, then freeze them. The process's entry point calls this
    (not `Daemon.start`, which tests run hundreds of times), once the deferred models are
    built; it turns the collector off for start-up (`metis.cli.main`), and this turns it back
    on.
    """
    gc.collect()
    gc.freeze()
    gc.enable()


_PR_SET_DUMPABLE = 4


def protect_process_memory() -> bool:
    """Make the daemon non-dumpable (Linux): other processes of the same user — the shell
    tool's commands among them — can then no longer read its `/proc/<pid>/environ` or memory,
    where provider keys and `METIS_API_KEY` live (the commands' own environment is scrubbed,
    but `/proc/$PPID/environ` was readable). Returns whether the protection is in place.
    Like `freeze_startup_heap`, only the process's entry point calls it.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        done: int = libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        return done == 0
    except (OSError, AttributeError):
        return False


class _UnparsableRequests(logging.Filter):
    """aiohttp logs a request its parser refuses at ERROR, with a traceback that quotes the
    offending bytes (a header line, which may carry a credential). The client is answered 400
    already and the fault is its own: one WARNING line naming the parser's error, no bytes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "refused an HTTP request its parser could not read (%d, %s)"
            record.args = (exc.code, type(exc).__name__)
            record.exc_info = record.exc_text = None
        return True


def http_server_logger() -> logging.Logger:
    """The logger of aiohttp's connection handlers (parse errors, unhandled exceptions)."""
    logger = logging.getLogger("metis.server.http_errors")
    if not any(isinstance(f, _UnparsableRequests) for f in logger.filters):
        logger.addFilter(_UnparsableRequests())
    return logger


class Daemon:
    """One daemon instance: `await start()` returns once it accepts connections."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # the composition root: Core wires the components, the surfaces get the Application
        self.core = Core(settings)
        self.application = Application(self.core)
        self.state: ServerState = new_state(settings, self.application)
        self.app = create_app(self.state)
        self._runner: web.AppRunner | None = None
        self._stopped = asyncio.Event()

    @property
    def port(self) -> int:
        return self.state.port

    @property
    def base_url(self) -> str:
        return f"http://{self.state.base_host}:{self.state.port}"

    def login_url(self) -> str:
        """A fresh browser login URL, `<base_url>/login?token=…`: its token is single-use,
        expires after `auth.login_token_ttl_s` (5 min) and is not the key. Call it after
        `start()` (the URL names the bound port); each call mints a new token."""
        auth = self.state.auth
        if auth is None:  # pragma: no cover - create_app always sets it
            raise RuntimeError("the daemon's app has no authentication state")
        return self.base_url + auth.login_path()

    async def start(self, sock: socket.socket | None = None) -> None:
        """`sock`: the daemon's port bound beforehand (`bind_port`); bound here when None."""
        # The port is bound first (a busy one stops start-up before SQLite opens); then
        # config → registry → SQLite → subscribers → tools in Core.start; only then listen.
        if sock is None:
            sock = bind_port(self.state.host, self.settings.port)
        self.state.port = sock.getsockname()[1]
        try:
            await self.application.start()
        except BaseException:
            sock.close()
            with contextlib.suppress(Exception):  # close what did open (the store's threads)
                await self.application.abort()
            raise
        try:
            await self._listen(sock)
        except BaseException:
            # the store's threads would otherwise keep the process alive
            sock.close()
            await self.stop()
            raise
        # The SDKs' imports take seconds and tens of MiB: not here, but in a thread once a
        # client's first request comes (metis/server/middleware.py, registry.py)
        self.core.start_background()  # MCP servers: after the port is bound and listening
        log.info("metis listening on %s", self.base_url)

    async def warmed(self) -> None:
        """Return once the configured providers' adapters are ready (starting their warm-up if no
        client has yet) and the deferred models built (for callers that must not time the SDKs'
        import or a model's first build)."""
        self.core.registry.warm_in_background()
        await self.core.registry.wait_warm()
        await self.core.models_built()

    async def _listen(self, sock: socket.socket) -> None:
        sock.listen(128)
        # a request the HTTP parser refuses gets the JSON envelope too (metis/server/malformed.py)
        self._runner = EnvelopeAppRunner(
            self.app,
            access_log=None,
            logger=http_server_logger(),
            handle_signals=False,
            shutdown_timeout=self.settings.limits.shutdown_grace_s,
            lingering_time=1.0,  # an unread oversized upload (413) must not pin a connection for 10 s
            # aiohttp arms this timer when a connection opens and after each response, and
            # closes the connection when it fires before a whole request head has arrived:
            # the bound on a slow (or silent) client's headers. Bytes arriving do not re-arm it.
            keepalive_timeout=self.settings.limits.header_read_timeout_s,
        )
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        """503 for new requests → cancel turns → close sockets → drain → close pools and SQLite."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.state.shutting_down = True
        grace = self.settings.limits.shutdown_grace_s
        try:
            await asyncio.wait_for(self._shutdown(), timeout=grace)
        except TimeoutError:
            log.error("shutdown exceeded %.0f s grace; closing the store anyway", grace)
            await self.application.abort()

    async def _shutdown(self) -> None:
        await self.application.shutdown()  # turns cancelled, live clients closed
        if self._runner is not None:
            await self._runner.cleanup()
        await self.application.stop()
