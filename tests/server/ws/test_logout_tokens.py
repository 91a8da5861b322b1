"""Attach tokens a browser session was given stop working when it logs out.

A logout closes the sockets the browser session opened (1008 `logged_out`); a token it was
given but had not used yet must not open one afterwards, or a tab that did not follow the
logout (say, one reconnecting at that moment) would go on receiving the session's events.
Real daemon, real login flow, real aiohttp WebSocket client.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from metis.server.runner import Daemon
from tests.api import Api, api_session, browser_secret_of, key_headers


async def _browser_secret(daemon: Daemon) -> str:
    async with (
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
        http.get(daemon.login_url(), allow_redirects=False) as r,
    ):
        assert r.status == 303, await r.text()
        return browser_secret_of(r.headers["Location"])


async def test_a_token_given_before_a_logout_no_longer_opens_a_socket(
    daemon: Daemon, workspace: Path
) -> None:
    async with api_session(daemon) as keyed:
        session_id = (await Api(keyed).create_session(workspace))["id"]
        kept_url = (await Api(keyed).call("GET", f"/sessions/{session_id}"))[1]["ws_url"]
    secret = await _browser_secret(daemon)
    async with aiohttp.ClientSession(base_url=daemon.base_url, headers=key_headers(secret)) as http:
        page = Api(http)
        status, body = await page.call("GET", f"/sessions/{session_id}")
        assert status == 200
        unused = body["ws_url"]
        status, _ = await page.call("POST", "/logout", headers={"Origin": daemon.base_url})
        assert status == 200
    async with aiohttp.ClientSession() as anyone:
        try:
            ws = await anyone.ws_connect(unused)
        except aiohttp.WSServerHandshakeError as refused:
            assert refused.status == 401
        else:
            await ws.close()
            raise AssertionError("a token given to a logged-out browser session opened a socket")
        ws = await anyone.ws_connect(kept_url)  # a token the key's request got still works
        await ws.close()
