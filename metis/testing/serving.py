"""Running `metis serve` as a real subprocess, for the tests and the benchmark scripts that
need the daemon as a user starts it: a free loopback port, the process, and a poll until it
answers."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import aiohttp

# A fresh interpreter importing both provider SDKs from source (no bytecode cache in CI) can
# take well over ten seconds on a slow machine; the deadline only bounds a broken start.
SERVE_START_DEADLINE_S = 90.0


# Below Linux's default ephemeral range (32768-60999), from which the kernel picks the port of
# every bind to port 0 and of every outgoing connection.
_QUIET_PORTS = range(20_000, 32_000)


def free_port() -> int:
    """A loopback port nothing listens on now, for a server a test starts a moment later.

    Not one the kernel picks (a bind to port 0): it would be free again once returned, and
    the many daemons and clients of a parallel run take their ports from that same range, so
    one of them sometimes took it first (seen as `metis serve` finding its address in use).
    A random port below that range is taken by nobody unasked, and two test processes pick
    the same one rarely enough to ignore.
    """
    for _ in range(100):
        port = random.choice(_QUIET_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use: another server on this machine
                continue
            return port
    raise RuntimeError(f"no free loopback port in {_QUIET_PORTS}")


async def wait_until_serving(
    http: aiohttp.ClientSession, path: str, *, deadline_s: float = SERVE_START_DEADLINE_S
) -> None:
    """Poll `path` until it answers 200; fails the test once the deadline passes."""
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            async with http.get(path) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > give_up:
            raise AssertionError(f"metis serve did not answer {path} within {deadline_s:.0f} s")
        await asyncio.sleep(0.05)


async def spawn_serve(
    metis_home: Path,
    port: int,
    *,
    output: int | IO[Any] = asyncio.subprocess.DEVNULL,
    environ: Mapping[str, str] | None = None,
    **popen: Any,
) -> asyncio.subprocess.Process:
    """`metis serve` as a user starts it: its own interpreter, METIS_HOME from the environment;
    stdout and stderr both go to `output` unless `popen` gives one its own (the banner read
    from a pipe, say), and `popen` passes anything else on to the process's creation."""
    env = dict(os.environ if environ is None else environ)
    streams = {"stdout": output, "stderr": output, **popen}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metis.cli",
        "serve",
        "--port",
        str(port),
        env={**env, "METIS_HOME": str(metis_home)},
        **streams,
    )
