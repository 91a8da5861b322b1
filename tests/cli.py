"""The `metis` command as tests run it: a real subprocess (`python -m metis.cli`), the test's
environment plus `env`, its exit status and what it printed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import sys


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
    """(exit status, stdout, stderr); `stdout` sends its output elsewhere (a pipe's end)."""
    proc = await start_metis(
        *args, env=env, stdout=asyncio.subprocess.PIPE if stdout is None else stdout
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, (out or b"").decode(), err.decode()


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
