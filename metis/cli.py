"""`metis` command line: serve the daemon and the offline helper commands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from metis.commands import chat as chat_command
from metis.commands import models as models_command
from metis.commands import routing as routing_command
from metis.commands import trace as trace_command
from metis.config import load_settings
from metis.core.errors import ConfigError

log = logging.getLogger("metis")


class _KeyValueFormatter(logging.Formatter):
    """One line per record: `ts level=… logger=… msg`, easy to grep and to parse."""

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} level={record.levelname} "
            f"logger={record.name} {record.getMessage()}"
        )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "anthropic", "openai", "watchfiles"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def _serve(args: argparse.Namespace) -> int:
    from metis.server.runner import Daemon, freeze_startup_heap, protect_process_memory

    if not protect_process_memory():
        log.info("process memory protection unavailable on this platform")
    settings = load_settings(host=args.host, port=args.port)
    daemon = Daemon(settings)
    await daemon.start()
    freeze_startup_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal received; shutting down")
    await daemon.stop()
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        return asyncio.run(_serve(args))
    except ConfigError as exc:
        print(f"metis: configuration error:\n{exc.message}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"metis: cannot start: {exc}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    from metis.server.routes.system import metis_version

    parser = argparse.ArgumentParser(prog="metis", description="local-first coding-agent daemon")
    parser.add_argument("--version", action="version", version=f"metis {metis_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the daemon in the foreground")
    serve.add_argument("--host", help="loopback address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8421; 0 picks a free one)")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.set_defaults(func=_cmd_serve)
    models_command.register(sub)
    routing_command.register(sub)
    chat_command.register(sub)
    trace_command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
