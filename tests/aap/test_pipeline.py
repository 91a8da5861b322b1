"""Mounting, /meta, auth, CORS and body checks."""

from __future__ import annotations

import asyncio
import logging
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.server.runner import Daemon
from tests.aap.client import AapClient
from tests.aap.conftest import KEY

ORIGIN = "http://127.0.0.1:4173"
V3_ROUTES = [
    ("GET", "/sessions"),
    ("POST", "/sessions"),
    ("GET", "/sessions/sess_01ARZ3NDEKTSV4RRFFQ69G5FAV"),
    ("DELETE", "/sessions/sess_01ARZ3NDEKTSV4RRFFQ69G5FAV"),
    ("GET", "/sessions/sess_01ARZ3NDEKTSV4RRFFQ69G5FAV/history?type=full"),
    ("POST", "/sessions/sess_01ARZ3NDEKTSV4RRFFQ69G5FAV/turns"),
]
V1_ROUTES = [
    ("GET", "/sessions"),
    ("PUT", "/session"),
    ("GET", "/session/sess_01ARZ3NDEKTSV4RRFFQ69G5FAV"),
    ("POST", "/session/sess_01ARZ3NDEKTSV4RRFFQ69G5FAV"),
    ("DELETE", "/session/sess_01ARZ3NDEKTSV4RRFFQ69G5FAV"),
]


def envelope(body: Any, code: str) -> None:
    assert set(body) == {"error"} and body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and isinstance(body["error"]["details"], dict)


async def test_meta_v3_and_v1_describe_the_metis_agent(
    daemon_and_aap: tuple[Daemon, AapClient],
) -> None:
    daemon, aap = daemon_and_aap
    v3 = await aap.request("GET", "/meta", auth=False)
    v1 = await aap.v1.request("GET", "/meta", auth=False)
    assert v3.status == v1.status == 200
    assert v3.body["version"] == 3 and v1.body["version"] == 1
    [agent] = v3.body["agents"]
    [agent1] = v1.body["agents"]
    assert agent["name"] == "metis" and agent["version"] == "0.1.0"
    registry = daemon.core.tool_registry
    assert [t["name"] for t in agent["tools"]] == [
        "read_file",
        "write_file",
        "patch_file",
        "list_dir",
        "grep_files",
        "shell",
    ]
    for tool, tool1 in zip(agent["tools"], agent1["tools"], strict=True):
        definition = registry.get(tool["name"]).definition
        assert tool == {
            "name": definition.name,
            "title": definition.title,
            "description": definition.description,
            "parameters": definition.input_schema,
        }
        assert tool1["inputSchema"] == definition.input_schema and "parameters" not in tool1
    model, workspace = agent["options"]
    assert model["name"] == "model" and model["type"] == "select" and model["default"] == "auto"
    assert model["options"][0] == "auto" and "scripted" in model["options"]
    assert workspace["name"] == "workspace" and workspace["type"] == "text"
    assert workspace["default"] == str((daemon.settings.home / "workspaces" / "default").resolve())
    assert agent["capabilities"] == {
        "history": {"compacted": {}, "full": {}},
        "stream": {"delta": {}, "message": {}, "none": {}},
        "application": {"tools": {}},
        "image": {"data": {}},
    }
    assert agent1["capabilities"] == agent["capabilities"]


async def test_meta_is_public_but_a_wrong_key_fails(aap: AapClient) -> None:
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": f"bearer {KEY}"}):
        assert (await aap.request("GET", "/meta", headers=headers, auth=False)).status == 200
    reply = await aap.request("GET", "/meta", headers={"Authorization": "Bearer wrong"}, auth=False)
    assert reply.status == 401 and reply.headers["WWW-Authenticate"] == 'Bearer realm="metis-aap"'
    envelope(reply.body, "unauthorized")


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic " + KEY},
        {"Authorization": "Bearer nope"},
        {"Authorization": KEY},
    ],
)
async def test_every_other_route_needs_the_key(aap: AapClient, headers: dict[str, str]) -> None:
    for client, routes in ((aap, V3_ROUTES), (aap.v1, V1_ROUTES)):
        for method, path in routes:
            reply = await client.request(method, path, {}, headers=headers, auth=False)
            assert reply.status == 401, (method, path, reply.body)
            assert reply.headers["WWW-Authenticate"] == 'Bearer realm="metis-aap"'
            envelope(reply.body, "unauthorized")
    # the scheme is case-insensitive
    ok = await aap.request(
        "GET", "/sessions", headers={"Authorization": f"BEARER {KEY}"}, auth=False
    )
    assert ok.status == 200


async def test_an_undecodable_key_is_401_not_500(daemon_and_aap: tuple[Daemon, AapClient]) -> None:
    """Header bytes that are not UTF-8 reach the key check as surrogate escapes."""
    daemon, _ = daemon_and_aap
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    writer.write(
        b"GET /aap/sessions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Authorization: Bearer \xff\xfe\r\nConnection: close\r\n\r\n" % daemon.port
    )
    status_line = await reader.readline()
    writer.close()
    assert status_line.split()[1] == b"401"


async def test_generated_key_file_is_private_and_never_logged(
    metis_home: Path,
    start_daemon: Any,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with caplog.at_level(logging.DEBUG):
        daemon = await start_daemon()
    path = metis_home / "api_key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = path.read_text().strip()
    assert len(key) >= 32 and key not in caplog.text and str(path) in caplog.text
    out = capsys.readouterr().out
    assert key not in out  # `metis serve`'s banner names the file (tests/commands/test_serve.py)
    async with aiohttp.ClientSession(base_url=daemon.base_url) as http:
        client = AapClient(http, key)
        assert (await client.request("GET", "/sessions")).status == 200
    await daemon.stop()
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        await start_daemon()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "tightened" in caplog.text
    assert key not in capsys.readouterr().out  # not printed again


async def test_env_key_wins_over_the_file(
    metis_home: Path, start_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "api_key").write_text("file-key-" + "x" * 30)
    (metis_home / "api_key").chmod(0o600)
    monkeypatch.setenv("METIS_API_KEY", KEY)
    daemon = await start_daemon()
    async with aiohttp.ClientSession(base_url=daemon.base_url) as http:
        assert (await AapClient(http, KEY).request("GET", "/sessions")).status == 200
        assert (
            await AapClient(http, "file-key-" + "x" * 30).request("GET", "/sessions")
        ).status == 401


async def test_routing_errors_use_the_aap_envelope(aap: AapClient) -> None:
    for client, path in (
        (aap, "/nowhere"),
        (aap, "/sessions/"),
        (aap.v1, "/nowhere"),
        (aap.v1, "/sessions/x/history"),
    ):
        reply = await client.request("GET", path)
        assert reply.status == 404, path
        envelope(reply.body, "not_found")
    reply = await aap.request("PATCH", "/sessions", {})
    assert reply.status == 405 and reply.headers["Allow"] == "GET, HEAD, POST, OPTIONS"
    envelope(reply.body, "method_not_allowed")
    # auth comes first, even for unknown paths
    reply = await aap.request("GET", "/nowhere", auth=False)
    assert reply.status == 401


async def test_body_checks(daemon_and_aap: tuple[Daemon, AapClient]) -> None:
    daemon, aap = daemon_and_aap
    reply = await aap.request(
        "POST",
        "/sessions",
        raw=b'{"agent":{"name":"metis"}}',
        headers={"Content-Type": "text/plain"},
    )
    assert reply.status == 415
    envelope(reply.body, "unsupported_media_type")
    for raw in (b"{nope", b"[1, 2]", b'"text"', b"\xff\xfe", b'{"a": "\\ud800"}'):
        reply = await aap.request(
            "POST",
            "/sessions",
            raw=raw,
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        assert reply.status == 400, raw
        envelope(reply.body, "invalid_json")
    ok = await aap.request(
        "POST",
        "/sessions",
        {
            "agent": {"name": "metis", "colour": "blue", "options": None},
            "unknown": [1],
            "messages": None,
        },
    )
    assert ok.status == 201
    stored = await daemon.core.db.fetchone(
        "SELECT * FROM aap_sessions WHERE session_id=?", (ok.body["sessionId"],)
    )
    assert "colour" not in dict(stored).__repr__() and "unknown" not in dict(stored).__repr__()


async def test_a_validation_error_locates_the_field_in_the_body(aap: AapClient) -> None:
    """`loc` is a path a client can follow into what it sent: the message's role (a tagged
    union's tag) and the member types of a union (`str`, `list[any]`) are no keys of it."""
    sid = await aap.create()
    permission = {"role": "tool_permission", "toolCallId": "tu_1", "granted": "yes"}
    for client, path in ((aap, f"/sessions/{sid}/turns"), (aap.v1, f"/session/{sid}")):
        for messages, loc in (
            ([permission], ["body", "messages", 0, "granted"]),
            ([{"role": "user", "content": 5}], ["body", "messages", 0, "content"]),
            ([{"role": "tool", "content": "x"}], ["body", "messages", 0, "toolCallId"]),
        ):
            reply = await client.request("POST", path, {"messages": messages})
            assert reply.status == 400 and reply.error == "validation_error", reply.body
            errors = reply.body["error"]["details"]["errors"]
            assert errors and all(e["loc"] == loc for e in errors), errors
    seed = [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "y"}]
    for client, method, path in ((aap, "POST", "/sessions"), (aap.v1, "PUT", "/session")):
        reply = await client.request(method, path, {"agent": {"name": "metis"}, "messages": seed})
        assert reply.status == 400 and reply.error == "validation_error", reply.body
        [error] = reply.body["error"]["details"]["errors"]
        assert error == {"loc": ["body", "messages", 1, "toolCallId"], "msg": "Field required"}


async def test_oversized_body_is_413(start_daemon: Any, client_for: Any) -> None:
    daemon = await start_daemon(aap={"max_request_bytes": 2048})
    aap = await client_for(daemon)
    reply = await aap.request("POST", "/sessions", {"agent": {"name": "metis"}, "pad": "x" * 4096})
    assert reply.status == 413
    envelope(reply.body, "request_too_large")


@pytest.fixture
async def cors_aap(start_daemon: Any, client_for: Any, workspace: Path) -> tuple[Daemon, AapClient]:
    daemon = await start_daemon(aap={"cors_origins": [ORIGIN], "workspace_roots": [str(workspace)]})
    return daemon, await client_for(daemon)


async def test_preflight_is_answered_without_auth_on_any_path(
    cors_aap: tuple[Daemon, AapClient],
) -> None:
    _, aap = cors_aap
    for client, path in (
        (aap, "/sessions"),
        (aap, "/nowhere/at/all"),
        (aap.v1, "/session"),
        (aap.v1, "/x"),
    ):
        reply = await client.request(
            "OPTIONS",
            path,
            headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
            auth=False,
        )
        assert reply.status == 204 and not reply.body
        assert reply.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert reply.headers["Access-Control-Allow-Methods"] == "GET, POST, PUT, DELETE, OPTIONS"
        assert reply.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        assert reply.headers["Access-Control-Max-Age"] == "600"
        assert reply.headers["Vary"] == "Origin"
        assert "Access-Control-Allow-Credentials" not in reply.headers
        other = await client.request(
            "OPTIONS", path, headers={"Origin": "http://evil.test"}, auth=False
        )
        assert other.status == 204 and not any(
            h.startswith("Access-Control") for h in other.headers
        )


async def test_cors_headers_on_every_kind_of_response(cors_aap: tuple[Daemon, AapClient]) -> None:
    _, aap = cors_aap
    origin = {"Origin": ORIGIN}
    error = await aap.request("GET", "/sessions", headers=origin, auth=False)
    created = await aap.request(
        "POST",
        "/sessions",
        {"agent": {"name": "metis", "options": {"workspace": aap.workspace}}},
        headers=origin,
    )
    sid = created.body["sessionId"]
    stream = await aap.request(
        "POST",
        f"/sessions/{sid}/turns",
        {"stream": "delta", "messages": [{"role": "user", "content": "hi"}]},
        headers=origin,
    )
    deleted = await aap.request("DELETE", f"/sessions/{sid}", headers=origin)
    for reply, status in ((error, 401), (created, 201), (stream, 200), (deleted, 204)):
        assert reply.status == status
        assert reply.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert reply.headers["Vary"] == "Origin"
    for method in ("POST", "PUT", "DELETE"):
        path = "/session" if method == "PUT" else "/sessions"
        client = aap.v1 if method == "PUT" else aap
        reply = await client.request(method, path, {}, headers={"Origin": "http://evil.test"})
        assert reply.status == 403 and reply.error == "origin_not_allowed", (method, reply.body)
    refused = await aap.request(
        "POST", "/sessions", {}, headers={"Origin": "http://evil.test"}, auth=False
    )
    assert refused.status == 403 and refused.error == "origin_not_allowed"  # before auth


async def test_metis_routes_never_send_cors(cors_aap: tuple[Daemon, AapClient]) -> None:
    _daemon, aap = cors_aap
    async with aap.http.options(
        "/sessions", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    ) as r:
        assert not any(h.startswith("Access-Control") for h in r.headers)
    async with aap.http.get("/health", headers={"Origin": ORIGIN}) as r:
        assert r.status == 200 and not any(h.startswith("Access-Control") for h in r.headers)


async def test_no_cors_headers_when_unconfigured(aap: AapClient) -> None:
    reply = await aap.request("OPTIONS", "/sessions", headers={"Origin": ORIGIN}, auth=False)
    assert reply.status == 204 and not any(h.startswith("Access-Control") for h in reply.headers)
    reply = await aap.request("GET", "/sessions", headers={"Origin": ORIGIN})
    assert reply.status == 200 and "Access-Control-Allow-Origin" not in reply.headers


async def test_bad_host_is_refused_before_cors(cors_aap: tuple[Daemon, AapClient]) -> None:
    _daemon, aap = cors_aap
    reply = await aap.request(
        "OPTIONS", "/sessions", headers={"Origin": ORIGIN, "Host": "evil.test"}, auth=False
    )
    assert reply.status == 403 and reply.body["error"]["code"] == "host_not_allowed"
    assert "Access-Control-Allow-Origin" not in reply.headers


async def test_shutdown_is_503_in_the_aap_envelope(
    daemon_and_aap: tuple[Daemon, AapClient],
) -> None:
    daemon, aap = daemon_and_aap
    daemon.state.shutting_down = True
    try:
        reply = await aap.request("GET", "/sessions")
        assert reply.status == 503
        envelope(reply.body, "service_shutting_down")
    finally:
        daemon.state.shutting_down = False


async def test_openapi_lists_the_aap_routes(aap: AapClient) -> None:
    async with aap.http.get("/openapi.json") as r:
        doc = await r.json()
    assert "post" in doc["paths"]["/aap/sessions/{session_id}/turns"]
    assert "put" in doc["paths"]["/aap/v1/session"]
    schemas = doc["components"]["schemas"]
    assert "toolCallId" in schemas["AapV3ToolMessage"]["properties"]
    assert "inputSchema" in schemas["AapV1ToolSpec"]["properties"]


async def test_openapi_describes_what_the_aap_routes_serve(aap: AapClient) -> None:
    async with aap.http.get("/openapi.json") as r:
        paths = (await r.json())["paths"]
    for meta in (paths["/aap/meta"]["get"], paths["/aap/v1/meta"]["get"]):
        assert "unauthorized" in meta["x-error-codes"] and "401" in meta["responses"]
    put = paths["/aap/v1/session"]["put"]["responses"]
    assert set(put["201"]["content"]) == {"application/json"}
    assert set(put["200"]["content"]) == {"text/event-stream"}
    for turn in (
        paths["/aap/sessions/{session_id}/turns"]["post"],
        paths["/aap/v1/session/{session_id}"]["post"],
    ):
        content = turn["responses"]["200"]["content"]
        assert set(content) == {"application/json", "text/event-stream"}
        assert "$ref" in content["application/json"]["schema"]
