"""`metis serve --detach`: the daemon started in the background, its output in a log file.

The configuration is read here first, so an error in it is shown on the terminal rather than
left in a log. Then `metis serve` runs again as a child in a session of its own (no controlling
terminal: closing the terminal does not stop it), stdin from /dev/null, stdout and stderr
appended to `METIS_HOME/logs/daemon.log`. This process waits until the child holds the home's
lock with its URL recorded, which `metis serve` does once it listens, and reports where it is.
A child that exits first failed to start: the lines it logged say why, and are shown.

The child's banner leaves out the one-time dashboard login link: a log file is no place for a
credential, and `metis open` makes a fresh link whenever one is wanted.
"""

from __future__ import annotations

import argparse
import io
import logging.handlers
import os
import subprocess
import sys
import time
from pathlib import Path

from metis.commands.printable import printable
from metis.server.lock import LOCK_FILE, DaemonAlreadyRunning, is_held, read_holder

DAEMON_LOG = Path("logs") / "daemon.log"
LOG_ROTATE_BYTES = 10 * 1024 * 1024
START_DEADLINE_S = 60.0
LOG_LINES_SHOWN = 15
BANNER_WAIT_S = 2.0
MODELS = "  models:  "  # the banner's lines (metis.cli.print_banner) shown here too
API_KEY = "  API key: "  # only at the start that created the key file
ROUTING = "  routing: "  # only when routing.yaml did not load


def open_daemon_log(home: Path) -> tuple[Path, int]:
    """The log file opened for appending (mode 0600) and its size before this start. A log past
    `LOG_ROTATE_BYTES` is kept as `daemon.log.1` (one generation) and a new one begun."""
    path = home / DAEMON_LOG
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size > LOG_ROTATE_BYTES:
        path.replace(path.with_name(path.name + ".1"))
    fd = _append_to(path)
    os.fchmod(fd, 0o600)  # a log made by hand with a wider mode
    return path, fd


def _append_to(path: Path | str) -> int:
    """`path` opened for appending, created mode 0600: only its owner reads what the daemon logs."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)


class DaemonLogHandler(logging.handlers.RotatingFileHandler):
    """The detached daemon's log records, in `METIS_HOME/logs/daemon.log`, rotated while it runs.

    A daemon left running for weeks logs every request: past `LOG_ROTATE_BYTES` the file is
    kept as `daemon.log.1` (one generation) and a new one begun, mode 0600. The process's own
    stdout and stderr (the banner, a fatal traceback) are pointed at each new file too, so they
    stay beside the records around them instead of filling the generation set aside.
    """

    def __init__(self, home: Path, follow_fds: tuple[int, ...] = (1, 2)) -> None:
        self._follow_fds = follow_fds
        (home / DAEMON_LOG).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        super().__init__(home / DAEMON_LOG, maxBytes=LOG_ROTATE_BYTES, backupCount=1)

    def _open(self) -> io.TextIOWrapper:
        return open(_append_to(self.baseFilename), "a", encoding="utf-8", errors="backslashreplace")

    def doRollover(self) -> None:
        super().doRollover()
        if self.stream is not None:
            for fd in self._follow_fds:
                os.dup2(self.stream.fileno(), fd)


def _child_argv(args: argparse.Namespace, home: Path) -> list[str]:
    argv = [sys.executable, "-m", "metis.cli", "serve", "--detached-child", "--home", str(home)]
    if args.host is not None:
        argv += ["--host", args.host]
    if args.port is not None:
        argv += ["--port", str(args.port)]
    if args.log_level is not None:
        argv += ["--log-level", args.log_level]
    return argv


def _logged_since(path: Path, offset: int) -> list[str]:
    with path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace").splitlines()


def _listening_url(child: subprocess.Popen[bytes], lock: Path) -> str | None:
    """The child's URL once it has recorded it in the home's lock (it listens then); None when
    it exits first or `START_DEADLINE_S` passes."""
    deadline = time.monotonic() + START_DEADLINE_S
    while child.poll() is None and time.monotonic() < deadline:
        pid, url = read_holder(lock)
        if pid == child.pid and url is not None:
            return url
        time.sleep(0.05)
    return None


def _banner_lines(log_path: Path, offset: int) -> list[str]:
    """The models line of the banner the child writes just after recording its URL (which
    models answer, or that it is offline), given a moment to arrive, then its API key line
    (where the key file was created) and routing line (a routing.yaml that did not load),
    which come before the banner's end."""
    deadline = time.monotonic() + BANNER_WAIT_S
    while True:
        logged = _logged_since(log_path, offset)
        banner = [line for line in logged if line.startswith(MODELS)]
        if banner and any(line.startswith("Dashboard: ") for line in logged):
            banner += [line for line in logged if line.startswith((API_KEY, ROUTING))]
            return banner
        if time.monotonic() > deadline:
            return banner
        time.sleep(0.02)


def serve_detached(args: argparse.Namespace) -> int:
    """Start the daemon in the background; 0 once it listens, 1 when it could not start, 2
    for a configuration error (config.yaml's raises ConfigError here, which `metis serve`
    reports; one the daemon meets as it starts is its exit status 2)."""
    from metis.config import home_from, load_settings

    settings = load_settings(home=home_from(args.home), host=args.host, port=args.port)
    home = settings.home
    lock = home / LOCK_FILE
    if is_held(lock):
        raise DaemonAlreadyRunning(home, *read_holder(lock))
    log_path, log_fd = open_daemon_log(home)
    start_offset = os.fstat(log_fd).st_size
    try:
        child = subprocess.Popen(
            _child_argv(args, home),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
        )
    finally:
        os.close(log_fd)
    try:
        url = _listening_url(child, lock)
    except KeyboardInterrupt:
        print(
            f"\nmetis: stopped waiting; the daemon (pid {child.pid}) goes on starting in the "
            "background (`metis status` says when it is up, `metis stop` stops it)",
            file=sys.stderr,
        )
        return 130
    if url is None:
        if child.poll() is None:
            child.terminate()
            print(
                f"metis: the daemon was still starting after {START_DEADLINE_S:.0f} s and was "
                f"stopped; its log: {log_path}",
                file=sys.stderr,
            )
            return 1
        holder, holder_url = read_holder(lock)
        if holder is not None and holder != child.pid and is_held(lock):
            # another start won the race for the home between the check above and the
            # child's: said as that check says it, without the winner's lines of the log
            raise DaemonAlreadyRunning(home, holder, holder_url)
        print(f"metis: the daemon did not start (exit status {child.returncode}).", file=sys.stderr)
        print(f"The end of its log, {log_path}:", file=sys.stderr)
        for line in _logged_since(log_path, start_offset)[-LOG_LINES_SHOWN:]:
            print(f"  {line}", file=sys.stderr)
        # a configuration error the child met (a bad models.yaml) keeps its status 2,
        # as in the foreground
        return 2 if child.returncode == 2 else 1
    lines = [
        f"metis is serving at {url} in the background (pid {child.pid})",
        f"  home:    {printable(home)}",
    ]
    lines += _banner_lines(log_path, start_offset)
    lines += [
        f"  log:     {printable(log_path)}",
        "Next: `metis chat`, `metis open` (the dashboard), `metis status`; `metis stop` stops it.",
    ]
    print("\n".join(lines), flush=True)
    return 0
