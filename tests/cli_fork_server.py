"""A process that has imported the command line once and forks a `metis` command per request.

Run as `python cli_fork_server.py SOCKET` by `tests/cli.py`. The suite runs ~130 commands to
completion; as `python -m metis.cli` each spent ~0.25 s of CPU importing the same modules
(aiohttp, pydantic, the configuration, every command's module) before doing anything, ~30 s of
the suite's CPU on the 2-core machine. A fork of this process starts with them imported.

Each child is still a process of its own running `metis.cli.main` as the interpreter runs it:
its own standard streams (the request's file descriptors), environment, working directory,
exit status; what it imports or changes dies with it. What is lost is only the start of the
interpreter, which the tests that start `python -m metis.cli` themselves (daemons, signals,
packaging) keep covering.

Protocol (one SOCK_SEQPACKET connection per command): the client sends one JSON message
`{"argv": [...], "env": {...}, "cwd": "..."}` with three file descriptors (stdin, stdout,
stderr); this server answers `PID\\n` once the command runs, then `EXIT\\n` (the status as
`subprocess` reports it: negative for a signal) once it has exited. EOF on stdin (the test
process is gone) ends the server.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import os
import select
import signal
import socket
import sys
import time
import traceback

_CLI_PATH = "metis"


def _streams() -> None:
    """Standard streams over the new descriptors, buffered as the interpreter would buffer
    them at start (line-buffered at a terminal)."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        stream = io.TextIOWrapper(
            io.FileIO(fd, "r" if fd == 0 else "w", closefd=False),
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=fd == 2 or os.isatty(fd),
            write_through=fd == 2,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _run_command(request: dict[str, object], fds: list[int]) -> None:
    """In the child: become the command, run it, exit with its status. Never returns."""
    from metis.cli import main

    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])  # type: ignore[arg-type]
        time.tzset()  # the zone (TZ) is read once at the interpreter's start
        os.chdir(str(request["cwd"]))
        _streams()
        argv = [str(arg) for arg in request["argv"]]  # type: ignore[attr-defined]
        sys.argv = [_CLI_PATH, *argv]  # as `python -m metis.cli` sets it
        try:
            code = main(argv)
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:  # as the interpreter: a traceback, status 1
            traceback.print_exc()
            code = 1
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BrokenPipeError, ValueError):
                stream.flush()
    finally:
        os._exit(code)


def serve(path: str) -> None:
    global _CLI_PATH
    import metis.cli

    _CLI_PATH = metis.cli.__file__ or "metis"
    metis.cli.build_parser(None)  # every command's modules
    gc.collect()
    gc.freeze()  # the children share these pages instead of copying them as the collector walks

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    waiting: dict[int, socket.socket] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    while True:
        ready, _, _ = select.select([listener, sys.stdin, wake_read], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1024):
            return
        if wake_read in ready:
            os.read(wake_read, 4096)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                conn.send(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for owned in (listener, conn, *waiting.values()):
                owned.close()
            os.close(wake_read)
            os.close(wake_write)
            _run_command(json.loads(message), fds)
        for fd in fds:
            os.close(fd)
        waiting[pid] = conn
        conn.send(f"{pid}\n".encode())


if __name__ == "__main__":
    serve(sys.argv[1])
