"""The server skeleton against the real daemon: envelope, guards, health, version, OpenAPI."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from metis.aap.errors import AAP_ERROR_CODES
from metis.config import load_settings
from metis.core.canonical.ids import new_session_id
from metis.core.canonical.times import now_us
from metis.core.store.migrations import LATEST_VERSION
from metis.server.errors import ERROR_CODES
from metis.server.runner import Daemon


def assert_envelope(body: dict, code: str) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code


async def test_unknown_route_gets_404_envelope(http: aiohttp.ClientSession) -> None:
    async with http.get("/nope") as r:
        assert r.status == 404
        assert r.headers["Content-Type"] == "application/json; charset=utf-8"
        body = await r.json()
    assert_envelope(body, "route_not_found")
    assert body["error"]["details"] == {"path": "/nope"}


async def test_trailing_slash_is_not_normalised(http: aiohttp.ClientSession) -> None:
    async with http.get("/health/") as r:
        assert r.status == 404


@pytest.mark.parametrize("method", ["PUT", "POST", "OPTIONS", "DELETE"])
async def test_known_path_with_other_method_gets_405_with_allow(
    http: aiohttp.ClientSession, method: str
) -> None:
    async with http.request(method, "/health") as r:
        assert r.status == 405
        assert r.headers["Allow"] == "GET, HEAD"
        assert "Access-Control-Allow-Origin" not in r.headers
        body = await r.json()
        assert_envelope(body, "method_not_allowed")
        assert body["error"]["details"] == {"allowed": ["GET", "HEAD"]}


async def test_foreign_host_header_is_refused(http: aiohttp.ClientSession, daemon: Daemon) -> None:
    async with http.get("/health", headers={"Host": f"evil.example:{daemon.port}"}) as r:
        assert r.status == 403
        assert_envelope(await r.json(), "host_not_allowed")
    async with http.get("/health", headers={"Host": "127.0.0.1:1"}) as r:
        assert r.status == 403


@pytest.mark.parametrize("host", ["127.0.0.1", "LOCALHOST", "localhost"])
async def test_loopback_host_names_with_our_port_pass(
    http: aiohttp.ClientSession, daemon: Daemon, host: str
) -> None:
    async with http.get("/health", headers={"Host": f"{host}:{daemon.port}"}) as r:
        assert r.status == 200


async def test_every_response_carries_no_store_and_nosniff(http: aiohttp.ClientSession) -> None:
    for path in ("/health", "/nope"):
        async with http.get(path) as r:
            assert r.headers["Cache-Control"] == "no-store"
            assert r.headers["X-Content-Type-Options"] == "nosniff"


async def test_health_reports_status_and_counters(http: aiohttp.ClientSession) -> None:
    async with http.get("/health") as r:
        assert r.status == 200
        body = await r.json()
    assert body["status"] == "ok"
    assert body["started_at"].endswith("Z") and len(body["started_at"]) == 27
    assert body["active_turns"] == 0 and body["active_sessions"] == 0
    assert body["uptime_seconds"] >= 0


async def test_health_is_refused_during_shutdown(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    daemon.state.shutting_down = True
    try:
        async with http.get("/health") as r:
            assert r.status == 503
            assert_envelope(await r.json(), "service_shutting_down")
    finally:
        daemon.state.shutting_down = False


async def test_version_reports_schema_versions(http: aiohttp.ClientSession, daemon: Daemon) -> None:
    async with http.get("/server/version") as r:
        body = await r.json()
    assert body["schema_versions"] == {
        "canonical_message": 1,
        "events": 1,
        "routing_policy": 1,
        "storage": LATEST_VERSION,  # v2 adds the AAP surface tables
    }
    assert body["streaming_protocol"] == 1
    row = await daemon.core.db.fetchone("PRAGMA user_version")
    assert row[0] == body["schema_versions"]["storage"]


async def test_openapi_covers_every_router_route_and_only_known_codes(
    http: aiohttp.ClientSession, daemon: Daemon
) -> None:
    async with http.get("/openapi.json") as r:
        doc = await r.json()
    assert doc["openapi"].startswith("3.1")
    for route in daemon.app.router.routes():
        path = route.resource.canonical
        # HEAD is every GET's, said once in docs/api.md rather than as operations
        method = "GET" if route.method == "HEAD" else route.method
        assert method.lower() in doc["paths"][path], (route.method, path)
    assert not any("head" in ops for ops in doc["paths"].values())
    for path, ops in doc["paths"].items():
        # AAP routes carry the AAP code table (metis/aap/errors.py), never the metis one
        codes = AAP_ERROR_CODES if path.startswith("/aap/") else ERROR_CODES
        for method, op in ops.items():
            assert set(op["x-error-codes"]) <= set(codes)
            if not path.startswith("/aap/") and method in ("post", "patch", "delete"):
                assert "origin_not_allowed" in op["x-error-codes"], (method, path)


async def test_non_loopback_bind_is_refused_with_an_error_log(
    metis_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        settings = load_settings(home=metis_home, host="0.0.0.0", port=0)
    assert settings.host == "127.0.0.1"
    assert any("0.0.0.0" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    d = Daemon(settings)
    await d.start()
    try:
        assert d.base_url.startswith("http://127.0.0.1:")
    finally:
        await d.stop()


async def test_health_reads_nothing_from_the_store_however_many_sessions_it_holds(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """O(1) by construction: 10,000 stored sessions, and `/health` runs no SQL at all on
    either of the store's connections (it answers from in-memory counters)."""
    stamp = now_us()
    rows = [(new_session_id(), "/tmp", "v", stamp, stamp) for _ in range(10_000)]
    async with daemon.core.db.write() as conn:
        await conn.executemany(
            "INSERT INTO sessions (id, workspace_path, routing_policy_version, status, created_at_us, updated_at_us) "
            "VALUES (?,?,?,'active',?,?)",
            rows,
        )
    statements: list[str] = []
    connections = (daemon.core.db.reader, daemon.core.db.writer)
    for conn in connections:
        await conn.set_trace_callback(statements.append)
    try:
        for _ in range(5):
            async with http.get("/health") as r:
                assert r.status == 200 and (await r.json())["status"] == "ok"
    finally:
        for conn in connections:
            await conn.set_trace_callback(None)
    assert [s for s in statements if "sessions" in s.lower()] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux-only")
def test_the_serving_process_is_not_dumpable() -> None:
    """Same-user processes (the shell tool's commands) cannot read a non-dumpable process's
    /proc/<pid>/environ, where the provider keys are. Checked in a child: it is process-wide."""
    probe = (
        "import ctypes; from metis.server.runner import protect_process_memory; "
        "assert protect_process_memory(); print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"  # PR_GET_DUMPABLE
