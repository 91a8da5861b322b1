"""A client that sends its request head a byte at a time cannot hold a connection open: the
head must be complete within `limits.header_read_timeout_s`, counted from the connection's
opening (or the end of its previous response)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from metis.server.runner import Daemon

BOUND_S = 1.5


def head(daemon: Daemon) -> bytes:
    return f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n\r\n".encode()


async def dribble(daemon: Daemon, head: bytes, *, first: bytes = b"") -> tuple[float, bytes]:
    """Send `first` at once, then `head` one byte a second; (seconds until the server closed
    the connection, from the first dribbled byte; everything it sent)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    received = b""
    try:
        if first:
            writer.write(first)
            received += await reader.readuntil(b"\r\n\r\n")
        started = time.monotonic()
        for byte in head:
            writer.write(bytes([byte]))
            try:
                chunk = await asyncio.wait_for(reader.read(65536), timeout=1.0)
            except TimeoutError:
                continue
            except ConnectionResetError:
                chunk = b""
            received += chunk
            if not chunk:
                return time.monotonic() - started, received
        raise AssertionError(f"the server read the whole head at a byte a second: {received!r}")
    finally:
        writer.close()


async def test_a_head_sent_a_byte_a_second_is_cut_off(start_daemon: Callable[..., Any]) -> None:
    daemon = await start_daemon(limits={"header_read_timeout_s": BOUND_S})
    elapsed, received = await dribble(daemon, head(daemon))
    assert elapsed < BOUND_S + 1.5, elapsed
    assert received == b""  # no request was read, so none was answered


async def test_the_bound_restarts_after_each_response(start_daemon: Callable[..., Any]) -> None:
    """A keep-alive connection gets a whole bound for each request head, and a second head sent
    slowly is cut off like the first."""
    daemon = await start_daemon(limits={"header_read_timeout_s": BOUND_S})
    elapsed, received = await dribble(daemon, head(daemon), first=head(daemon))
    assert received.startswith(b"HTTP/1.1 200 "), received
    assert elapsed < BOUND_S + 1.5, elapsed


async def test_the_default_bound_is_a_minute(make_settings: Callable[..., Any]) -> None:
    assert make_settings().limits.header_read_timeout_s == 60.0
