"""Requests aiohttp's HTTP parser refuses get the daemon's JSON error envelope
(metis/server/malformed.py), on a real daemon over raw sockets: the status aiohttp chose, code
`malformed_request`, no echo of what was sent, the connection closed, nothing secret logged,
and the daemon still serving afterwards."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl

import pytest

from metis.server.runner import Daemon
from tests.api import Api, auth_headers

SECRET = "sk-secret-malformed-7"


def client_hello() -> bytes:
    """The first flight of a real TLS client (its ClientHello), naming SECRET as the server."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(
        incoming, outgoing, server_hostname=f"{SECRET}.example"
    )
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    assert hello[:1] == b"\x16" and SECRET.encode() in hello  # a handshake record with the SNI
    return hello


def request(daemon: Daemon, case: str) -> bytes:
    host = f"Host: 127.0.0.1:{daemon.port}\r\n"
    key = f"Authorization: {auth_headers(daemon)['Authorization']}\r\n"
    chunked = "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    texts = {
        "garbage-request-line": f"\x00\x01{SECRET} /health\r\n{host}\r\n",
        "control-char-in-header": f"GET /sessions HTTP/1.1\r\n{host}{key}X-Note: a\x01{SECRET}\r\n\r\n",
        "bad-chunked-body": f"POST /sessions HTTP/1.1\r\n{host}{key}{chunked}\r\nzz{SECRET}\r\n",
        "bad-chunked-body-aap": f"POST /aap/sessions HTTP/1.1\r\n{host}{key}{chunked}\r\nzz{SECRET}\r\n",
        "overlong-header": f"GET /sessions HTTP/1.1\r\n{host}{key}X-Long: {SECRET}{'a' * 9000}\r\n\r\n",
    }
    if case == "tls-client-hello":
        return client_hello()
    return texts[case].encode("latin-1")


async def exchange(daemon: Daemon, sent: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Send `sent` on a fresh connection and read until the daemon closes it: (status line,
    headers with lower-case names, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    try:
        writer.write(sent)
        await writer.drain()
        # the daemon closes the connection itself: its keep-alive timer (60 s) would not
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status_line.encode(), headers, body


@pytest.mark.parametrize(
    "case",
    [
        "garbage-request-line",
        "control-char-in-header",
        "bad-chunked-body",
        "bad-chunked-body-aap",
        "overlong-header",
        "tls-client-hello",
    ],
)
async def test_a_request_the_parser_refuses_gets_the_json_envelope(
    daemon: Daemon, api: Api, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    sent = request(daemon, case)
    key = auth_headers(daemon)["Authorization"].removeprefix("Bearer ")
    with caplog.at_level(logging.DEBUG):
        status_line, headers, body = await exchange(daemon, sent)

    assert status_line.startswith(b"HTTP/1.") and status_line.split()[1] == b"400", status_line
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)
    assert set(error) == {"error"} and set(error["error"]) == {"code", "message", "details"}
    assert error["error"]["code"] == "malformed_request"
    assert error["error"]["details"] == {}
    # nothing the client sent comes back: not the bytes, not the marker, not the key
    assert sent not in body and SECRET.encode() not in body and key.encode() not in body
    # the headers every routed response carries (metis/server/middleware.py)
    async with api.http.get("/health") as routed:
        for name in ("Cache-Control", "X-Content-Type-Options"):
            assert headers[name.lower()] == routed.headers[name]

    logged = [r for r in caplog.records if r.name == "metis.server.http_errors"]
    assert logged and all(r.levelno <= logging.WARNING for r in logged)
    for record in caplog.records:
        text = record.getMessage()
        assert SECRET not in text and key not in text and not record.exc_info

    # the daemon still serves: an authenticated request on a new connection
    status, listing = await api.call("GET", "/sessions")
    assert status == 200 and "sessions" in listing


async def test_a_refusal_after_a_served_request_on_the_same_connection(daemon: Daemon) -> None:
    """A kept-alive connection whose second request is malformed: the first is answered as
    usual, the second with the envelope, then the connection is closed."""
    host = f"Host: 127.0.0.1:{daemon.port}\r\n"
    good = f"GET /health HTTP/1.1\r\n{host}\r\n".encode()
    bad = f"GET /health HTTP/1.1\r\n{host}X-Note: a\x7f{SECRET}\r\n\r\n".encode("latin-1")
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    try:
        writer.write(good)
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert first.split(b"\r\n", 1)[0].endswith(b"200 OK")
        length = int(first.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(bad)
        rest = await asyncio.wait_for(reader.read(), 5)  # read to the close
    finally:
        writer.close()
    head, _, body = rest.partition(b"\r\n\r\n")
    assert b" 400 " in head.split(b"\r\n", 1)[0] and b"application/json" in head
    assert json.loads(body)["error"]["code"] == "malformed_request"
    assert SECRET.encode() not in rest
