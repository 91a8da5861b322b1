"""`metis` command line: serve the daemon and the offline helper commands."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, NoReturn

from metis.http.ca_bundle import deferring_ca_bundle

if TYPE_CHECKING:
    from metis.server.lock import DaemonLock
    from metis.server.runner import Daemon

log = logging.getLogger("metis")

COMMANDS = {
    "status": "metis.commands.status",
    "stop": "metis.commands.stop",
    "models": "metis.commands.models",
    "routing": "metis.commands.routing",
    "chat": "metis.commands.chat",
    "run": "metis.commands.run",
    "sessions": "metis.commands.sessions",
    "mcp": "metis.commands.mcp",
    "trace": "metis.commands.trace",
    "open": "metis.commands.open_dashboard",
}
"""Each client command and the module whose `register` adds its parser, in `--help` order."""

SERVE_ENVIRONMENT = """\
settings: flag > environment > METIS_HOME/config.yaml (host, port) > default.

environment:
  METIS_HOME     data directory (default ~/.metis): metis.db (the trace store),
                 config.yaml, models.yaml, routing.yaml, api_key, daemon.lock
  METIS_PORT     port to listen on (default 8421)
  METIS_HOST     loopback address to bind (127.0.0.1, ::1 or localhost)
  METIS_API_KEY  the daemon's bearer key (default: the key in
                 METIS_HOME/api_key, created at the first start)
  METIS_OFFLINE  1 serves only the scripted model local:scripted
"""


class _KeyValueFormatter(logging.Formatter):
    """One line per record: `ts level=… logger=… msg`, easy to grep and to parse. The time is
    the machine's, with its offset from UTC (`2026-11-28T16:06:44+01:00`): a log read on another
    machine, or after a change of zone, still says when."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="seconds")
        line = f"{when} level={record.levelname} logger={record.name} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(level: str = "INFO", handler: logging.Handler | None = None) -> None:
    """Log records, one line each, to stderr or to `handler` (a detached daemon's log file)."""
    handler = handler or logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpx2", "httpcore", "anthropic", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _available_models(daemon: Daemon) -> str:
    registry = daemon.core.registry
    if registry.offline_mode:
        why = "METIS_OFFLINE=1" if daemon.settings.offline else "no provider key is set"
        return f"local:scripted (offline: {why})"
    default = registry.default_model()
    ready = [m.id for m in registry.models() if not m.scripted and registry.is_configured(m.id)]
    return ", ".join(f"{m} (default)" if m == default else m for m in ready)


def print_banner(daemon: Daemon, *, detached: bool = False) -> None:
    """What a user needs once the daemon is healthy: plain stdout lines, not log records.
    `detached`: they go to the daemon's log file, where a login link does not belong."""
    from metis.commands.printable import printable

    lines = [
        f"metis is serving at {daemon.base_url}",
        f"  home:    {printable(daemon.settings.home)}",
        f"  models:  {_available_models(daemon)}",
    ]
    auth = daemon.state.auth
    if auth is not None and auth.api_key.created and auth.api_key.path is not None:
        # the first start: where the key is, for an AAP or script client (never the key itself:
        # a terminal's scrollback is not a secret store)
        lines.append(f"  API key: created in {printable(auth.api_key.path)} (mode 0600)")
    policy = daemon.core.policy
    if not policy.valid:  # said only in the log otherwise, which a detached start never shows
        reason = policy.in_force()["reason"]
        lines.append(f"  routing: {reason} (`metis routing check` says why)")
    if detached:
        lines.append("Dashboard: `metis open` logs a browser in. `metis stop` stops the daemon.")
    else:
        ttl_min = round(daemon.settings.file.auth.login_token_ttl_s / 60)
        lines.append(f"Dashboard: {daemon.login_url()}  (one-time login link, valid {ttl_min} min)")
        lines.append("Next: run `metis chat` in another terminal (Ctrl-C here stops the daemon).")
    try:
        print("\n".join(lines), flush=True)
    except OSError as exc:
        # stdout's reader gone (`metis serve | …` that exited) or a terminal closed: the daemon
        # serves all the same, its logs go to stderr; stdout is pointed away so that nothing
        # written there later (the interpreter's last flush) fails again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        log.warning("the start-up banner could not be written to stdout (%s)", exc.strerror)


async def _serve(args: argparse.Namespace) -> int:
    from metis.config import home_from, load_settings
    from metis.server.lock import acquire
    from metis.server.runner import Daemon, bind_port, protect_process_memory

    protected = protect_process_memory()
    if not protected:
        log.info("process memory protection unavailable on this platform")
    settings = load_settings(home=home_from(args.home), host=args.host, port=args.port)
    if args.log_level is None:
        logging.getLogger().setLevel(settings.file.log_level)
    lock = acquire(settings.home)  # before the store opens: one daemon per METIS_HOME
    try:
        sock = bind_port(settings.host, settings.port)  # a busy port: no home file made
        try:
            daemon = Daemon(settings)
        except BaseException:
            sock.close()
            raise
        await daemon.start(sock)
        # whatever ends the serving, the daemon is stopped: a process that left with its store
        # open would be kept alive by the store's threads, no longer serving
        try:
            await _serve_until_stopped(daemon, args, lock, protected)
        finally:
            await daemon.stop()
    finally:
        lock.release()
    return 0


async def _serve_until_stopped(
    daemon: Daemon, args: argparse.Namespace, lock: DaemonLock, protected: bool
) -> None:
    """Announce the started daemon (its URL in the lock, the banner) and serve until a signal."""
    from metis.commands import hangup_unless_ignored
    from metis.http.ca_bundle import load_ca_bundle
    from metis.server.runner import freeze_startup_heap

    if protected and os.geteuid() == 0:  # root reads any /proc/<pid>/environ, dumpable or not
        log.warning(
            "metis runs as root: an unsandboxed shell command or an MCP server it starts "
            "can read the provider keys in its environment; run it as an ordinary user"
        )
    # before the banner: a supervisor may stop the daemon as soon as it reads it
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, *hangup_unless_ignored()):
        loop.add_signal_handler(sig, stop.set)
    lock.record(daemon.base_url)
    print_banner(daemon, detached=args.detached_child)
    # The collection that precedes the freeze walks the whole start-up heap (~35 ms on the
    # 2-core machine): it waits for the deferred models' background build, so that the
    # first requests are not held behind it. The SDKs, imported when the first client
    # comes, have their types frozen once they are in; aiohttp's CA bundle is read then.
    daemon.core.on_models_built = freeze_startup_heap

    def client_came() -> None:
        gc.freeze()
        loop.run_in_executor(None, load_ca_bundle)  # joined before the process exits

    daemon.core.registry.on_warm = client_came
    await stop.wait()
    log.info("signal received; shutting down")
    loop.add_signal_handler(signal.SIGINT, _exit_at_once)


INTERRUPTED = 130
"""The exit status of a command Ctrl-C ended (128 + SIGINT, as a shell reports it)."""


def _exit_at_once() -> NoReturn:
    """A second Ctrl-C while the shutdown waits (a turn's grace, an MCP server slow to stop):
    the user wants the terminal back. Leaving now loses nothing a client was told is stored
    (each acknowledgement follows its commit); what the daemon started is taken care of all
    the same: sandboxed shells die with it, and the next start reaps the process groups of the
    other shells and of MCP servers from its ledger, and marks the turns it cut off."""
    log.warning("interrupted again: exiting without waiting for the shutdown to finish")
    logging.shutdown()
    os._exit(INTERRUPTED)


def _cmd_serve(args: argparse.Namespace) -> int:
    from metis.core.errors import ConfigError
    from metis.core.store.db import StoreUnusable
    from metis.server.lock import DaemonAlreadyRunning
    from metis.server.runner import BindError

    if args.detached_child:  # its stdout and stderr are the log file `metis serve --detach` opened
        from metis.commands.detach import DaemonLogHandler
        from metis.config import home_from

        setup_logging(args.log_level or "INFO", DaemonLogHandler(home_from(args.home)))
    else:
        setup_logging(args.log_level or "INFO")  # config.yaml's level once read, unless the flag
    try:
        if args.detach:
            from metis.commands.detach import serve_detached

            return serve_detached(args)
        return asyncio.run(_serve(args))
    except ConfigError as exc:
        print(f"metis: configuration error:\n{exc.message}", file=sys.stderr)
        return 2
    except (BindError, DaemonAlreadyRunning) as exc:
        print(f"metis: {exc}", file=sys.stderr)
        return 1
    except StoreUnusable as exc:
        print(
            f"metis: cannot start: cannot open the trace store {exc.path}: {exc}", file=sys.stderr
        )
        return 1
    except OSError as exc:
        print(f"metis: cannot start: {exc}", file=sys.stderr)
        return 1


class _LaidOutText(argparse.HelpFormatter):
    """Help that wraps a paragraph to the terminal, as argparse does, but keeps a text already
    laid out in lines (`SERVE_ENVIRONMENT`'s table) as it is written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    """A parser that refuses the arguments it does not know itself. A subcommand's parser is
    given the rest of the command line; argparse's own would hand what it does not know back
    up, for the top level to refuse with its usage instead of the subcommand's."""

    _words: Sequence[str] = ()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._words = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """A usage error, also said to a script that asked for JSON where the command speaks
        it (`on_usage_error` in its parser's defaults: `metis run --json`)."""
        said_to_script = self.get_default("on_usage_error")
        if said_to_script is not None:
            said_to_script(message, self._words)
        super().error(message)


class _ShowVersion(argparse.Action):
    """`--version`, read from the package's metadata only when asked: reading it costs every
    other command a tenth of its start."""

    def __init__(self, option_strings: list[str], dest: str, **_: object) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show the version and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from metis.version import metis_version

        print(f"metis {metis_version()}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with `serve` and `command` only: a command's module
    is imported only to run it, so `metis serve` does not carry the client commands (their
    imports are memory an idle daemon keeps for as long as it runs)."""
    from metis.config import port_argument

    parser = _Parser(prog="metis", description="local-first coding-agent daemon")
    parser.add_argument("--version", action=_ShowVersion)
    # every command in the usage line, also when only one of them is registered
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{" + ",".join(["serve", *COMMANDS]) + "}"
    )
    serve = sub.add_parser(
        "serve",
        help="run the daemon (in the foreground, or in the background with --detach)",
        description="Run the daemon in the foreground until Ctrl-C (or SIGTERM, or its terminal "
        "closing), or in the background with --detach until `metis stop`. One daemon per "
        "METIS_HOME: a second `metis serve` on the same home exits naming the first.",
        epilog=SERVE_ENVIRONMENT,
        formatter_class=_LaidOutText,
    )
    serve.add_argument(
        "--home",
        metavar="DIR",
        help="data directory (overrides METIS_HOME; default ~/.metis)",
    )
    serve.add_argument(
        "--host", help="loopback address to bind (overrides METIS_HOST; default 127.0.0.1)"
    )
    serve.add_argument(
        "--port",
        type=port_argument,
        help="port (overrides METIS_PORT; default 8421; 0 picks a free one)",
    )
    serve.add_argument(
        "--log-level",
        type=str.upper,  # `debug` too, as config.yaml takes it
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level on stderr (overrides config.yaml's log_level; default INFO)",
    )
    serve.add_argument(
        "--detach",
        action="store_true",
        help="run in the background: return once it listens, its output appended to "
        "METIS_HOME/logs/daemon.log (`metis stop` stops it)",
    )
    serve.add_argument("--detached-child", action="store_true", help=argparse.SUPPRESS)
    serve.set_defaults(func=_cmd_serve)
    for name, module in COMMANDS.items():
        if command is None or command == name:
            importlib.import_module(module).register(sub)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command `argv` names (its first word that is not an option), if it is one of ours;
    None when there is none or it is unknown, so the parser then knows them all."""
    word = next((arg for arg in argv if not arg.startswith("-")), None)
    return word if word == "serve" or word in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command `argv` names; Ctrl-C that the command does not handle itself (one
    waiting for a daemon that does not answer, an import under way) ends it with 130 and one
    line, as a shell expects, rather than a traceback."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            print("\nmetis: interrupted", file=sys.stderr)
        return INTERRUPTED


def _main(argv: Sequence[str] | None = None) -> int:
    """Run the command `argv` names.

    The cyclic garbage collector is off while the command's modules are imported: they leave
    ~300k objects that live as long as the process, and the collector would walk them ~160
    times meanwhile (~40 ms of a daemon's ~0.5 s start on a 2-core machine). A client command
    turns it back on before it runs; `serve` once start-up is over (`freeze_startup_heap`, which
    collects once first), or when it fails to start.
    """
    _open_closed_standard_streams()
    words = sys.argv[1:] if argv is None else argv
    command = command_of(words)
    gc.disable()
    from metis.config import AddressError  # as the command's modules: with the collector off

    try:
        # the command's modules, aiohttp among them, imported with its CA bundle left unread
        # until a connection may need it (metis.http.ca_bundle)
        with deferring_ca_bundle():
            parser = build_parser(command)
            if command == "serve":
                importlib.import_module("metis.server.runner")
        args = parser.parse_args(words)
        if command != "serve":
            gc.enable()
        code = int(args.func(args))
        try:
            sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's exit
        except BrokenPipeError:
            raise
        except OSError as exc:  # a full disk, a terminal gone: what was printed is lost
            print(f"metis: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
            _point_stdout_away()
            return 1
        return code
    except AddressError as exc:  # METIS_PORT, met by whichever command needed the address
        print(f"metis: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader of stdout left (`metis sessions list | head -1`): the usual quiet exit of a
        # filter, with stdout pointed away so the interpreter's own final flush cannot fail too
        _point_stdout_away()
        return 141  # 128 + SIGPIPE, as a shell reports a filter its pipe ended
    finally:
        gc.enable()  # also after --help or a usage error


def _open_closed_standard_streams() -> None:
    """A standard stream closed at start (`metis … >&-`, `<&-`) becomes /dev/null. Python
    leaves `sys.stdout` None then (an AttributeError at the first `isatty`), and the first file
    the command opens would take the free number: the daemon's database as fd 1, written by
    whatever a child process prints."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 - the process's own


def _point_stdout_away() -> None:
    """stdout to /dev/null: the interpreter's own final flush of what could not be written
    then cannot fail a second time, with a traceback."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
