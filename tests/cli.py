"""The `metis` command as tests run it: a real subprocess, the test's environment plus `env`,
its exit status and what it printed.

`start_metis` starts `python -m metis.cli` for a test that reads the output as it comes, types
into it or signals it. `metis` runs a command to its end in a process forked from a server that
has the command line imported already (tests/cli_fork_server.py): the same `main` in a process
of its own, without the interpreter's start and imports (~0.25 s of CPU a command).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import pty
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


async def start_metis(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: int | None = asyncio.subprocess.DEVNULL,
    stdout: int | None = asyncio.subprocess.PIPE,
    stderr: int | None = asyncio.subprocess.PIPE,
) -> asyncio.subprocess.Process:
    """The command started, for a test that reads its output as it comes or types into it."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metis.cli",
        *args,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env={**os.environ, **(env or {})},
    )


async def metis(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    stdout: int | None = None,
) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); `stdout` sends its output elsewhere (a pipe's or a
    terminal's end), and "" is returned for it. Past `timeout` the command is killed and
    TimeoutError raised."""
    request = {"argv": list(args), "env": {**os.environ, **(env or {})}, "cwd": os.getcwd()}
    return await asyncio.to_thread(_run_forked, request, stdout, timeout)


class _ForkServer:
    """This process's fork server, started on first use and ended with the process (its stdin
    is a pipe from here: EOF ends it)."""

    _lock = threading.Lock()
    _process: subprocess.Popen[bytes] | None = None
    _socket = ""

    @classmethod
    def address(cls) -> str:
        with cls._lock:
            if cls._process is None or cls._process.poll() is not None:
                folder = tempfile.mkdtemp(prefix="metis-cli-")
                cls._socket = os.path.join(folder, "fork.sock")
                cls._process = subprocess.Popen(
                    [
                        sys.executable,
                        str(Path(__file__).with_name("cli_fork_server.py")),
                        cls._socket,
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
                assert cls._process.stdout is not None
                if cls._process.stdout.readline() != b"ready\n":
                    raise RuntimeError("the command line's fork server did not start")
                atexit.register(cls._process.kill)
            return cls._socket


def _run_forked(
    request: dict[str, object], stdout: int | None, timeout: float
) -> tuple[int, str, str]:
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn,
        open(os.devnull, "rb") as stdin,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        conn.settimeout(timeout)
        conn.connect(_ForkServer.address())
        fds = [stdin.fileno(), out.fileno() if stdout is None else stdout, err.fileno()]
        socket.send_fds(conn, [json.dumps(request).encode()], fds)
        pid = int(conn.recv(64))
        try:
            code = int(conn.recv(64))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(), err.read().decode()


def terminal_lines(controller: int, terminal: int) -> list[str]:
    """Everything a program wrote to a pty, as lines, once it has exited: the terminal's end is
    closed here, so reading the controller ends (with an OSError) when all of it is read."""
    os.close(terminal)
    shown = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(controller, 4096):
            shown += chunk
    return shown.decode().replace("\r\n", "\n").splitlines()


async def at_a_terminal(*args: str, width: int) -> tuple[int, list[str], str]:
    """(exit status, the lines shown, stderr) of the command writing to a terminal `width`
    columns wide (a pty: `isatty` is true; COLUMNS gives its width)."""
    controller, terminal = pty.openpty()
    try:
        code, _, err = await metis(*args, env={"COLUMNS": str(width)}, stdout=terminal)
        lines = terminal_lines(controller, terminal)
    finally:
        os.close(controller)
    return code, lines, err
