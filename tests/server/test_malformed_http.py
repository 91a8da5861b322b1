"""Requests aiohttp's HTTP parser refuses get the daemon's JSON error envelope
(metis/server/malformed.py), on a real daemon over raw sockets: the status aiohttp chose, code
`malformed_request`, no echo of what was sent, the connection closed, nothing secret logged,
and the daemon still serving afterwards. So do a bad chunk arriving after its head was routed
(`read_body`), and an `Expect` other than 100-continue (417 `expectation_failed`), while
100-continue itself still works."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import ssl
import time
from pathlib import Path
from unittest.mock import ANY

import aiohttp
import pytest

from metis.server.errors import ERROR_CODES
from metis.server.runner import Daemon
from metis.testing.serving import free_port, spawn_serve, wait_until_serving
from tests.api import Api, auth_headers

ROOT = Path(__file__).resolve().parents[2]

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
    return parse_answer(answer)


def parse_answer(answer: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """(status line, headers with lower-case names, body) of a raw HTTP/1.1 answer."""
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


def test_the_parser_s_refusal_is_a_code_of_the_metis_table() -> None:
    """`malformed_request` and `expectation_failed` are codes of the one metis table (also
    listed in docs/api.md), not of a table of their own."""
    assert ERROR_CODES["malformed_request"] == 400
    assert ERROR_CODES["expectation_failed"] == 417
    rest = (ROOT / "docs" / "api.md").read_text().split("## REST (metis surface)", 1)[1]
    rows = dict(re.findall(r"^\| (\d{3}) \| (.*) \|$", rest.split("\n\n", 3)[2], re.MULTILINE))
    for code in ("malformed_request", "expectation_failed"):
        assert f"`{code}`" in rows[str(ERROR_CODES[code])], code


def assert_envelope(
    status_line: bytes, headers: dict[str, str], body: bytes, status: int, code: str
) -> None:
    assert status_line.split()[1] == str(status).encode(), status_line
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert int(headers["content-length"]) == len(body)
    assert headers["cache-control"] == "no-store" and headers["x-content-type-options"] == "nosniff"
    assert json.loads(body) == {"error": {"code": code, "message": ANY, "details": {}}}
    assert SECRET.encode() not in body


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/sessions"),  # a metis route: its own expect handler (metis/http/routes.py)
        ("GET", "/aap/sessions"),  # an AAP route: raised there, answered by the server
        ("GET", "/no-such-path"),  # no route at all (404)
        ("DELETE", "/health"),  # a path without that method (405)
    ],
)
async def test_an_unknown_expectation_is_refused_in_the_envelope(
    daemon: Daemon, api: Api, caplog: pytest.LogCaptureFixture, method: str, path: str
) -> None:
    host = f"Host: 127.0.0.1:{daemon.port}\r\n"
    key = f"Authorization: {auth_headers(daemon)['Authorization']}\r\n"
    sent = f"{method} {path} HTTP/1.1\r\n{host}{key}Expect: bogus-{SECRET}\r\n\r\n".encode()
    with caplog.at_level(logging.DEBUG):
        status_line, headers, body = await exchange(daemon, sent)  # closed after the answer
    assert_envelope(status_line, headers, body, 417, "expectation_failed")
    assert b"bogus" not in body
    for record in caplog.records:
        assert SECRET not in record.getMessage() and record.levelno < logging.ERROR
    status, listing = await api.call("GET", "/sessions")
    assert status == 200 and "sessions" in listing


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str]]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status_line, *lines = head.decode("latin-1").removesuffix("\r\n\r\n").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status_line.encode(), headers


async def sent_after_100_continue(
    daemon: Daemon, method: str, path: str, body: bytes
) -> tuple[bytes, bytes]:
    """A request asking `Expect: 100-continue`, its body sent once the interim answer came (it
    must): the final answer's status line and body."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
        f"Authorization: {auth_headers(daemon)['Authorization']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Expect: 100-continue\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    try:
        writer.write(head.encode())
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        status_line, headers = await read_head(reader)
        return status_line, await reader.readexactly(int(headers["content-length"]))
    finally:
        writer.close()


async def test_a_body_sent_after_100_continue_is_served(daemon: Daemon, workspace: Path) -> None:
    """`Expect: 100-continue` still works: the daemon answers the interim `100 Continue`
    before the body is sent, then the request is served as usual."""
    body = json.dumps({"workspace_path": str(workspace)}).encode()
    status_line, answer = await sent_after_100_continue(daemon, "POST", "/sessions", body)
    assert status_line.split()[1] == b"201", status_line
    assert json.loads(answer)["id"].startswith("sess_")


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/sessions"), ("POST", "/aap/sessions"), ("PUT", "/aap/v1/session")],
)
async def test_the_100_continue_comes_when_the_body_is_read_on_both_surfaces(
    daemon: Daemon, method: str, path: str
) -> None:
    """A request that passes the checks before its body gets the interim answer, then its body
    is read and judged (an empty object is refused by the handler's validation)."""
    status_line, _ = await sent_after_100_continue(daemon, method, path, b"{}")
    assert status_line.split()[1] == b"400", status_line


@pytest.mark.parametrize("path", ["/sessions", "/aap/sessions"])
@pytest.mark.parametrize(
    ("with_key", "length", "status"),
    [(False, 100, 401), (True, 10**9, 413)],
    ids=["no key", "declared too large"],
)
async def test_a_request_refused_before_its_body_gets_no_100_continue_and_is_closed(
    daemon: Daemon, path: str, with_key: bool, length: int, status: int
) -> None:
    """`curl -d @big.json` without the key, or with a body over the limit: the client waits
    for `100 Continue` before uploading; the refusal comes instead, so nothing is uploaded,
    and the connection is closed (whether the client sends the body next is unknown)."""
    key = f"Authorization: {auth_headers(daemon)['Authorization']}\r\n" if with_key else ""
    sent = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n{key}"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
        "Expect: 100-continue\r\n\r\n"
    ).encode()
    status_line, headers, body = await exchange(daemon, sent)  # read to the close
    assert status_line.split()[1] == str(status).encode(), status_line
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] in (
        "unauthorized",
        "payload_too_large",
        "request_too_large",
    )


async def send_a_bad_chunk_after_routing(
    port: int, key: str, path: str
) -> tuple[bytes, dict[str, str], bytes, float]:
    """A chunked POST whose head is routed first (the interim `100 Continue` says so), then a
    valid chunk, then a chunk-size line that is not hex: the answer, read to the close, and
    how long it took after the bad line was sent."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        "Expect: 100-continue\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode())
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"2\r\n{}\r\n")
        await writer.drain()
        started = time.monotonic()
        writer.write(f"zz{SECRET}\r\n".encode())
        await writer.drain()
        # the daemon answers at once and closes: the client never gives up first
        answer = await asyncio.wait_for(reader.read(), 5)
        elapsed = time.monotonic() - started
    finally:
        writer.close()
    return (*parse_answer(answer), elapsed)


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/sessions", "malformed_request"),
        # AAP's table has no such code: its body check answers an unreadable body as invalid
        ("/aap/sessions", "invalid_json"),
    ],
)
async def test_a_bad_chunk_after_the_head_was_routed_is_answered_at_once(
    daemon: Daemon, api: Api, caplog: pytest.LogCaptureFixture, path: str, code: str
) -> None:
    key = auth_headers(daemon)["Authorization"].removeprefix("Bearer ")
    with caplog.at_level(logging.DEBUG):
        status_line, headers, body, elapsed = await send_a_bad_chunk_after_routing(
            daemon.port, key, path
        )
    assert elapsed < 2, elapsed
    assert_envelope(status_line, headers, body, 400, code)
    # one WARNING naming the parser's error; no traceback, no bytes of the request
    logged = [r for r in caplog.records if r.name == "metis.server.http_errors"]
    assert [r.levelno for r in logged] == [logging.WARNING]
    for record in caplog.records:
        assert SECRET not in record.getMessage() and key not in record.getMessage()
        assert not record.exc_info and record.levelno < logging.ERROR
    status, listing = await api.call("GET", "/sessions")
    assert status == 200 and "sessions" in listing


async def test_a_bad_chunk_after_routing_with_aiohttp_s_pure_python_parser(
    metis_home: Path,
) -> None:
    """aiohttp's pure-Python parser (AIOHTTP_NO_EXTENSIONS=1) hands the bad chunk to the body
    itself, unlike the C parser: the answer and the log are the same."""
    port = free_port()
    env = {**os.environ, "AIOHTTP_NO_EXTENSIONS": "1"}
    env.pop("METIS_API_KEY", None)
    proc = await spawn_serve(metis_home, port, output=asyncio.subprocess.PIPE, environ=env)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            await wait_until_serving(http, "/health")
        key = (metis_home / "api_key").read_text().strip()
        status_line, headers, body, elapsed = await send_a_bad_chunk_after_routing(
            port, key, "/sessions"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await proc.communicate()
    assert elapsed < 2, elapsed
    assert_envelope(status_line, headers, body, 400, "malformed_request")
    log = err.decode()
    # the pure-Python parser's own error type (the C parser's is BadHttpMessage)
    assert (
        "refused an HTTP request body its parser could not read (400, TransferEncodingError)" in log
    )
    assert "Traceback" not in log and SECRET not in log and key not in log
    assert proc.returncode == 0
