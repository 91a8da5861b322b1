"""A slow client cannot hold a connection open: the request head must be complete within
`limits.header_read_timeout_s`, counted from the connection's opening (or the end of its
previous response), and its body within `limits.body_read_timeout_s` of the body's read."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from metis.server.runner import Daemon
from tests.api import auth_headers

BOUND_S = 1.5
# What a loaded machine may add to the bound (the whole suite runs on every CPU at once): far
# below the default bound of a minute, which is what the tests tell apart.
SLACK_S = 3.0


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
    assert elapsed < BOUND_S + SLACK_S, elapsed
    assert received == b""  # no request was read, so none was answered


async def test_the_bound_restarts_after_each_response(start_daemon: Callable[..., Any]) -> None:
    """A keep-alive connection gets a whole bound for each request head, and a second head sent
    slowly is cut off like the first."""
    daemon = await start_daemon(limits={"header_read_timeout_s": BOUND_S})
    elapsed, received = await dribble(daemon, head(daemon), first=head(daemon))
    assert received.startswith(b"HTTP/1.1 200 "), received
    assert elapsed < BOUND_S + SLACK_S, elapsed


async def test_the_default_bound_is_a_minute(make_settings: Callable[..., Any]) -> None:
    assert make_settings().limits.header_read_timeout_s == 60.0


async def stalled_body(daemon: Daemon, path: str) -> tuple[float, bytes]:
    """A POST whose head promises 100 bytes of body, of which 10 come: (seconds until the
    server closed the connection, everything it sent)."""
    key = auth_headers(daemon)["Authorization"]
    sent = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\nAuthorization: {key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        '{"workspac'
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    try:
        started = time.monotonic()
        writer.write(sent.encode())
        received = await asyncio.wait_for(reader.read(), BOUND_S + SLACK_S + 5)
        return time.monotonic() - started, received
    finally:
        writer.close()


async def test_a_body_that_stops_half_way_is_answered_408_and_the_connection_closed(
    start_daemon: Callable[..., Any],
) -> None:
    daemon = await start_daemon(limits={"body_read_timeout_s": BOUND_S})
    elapsed, received = await stalled_body(daemon, "/sessions")
    assert BOUND_S - 0.1 < elapsed < BOUND_S + SLACK_S, elapsed
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), received
    assert b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout"
    assert error["message"] == f"the request body did not arrive within {BOUND_S:g} s"
    assert await daemon.core.db.fetchall("SELECT 1 FROM sessions") == []  # nothing was created


async def test_aap_answers_a_stalled_body_with_its_own_code(
    start_daemon: Callable[..., Any],
) -> None:
    daemon = await start_daemon(limits={"body_read_timeout_s": BOUND_S})
    elapsed, received = await stalled_body(daemon, "/aap/sessions")
    assert elapsed < BOUND_S + SLACK_S, elapsed
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), received
    assert json.loads(body)["error"]["code"] == "invalid_json"


async def test_the_default_body_bound_is_a_minute(make_settings: Callable[..., Any]) -> None:
    assert make_settings().limits.body_read_timeout_s == 60.0
