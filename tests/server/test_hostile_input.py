"""Inputs found by fuzzing the daemon that once got a 500 or stored what cannot be read back."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from metis.server.runner import Daemon
from tests.api import Api
from tests.ws_client import Ws


async def raw_post(api: Api, path: str, body: bytes) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    async with api.http.post(path, data=body, headers=headers) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-2E+400"])
async def test_numbers_json_cannot_write_back_are_refused(
    api: Api, workspace: Path, number: bytes
) -> None:
    sid = (await api.create_session(workspace))["id"]
    body = b'{"content": [{"type": "text", "text": "x"}], "per_message_override": ' + number + b"}"
    status, error = await raw_post(api, f"/sessions/{sid}/turns", body)
    assert status == 400 and error["error"]["code"] == "validation_error"
    client, _ack = await Ws.subscribed(api, sid)
    await client.ws.send_str('{"type": "ping", "nonce": ' + number.decode() + "}")
    closed = await client.closed()
    assert closed.code == 1008 and closed.reason["code"] == "protocol_error"


async def test_a_nul_in_a_workspace_path_is_a_bad_path_not_a_crash(api: Api) -> None:
    for raw in ("~\u0000", "/tmp/\u0000x"):
        status, body = await api.call("POST", "/sessions", {"workspace_path": raw})
        assert status == 400 and body["error"]["code"] == "workspace_not_found", body
    for raw in ("/tmp/\u0000", "~\u0000"):
        status, body = await api.call("GET", "/sessions", params={"workspace_path": raw})
        assert status == 200 and body["sessions"] == []


async def test_a_workspace_name_too_long_for_the_file_system_is_a_bad_path_not_a_crash(
    api: Api,
) -> None:
    for raw in ("/" + "x" * 5000, "/tmp/" + "y" * 300):
        status, body = await api.call("POST", "/sessions", {"workspace_path": raw})
        assert status == 400 and body["error"]["code"] == "workspace_not_found", body
        status, body = await api.call("GET", "/sessions", params={"workspace_path": raw})
        assert status == 200 and body["sessions"] == []


async def test_a_tilde_naming_no_known_user_is_an_invalid_workspace(api: Api) -> None:
    """`Path.expanduser` raises RuntimeError for `~user` with no such user: once a 500."""
    for raw in ("~nosuchuser-metis", "~\u00a5", "~nosuchuser-metis/x"):
        status, body = await api.call("POST", "/sessions", {"workspace_path": raw})
        assert status == 400 and body["error"]["code"] == "invalid_workspace", body
        status, body = await api.call("GET", "/sessions", params={"workspace_path": raw})
        assert status == 400 and body["error"]["code"] == "invalid_workspace", body


async def test_policy_yaml_nested_too_deeply_is_reported_invalid(api: Api) -> None:
    deep = "x: " + "[" * 2000 + "]" * 2000 + "\n"
    status, body = await api.call("POST", "/routing/check", {"policy_yaml": deep})
    assert status == 200 and body["valid"] is False
    assert "nested too deeply" in body["errors"][0]


@pytest.mark.parametrize(
    "head",
    [
        b"GET /health HTTP/1.1\r\nHost: {host}\r\nContent-Length: sk-secret-1\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer sk-secret-1"
        + b"x" * 9000
        + b"\r\n\r\n",
        b"GET\x01sk-secret-1 / HTTP/1.1\r\nHost: {host}\r\n\r\n",
    ],
    ids=["bad-content-length", "overlong-header", "bad-method"],
)
async def test_an_unparsable_request_is_refused_400_and_logged_without_its_bytes(
    daemon: Daemon, caplog: pytest.LogCaptureFixture, head: bytes
) -> None:
    host = f"127.0.0.1:{daemon.port}".encode()
    with caplog.at_level(logging.DEBUG):
        reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
        writer.write(head.replace(b"{host}", host))
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n", 1)[0]
    logged = [r for r in caplog.records if r.name == "metis.server.http_errors"]
    assert logged and all(r.levelno <= logging.WARNING for r in logged)
    for record in caplog.records:
        assert "sk-secret-1" not in record.getMessage() and not record.exc_info


@pytest.mark.parametrize("prefix", ["", "/aap"])
async def test_an_encoded_line_break_in_a_path_cannot_forge_a_log_line(
    api: Api, caplog: pytest.LogCaptureFixture, prefix: str
) -> None:
    forged = "%0a2026-01-01 level=ERROR logger=metis FORGED%00%0d"
    with caplog.at_level(logging.INFO):
        async with api.http.get(f"{prefix}/nope{forged}") as response:
            assert response.status in (401, 404)
    logged = [r.getMessage() for r in caplog.records if "nope" in r.getMessage()]
    assert logged, "the request was not logged"
    for message in logged:
        assert "\n" not in message and "\r" not in message and "\0" not in message
        assert "/nope%0A" in message
