"""HEAD on the metis surface: every GET route answers it with the GET's status and headers and
no body (metis/http/routes.py `add_routes`), through the same guards, on a real daemon."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp

from metis.server.http import ROUTE_SPEC_KEY
from metis.server.runner import Daemon
from tests.api import Api, api_session

# Paths whose GET answer is the same bytes every time: the HEAD's Content-Length must equal it.
STABLE = ("/", "/openapi.json", "/static/app.css")
# Not compared route by route: the WebSocket upgrade (test below) and the login exchange.
SKIPPED = ("/sessions/{session_id}/stream", "/login")


def _get_paths(daemon: Daemon, session_id: str) -> list[str]:
    """A concrete path for every metis GET route, the session's id in the templates."""
    names = {"session_id": session_id, "name": "app.css", "model": "haiku"}
    paths = []
    for spec in dict.fromkeys(daemon.app[ROUTE_SPEC_KEY].values()):
        template = re.sub(r"{(\w+):[^}]+}", r"{\1}", spec.path)
        if spec.method == "GET" and template not in SKIPPED:
            paths.append(re.sub(r"{(\w+)}", lambda m: names[m.group(1)], template))
    return paths


async def test_every_get_route_answers_head_with_the_gets_status_and_headers_and_no_body(
    daemon: Daemon, http: aiohttp.ClientSession, workspace: Path
) -> None:
    sid = (await Api(http).create_session(workspace))["id"]
    paths = _get_paths(daemon, sid)
    assert {"/health", "/sessions", "/", f"/sessions/{sid}/messages"} <= set(paths)
    for path in paths:
        async with http.get(path) as got:
            await got.read()
        async with http.head(path) as head:
            assert await head.read() == b"", path
        assert head.status == got.status, (path, head.status, got.status)
        assert head.headers.get("Content-Type") == got.headers.get("Content-Type"), path
        assert head.headers["Cache-Control"] == "no-store", path
        if path == f"/sessions/{sid}":
            continue  # no token is minted for a HEAD: test_rest_contract_more.py
        assert ("Content-Length" in head.headers) == ("Content-Length" in got.headers), path
        if path in STABLE:
            assert head.headers["Content-Length"] == got.headers["Content-Length"], path


async def test_a_head_without_the_key_is_refused_as_the_get_is_without_a_body(
    daemon: Daemon,
) -> None:
    async with aiohttp.ClientSession(base_url=daemon.base_url) as anyone:
        async with anyone.get("/sessions") as got:
            body = await got.read()
        async with anyone.head("/sessions") as head:
            assert await head.read() == b""
        assert head.status == got.status == 401
        assert head.headers["WWW-Authenticate"] == got.headers["WWW-Authenticate"] == "Bearer"
        assert head.headers["Content-Type"] == "application/json; charset=utf-8"
        assert head.headers["Content-Length"] == str(len(body))
        # a public GET's HEAD needs no key either
        async with anyone.head("/health") as health:
            assert health.status == 200 and await health.read() == b""


async def test_a_head_with_a_foreign_host_is_refused_as_the_get_is(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    async with http.head("/health", headers={"Host": f"evil.example:{daemon.port}"}) as r:
        assert r.status == 403 and await r.read() == b""


async def test_a_head_to_an_unknown_path_is_404_and_a_navigating_browser_gets_the_pages_head(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    async with http.head("/no/such/path") as r:
        assert r.status == 404 and r.headers["Content-Type"].startswith("application/json")
    async with aiohttp.ClientSession(base_url=daemon.base_url) as browser:
        navigate = {"Sec-Fetch-Mode": "navigate"}
        async with browser.get("/no/such/path", headers=navigate) as got:
            await got.read()
        async with browser.head("/no/such/path", headers=navigate) as head:
            assert await head.read() == b""
    assert head.status == got.status == 404
    assert head.headers["Content-Type"] == got.headers["Content-Type"]
    assert head.headers["Content-Length"] == got.headers["Content-Length"]


async def test_a_head_on_the_websocket_route_is_426_and_spends_no_attach_token(
    daemon: Daemon, http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    sid = (await api.create_session(workspace))["id"]
    _, got = await api.call("GET", f"/sessions/{sid}")
    token = got["attach_token"]
    async with http.head(f"/sessions/{sid}/stream?attach={token}") as r:
        assert r.status == 426 and await r.read() == b""
    ws = await http.ws_connect(got["ws_url"])  # the token still attaches
    try:
        await ws.send_json({"type": "subscribe"})
        assert (await ws.receive_json(timeout=5))["type"] == "subscribe_ack"
    finally:
        await ws.close()


async def test_a_head_on_the_login_link_is_405_and_leaves_the_token_unspent(
    daemon: Daemon,
) -> None:
    url = daemon.login_url()
    async with aiohttp.ClientSession() as browser:
        async with browser.head(url, allow_redirects=False) as r:
            # no key: refused before routing, as any method a route does not serve
            assert r.status == 401 and "Location" not in r.headers
        async with api_session(daemon) as keyed, keyed.head(url, allow_redirects=False) as r:
            assert r.status == 405 and r.headers["Allow"] == "GET"
            assert "Location" not in r.headers
        async with browser.get(url, allow_redirects=False) as r:
            assert r.status == 303  # the token was not spent by the HEADs
