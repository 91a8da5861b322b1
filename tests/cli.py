"""The `metis` command as tests run it: a real subprocess (`python -m metis.cli`), the test's
environment plus `env`, its exit status and what it printed."""

from __future__ import annotations

import asyncio
import os
import sys


async def metis(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    stdout: int | None = None,
) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); `stdout` sends its output elsewhere (a pipe's end)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metis.cli",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE if stdout is None else stdout,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, (out or b"").decode(), err.decode()
