"""No one drives the metis surface without the daemon's key (metis/server/auth.py).

The route matrix walks the app's own router, so a route added later is covered without editing
this file. Everything runs against a real daemon on loopback with real HTTP and WebSocket clients.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from metis.server.auth import SESSIONS_FILE
from metis.server.http import ROUTE_SPEC_KEY
from metis.server.runner import Daemon
from tests.api import Api, api_session, auth_headers, browser_secret_of, key_headers
from tests.ws_client import Closed, Ws

NEVER = "sess_01M7YA76RDGJRJS6TX6XK99B3P"  # well-formed, never created
SAMPLES = {
    "session_id": NEVER,
    "turn_id": "01M7YA76RDGJRJS6TX6XK99B3Q",
    "request_id": "toolu_01",
    "model": "haiku",
    "name": "app.css",
}
# Served without the key: liveness, the API description, the login exchange (which needs its
# one-time token instead) and the dashboard's page and files (no data: without a session the
# page says how to log in). Everything else needs the key or a browser session's secret.
PUBLIC = {
    ("GET", "/health"),
    ("GET", "/openapi.json"),
    ("GET", "/login"),
    ("GET", "/"),
    ("GET", "/static/{name}"),
}
SERVED_TO_ANYONE = PUBLIC - {("GET", "/login")}
# Minting a login URL takes the key itself: a browser session cannot extend itself.
KEY_ONLY = {("POST", "/login/tokens")}
STREAM = ("GET", "/sessions/{session_id}/stream")  # authorised by its attach token
WRITES = {"POST", "PATCH", "PUT", "DELETE"}


def metis_routes(d: Daemon) -> list[tuple[str, str]]:
    """(method, path template) of every metis route in the app's router (AAP has its own)."""
    out = set()
    for resource in d.app.router.resources():
        if isinstance(resource, web.PrefixedSubAppResource):
            continue  # /aap and /aap/v1: the AAP key tests (tests/aap/test_pipeline.py)
        for route in resource:
            out.add((route.method, resource.canonical))
    return sorted(out)


def canonical(path: str) -> str:
    """A route path as the router's canonical form spells it (`{name:.+}` → `{name}`)."""
    return re.sub(r"{(\w+):[^}]+}", r"{\1}", path)


def concrete(template: str) -> str:
    return re.sub(r"{(\w+)}", lambda m: SAMPLES[m.group(1)], template)


# Writes the logout route would make: it ends the very session the route matrix walks with.
REVOKES = {("POST", "/logout")}


def jar() -> aiohttp.CookieJar:
    return aiohttp.CookieJar(unsafe=True)  # aiohttp's default jar ignores cookies of IP hosts


async def login_as_browser(d: Daemon) -> str:
    """A browser session's secret, from a login URL's redirect (never the key)."""
    async with (
        aiohttp.ClientSession(cookie_jar=jar()) as http,
        http.get(d.login_url(), allow_redirects=False) as r,
    ):
        assert r.status == 303, await r.text()
        assert not r.cookies and "Set-Cookie" not in r.headers  # no cookie, ever
        return browser_secret_of(r.headers["Location"])


async def browser_of(d: Daemon) -> aiohttp.ClientSession:
    """A client sending a browser session's secret as its bearer header, as the page does."""
    return aiohttp.ClientSession(headers=key_headers(await login_as_browser(d)))


async def call(
    http: aiohttp.ClientSession, d: Daemon, method: str, path: str, **kw: Any
) -> tuple[int, dict[str, str], Any]:
    async with http.request(method, d.base_url + path, allow_redirects=False, **kw) as r:
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, dict(r.headers), body


def assert_unauthorized(
    status: int, headers: dict[str, str], body: Any, where: Any, *, head: bool = False
) -> None:
    assert status == 401, (where, status, body)
    assert headers.get("WWW-Authenticate") == "Bearer", where
    if head:  # the GET's refusal without its body
        assert body is None and headers["Content-Type"].startswith("application/json"), where
        return
    assert body["error"]["code"] == "unauthorized" and body["error"]["details"] == {}, where
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], where


@pytest.fixture
async def closing() -> AsyncIterator[Callable[[aiohttp.ClientSession], aiohttp.ClientSession]]:
    opened: list[aiohttp.ClientSession] = []

    def keep(http: aiohttp.ClientSession) -> aiohttp.ClientSession:
        opened.append(http)
        return http

    yield keep
    for http in opened:
        await http.close()


# ---- the route matrix ---------------------------------------------------------------------


async def test_the_router_has_exactly_the_expected_public_routes(daemon: Daemon) -> None:
    mapping = daemon.app[ROUTE_SPEC_KEY]
    specs = mapping.values()
    routes = set(metis_routes(daemon))
    # every entry comes from a route table; a HEAD route is its GET's, every GET has one but
    # the login exchange's (a HEAD must not spend the one-time token)
    assert {(route.method, canonical(s.path)) for route, s in mapping.items()} == routes
    assert all(s.method == "GET" for route, s in mapping.items() if route.method == "HEAD")
    heads = {("HEAD", path) for method, path in routes if method == "GET"} - {("HEAD", "/login")}
    assert {r for r in routes if r[0] == "HEAD"} == heads
    assert {(s.method, canonical(s.path)) for s in specs if s.public} == PUBLIC
    assert routes >= KEY_ONLY
    assert STREAM in routes


@pytest.mark.parametrize("credential", ["none", "wrong key", "empty bearer", "basic scheme"])
async def test_every_route_refuses_a_request_without_the_key(
    daemon: Daemon, credential: str, closing: Any
) -> None:
    headers = {
        "none": {},
        "wrong key": key_headers("not-the-key-" + "x" * 32),
        "empty bearer": {"Authorization": "Bearer "},
        "basic scheme": {"Authorization": f"Basic {daemon.state.auth.api_key.value}"},
    }[credential]
    http = closing(aiohttp.ClientSession(headers=headers))
    checked = 0
    for method, template in metis_routes(daemon):
        as_get = ("GET" if method == "HEAD" else method, template)
        if as_get == STREAM:
            continue  # test_the_websocket_is_authorised_by_its_attach_token
        body = {} if method in WRITES else None
        status, resp_headers, payload = await call(
            http, daemon, method, concrete(template), json=body
        )
        if as_get in SERVED_TO_ANYONE:
            assert status == 200, (method, template, payload)
            continue
        assert_unauthorized(
            status,
            resp_headers,
            payload,
            (credential, method, template),
            head=method == "HEAD",
        )
        checked += 1
    assert checked >= 15
    # an unknown path says nothing about what exists either
    status, resp_headers, payload = await call(http, daemon, "GET", "/no/such/path")
    assert_unauthorized(status, resp_headers, payload, "unknown path")


@pytest.mark.parametrize("credential", ["key", "browser"])
async def test_every_route_serves_the_key_and_a_browser_session(
    daemon: Daemon, credential: str, closing: Any
) -> None:
    if credential == "key":
        http = closing(aiohttp.ClientSession(headers=auth_headers(daemon)))
    else:
        http = closing(await browser_of(daemon))
    for method, template in metis_routes(daemon):
        if (method, template) in {STREAM, ("GET", "/login")}:
            continue  # the stream takes an attach token; /login a one-time token
        if credential == "browser" and (method, template) in KEY_ONLY | REVOKES:
            continue  # test_only_the_key_mints_a_login_url, test_logout_ends_the_session…
        headers = {"Origin": daemon.base_url} if method in WRITES else {}
        body = {} if method in WRITES else None
        status, _, payload = await call(
            http, daemon, method, concrete(template), json=body, headers=headers
        )
        assert status not in (401, 403), (credential, method, template, status, payload)
        assert status < 500, (credential, method, template, payload)


# ---- the login URL and the browser session ------------------------------------------------


async def test_a_login_token_is_single_use_and_hands_its_secret_in_the_url_fragment(
    daemon: Daemon, closing: Any
) -> None:
    url = daemon.login_url()
    key = daemon.state.auth.api_key.value
    assert url.startswith(daemon.base_url + "/login?token=") and key not in url
    http = closing(aiohttp.ClientSession(cookie_jar=jar()))
    status, headers, _ = await call(http, daemon, "GET", url.removeprefix(daemon.base_url))
    assert status == 303 and "Set-Cookie" not in headers and len(http.cookie_jar) == 0
    assert headers["Referrer-Policy"] == "no-referrer" and headers["Cache-Control"] == "no-store"
    secret = browser_secret_of(headers["Location"])  # `/#login=<secret>`: never sent to a server
    token = url.split("token=", 1)[1]
    assert secret not in (token, key)
    # the secret authenticates as a bearer header; the token does not work twice
    assert (await call(http, daemon, "GET", "/sessions", headers=key_headers(secret)))[0] == 200
    again = closing(aiohttp.ClientSession(cookie_jar=jar()))
    assert_unauthorized(*await call(again, daemon, "GET", "/login?token=" + token), "reused")
    assert_unauthorized(*await call(again, daemon, "GET", "/sessions"), "no credential")


async def test_a_session_cookie_is_not_a_credential(daemon: Daemon, closing: Any) -> None:
    # cookies are not port-scoped: every listener on 127.0.0.1 would get one, so none counts,
    # not even one holding a valid session's secret under the name the daemon once used
    secret = await login_as_browser(daemon)
    for name in (f"metis_session_{daemon.port}", "metis_session"):
        replayed = closing(aiohttp.ClientSession(cookies={name: secret}))
        status, headers, body = await call(
            replayed,
            daemon,
            "POST",
            "/sessions",
            json={"workspace_path": "/tmp"},
            headers={"Origin": daemon.base_url},
        )
        assert_unauthorized(status, headers, body, name)
        assert_unauthorized(*await call(replayed, daemon, "GET", "/sessions"), name)


async def test_wrong_missing_and_expired_login_tokens_are_refused(
    start_daemon: Callable[..., Any], closing: Any
) -> None:
    d = await start_daemon(auth={"login_token_ttl_s": 0.2})
    http = closing(aiohttp.ClientSession(cookie_jar=jar()))
    expired = d.login_url()
    key = d.state.auth.api_key.value
    for path in ("/login", "/login?token=", "/login?token=guess", f"/login?token={key}"):
        assert_unauthorized(*await call(http, d, "GET", path), path)
    await asyncio.sleep(0.3)
    assert_unauthorized(*await call(http, d, "GET", expired.removeprefix(d.base_url)), "expired")
    assert_unauthorized(*await call(http, d, "GET", "/sessions"), "no session was opened")
    fresh = d.login_url()
    assert (await call(http, d, "GET", fresh.removeprefix(d.base_url)))[0] == 303
    assert len(http.cookie_jar) == 0


async def test_a_browser_session_expires(start_daemon: Callable[..., Any], closing: Any) -> None:
    d = await start_daemon(auth={"browser_session_ttl_s": 0.3})
    http = closing(await browser_of(d))
    assert (await call(http, d, "GET", "/sessions"))[0] == 200
    await asyncio.sleep(0.4)
    assert_unauthorized(*await call(http, d, "GET", "/sessions"), "expired session")


async def test_only_the_key_mints_a_login_url(daemon: Daemon, closing: Any) -> None:
    keyed = closing(aiohttp.ClientSession(headers=auth_headers(daemon)))
    status, _, body = await call(keyed, daemon, "POST", "/login/tokens")
    assert status == 201, body
    assert set(body) == {"url", "expires_at"}
    assert body["url"].startswith(daemon.base_url + "/login?token=")
    assert daemon.state.auth.api_key.value not in body["url"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", body["expires_at"])
    anonymous = closing(aiohttp.ClientSession())
    status, headers, _ = await call(
        anonymous, daemon, "GET", body["url"].removeprefix(daemon.base_url)
    )
    assert status == 303
    secret = browser_secret_of(headers["Location"])
    browser = closing(aiohttp.ClientSession(headers=key_headers(secret)))
    assert (await call(browser, daemon, "GET", "/sessions"))[0] == 200
    # a browser session cannot mint itself new ones, not even from the daemon's own Origin
    refused = await call(
        browser, daemon, "POST", "/login/tokens", headers={"Origin": daemon.base_url}
    )
    assert_unauthorized(*refused, "a browser session mints")


async def test_browser_sessions_survive_a_restart_and_are_stored_as_keyed_digests(
    start_daemon: Callable[..., Any], metis_home: Path, closing: Any
) -> None:
    first = await start_daemon()
    secret = await login_as_browser(first)
    key = first.state.auth.api_key.value
    stored = metis_home / SESSIONS_FILE
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    text = stored.read_text()
    assert json.loads(text)["format"] == 2
    assert secret not in text and hashlib.sha256(secret.encode()).hexdigest() not in text
    keyed = hmac.new(key.encode(), b"metis browser session\0" + secret.encode(), "sha256")
    assert keyed.hexdigest() in text
    await first.stop()
    second = await start_daemon()
    again = closing(aiohttp.ClientSession(headers=key_headers(secret)))
    assert (await call(again, second, "GET", "/sessions"))[0] == 200
    forged = closing(aiohttp.ClientSession(headers=key_headers("x" * 43)))
    assert_unauthorized(*await call(forged, second, "GET", "/sessions"), "forged")


async def test_a_new_key_ends_every_browser_session(
    start_daemon: Callable[..., Any], metis_home: Path, closing: Any
) -> None:
    first = await start_daemon()
    secret = await login_as_browser(first)
    await first.stop()
    (metis_home / "api_key").write_text("a-rotated-key-" + "k" * 32 + "\n")  # rotated
    second = await start_daemon()
    assert second.state.auth.api_key.value.startswith("a-rotated-key-")
    old = closing(aiohttp.ClientSession(headers=key_headers(secret)))
    assert_unauthorized(*await call(old, second, "GET", "/sessions"), "minted by the old key")
    fresh = closing(await browser_of(second))
    assert (await call(fresh, second, "GET", "/sessions"))[0] == 200


async def test_logout_ends_the_session_at_once_and_for_good(
    start_daemon: Callable[..., Any], closing: Any
) -> None:
    d = await start_daemon()
    secret = await login_as_browser(d)
    other = closing(await browser_of(d))  # another browser's session is not touched
    http = closing(aiohttp.ClientSession(headers=key_headers(secret)))
    # a write like any other: a browser session needs the daemon's own Origin
    evil = {"Origin": "http://evil.example"}
    status, _, body = await call(http, d, "POST", "/logout", headers=evil)
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"
    status, _, body = await call(http, d, "POST", "/logout", headers={"Origin": d.base_url})
    assert (status, body) == (200, {"revoked": True})
    assert_unauthorized(*await call(http, d, "GET", "/sessions"), "after logout")
    await d.stop()
    again = await start_daemon()  # revoked on disk too, not only in memory
    assert_unauthorized(*await call(http, again, "GET", "/sessions"), "after a restart")
    assert (await call(other, again, "GET", "/sessions"))[0] == 200
    keyed = closing(aiohttp.ClientSession(headers=auth_headers(again)))
    status, _, body = await call(keyed, again, "POST", "/logout")
    assert (status, body) == (200, {"revoked": False})  # the key has no session to end


async def test_logout_closes_the_sockets_its_browser_session_opened_and_no_others(
    daemon: Daemon, closing: Any, workspace: Path
) -> None:
    """A socket is authorised once, at its upgrade: a tab that did not follow the logout must
    not keep receiving its session's events."""

    async def browser() -> Api:
        secret = await login_as_browser(daemon)
        return Api(
            closing(aiohttp.ClientSession(base_url=daemon.base_url, headers=key_headers(secret)))
        )

    page, other = await browser(), await browser()  # the second: another browser's
    script = Api(closing(api_session(daemon)))
    session_id = (await script.create_session(workspace))["id"]
    sockets = [(await Ws.subscribed(api, session_id))[0] for api in (page, page, other, script)]
    status, body = await page.call("POST", "/logout", headers={"Origin": daemon.base_url})
    assert (status, body) == (200, {"revoked": True})
    for socket in sockets[:2]:  # both of its tabs
        with pytest.raises(Closed) as closed:
            await socket.until(lambda _: False)
        assert closed.value.code == 1008 and closed.value.reason is not None
        assert closed.value.reason["code"] == "logged_out"
    status, accepted = await script.submit(session_id, "still here?")
    assert status == 202, accepted
    for socket in sockets[2:]:  # the other browser's and the key's still follow the session
        await socket.until(
            lambda f: f.get("type") == "event" and f["event"]["type"] == "turn.completed"
        )


async def test_expired_or_unreadable_stored_sessions_are_not_restored(
    start_daemon: Callable[..., Any],
    metis_home: Path,
    closing: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = await start_daemon(auth={"browser_session_ttl_s": 0.3})
    secret = await login_as_browser(first)
    await first.stop()
    await asyncio.sleep(0.4)
    second = await start_daemon()
    expired = closing(aiohttp.ClientSession(headers=key_headers(secret)))
    assert_unauthorized(*await call(expired, second, "GET", "/sessions"), "expired")
    await second.stop()
    (metis_home / SESSIONS_FILE).write_text("{not json")
    with caplog.at_level(logging.WARNING):
        third = await start_daemon()
    assert "browser sessions not restored" in caplog.text
    fresh = closing(await browser_of(third))  # and logging in rewrites the file
    assert (await call(fresh, third, "GET", "/sessions"))[0] == 200
    assert json.loads((metis_home / SESSIONS_FILE).read_text())["format"] == 2


async def test_a_forged_or_spent_browser_secret_is_refused(daemon: Daemon, closing: Any) -> None:
    forged = closing(aiohttp.ClientSession(headers=key_headers("x" * 43)))
    assert_unauthorized(*await call(forged, daemon, "GET", "/sessions"), "forged")
    token = daemon.login_url().split("token=", 1)[1]
    spent = closing(aiohttp.ClientSession(headers=key_headers(token)))  # a login token is not one
    assert_unauthorized(*await call(spent, daemon, "GET", "/sessions"), "login token")


async def test_browser_session_writes_need_the_daemons_own_origin(
    start_daemon: Callable[..., Any], workspace: Path, closing: Any
) -> None:
    extra = "http://localhost:5173"  # allowed for key holders, not for browser-session writes
    d = await start_daemon(allowed_origins=[extra])
    http = closing(await browser_of(d))
    body = {"workspace_path": str(workspace)}
    for origin in (None, "http://evil.example", "null", extra, "http://127.0.0.1:1"):
        headers = {} if origin is None else {"Origin": origin}
        status, _, payload = await call(http, d, "POST", "/sessions", json=body, headers=headers)
        assert status == 403 and payload["error"]["code"] == "origin_not_allowed", (origin, payload)
    assert (await call(http, d, "GET", "/sessions"))[2]["sessions"] == []  # nothing was created
    status, _, created = await call(
        http, d, "POST", "/sessions", json=body, headers={"Origin": d.base_url}
    )
    assert status == 201, created
    localhost = f"http://localhost:{d.port}"
    status, _, _ = await call(
        http, d, "DELETE", f"/sessions/{created['id']}", headers={"Origin": localhost}
    )
    assert status == 200
    # a key holder keeps the existing rule: no Origin, or an allowed one
    keyed = closing(aiohttp.ClientSession(headers=auth_headers(d)))
    for headers in ({}, {"Origin": extra}):
        status, _, payload = await call(keyed, d, "POST", "/sessions", json=body, headers=headers)
        assert status == 201, payload


# ---- the WebSocket ------------------------------------------------------------------------


async def test_the_websocket_is_authorised_by_its_attach_token(
    daemon: Daemon, workspace: Path, closing: Any
) -> None:
    async with api_session(daemon) as keyed:
        created = await Api(keyed).create_session(workspace)
    sid = created["id"]
    anonymous = closing(aiohttp.ClientSession())
    # the token endpoint needs the key: no token, no attach
    status, headers, body = await call(anonymous, daemon, "GET", f"/sessions/{sid}")
    assert_unauthorized(status, headers, body, "token endpoint")
    assert "attach_token" not in str(body)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await anonymous.ws_connect(f"{daemon.base_url}/sessions/{sid}/stream")
    assert refused.value.status == 401  # attach_token_invalid
    # a key holder obtains a token; the socket itself needs no key, and the URL holds none
    async with api_session(daemon) as keyed:
        status, got = await Api(keyed).call("GET", f"/sessions/{sid}")
    assert status == 200 and daemon.state.auth.api_key.value not in got["ws_url"]
    ws = await anonymous.ws_connect(got["ws_url"])
    try:
        await ws.send_json({"type": "subscribe"})
        frame = await asyncio.wait_for(ws.receive_json(), 5)
        assert frame["type"] == "subscribe_ack", frame
    finally:
        await ws.close()
    # single use: the same URL does not attach twice
    with pytest.raises(aiohttp.WSServerHandshakeError) as reused:
        await anonymous.ws_connect(got["ws_url"])
    assert reused.value.status == 401


# ---- auth.required: false -------------------------------------------------------------------


async def test_auth_required_false_serves_without_the_key_and_warns_once(
    start_daemon: Callable[..., Any],
    workspace: Path,
    caplog: pytest.LogCaptureFixture,
    closing: Any,
) -> None:
    with caplog.at_level(logging.WARNING):
        d = await start_daemon(auth={"required": False})
    warnings = [r for r in caplog.records if "auth.required is false" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    anonymous = Api(closing(aiohttp.ClientSession(base_url=d.base_url)))
    created = await anonymous.create_session(workspace)
    status, got = await anonymous.call("GET", f"/sessions/{created['id']}")
    assert status == 200 and got["attach_token"]
    assert (await anonymous.call("GET", "/server/version"))[0] == 200
    # AAP keeps its key
    status, body = await anonymous.call("GET", "/aap/sessions")
    assert status == 401 and body["error"]["code"] == "unauthorized"
    status, _ = await anonymous.call("GET", "/aap/sessions", headers=auth_headers(d))
    assert status == 200


async def test_no_warning_when_auth_is_required(
    start_daemon: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        await start_daemon()
    assert "auth.required" not in caplog.text


# ---- the key stays secret; the API description declares it ---------------------------------


async def test_the_key_is_never_logged(
    daemon: Daemon, caplog: pytest.LogCaptureFixture, closing: Any
) -> None:
    key = daemon.state.auth.api_key.value
    with caplog.at_level(logging.DEBUG):
        http = closing(aiohttp.ClientSession())
        for headers in (auth_headers(daemon), key_headers(key + "x"), key_headers(key[:-1])):
            await call(http, daemon, "GET", "/sessions", headers=headers)
            await call(http, daemon, "POST", "/sessions", headers=headers, data=b"{bad")
        await call(http, daemon, "GET", daemon.login_url().removeprefix(daemon.base_url))
    assert caplog.records and key not in caplog.text and key[:-1] not in caplog.text


async def test_openapi_declares_the_bearer_scheme(daemon: Daemon) -> None:
    async with aiohttp.ClientSession() as http:  # public: no key
        status, _, doc = await call(http, daemon, "GET", "/openapi.json")
    assert status == 200
    scheme = doc["components"]["securitySchemes"]["metisBearer"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    for method, template in metis_routes(daemon):
        if method == "HEAD":
            continue  # not an operation of its own: every GET's (docs/api.md)
        op = doc["paths"][template][method.lower()]
        if (method, template) in PUBLIC or (method, template) == STREAM:
            assert op["security"] == [], template
        else:
            assert op["security"] == [{"metisBearer": []}], template
            assert "unauthorized" in op["x-error-codes"] and "401" in op["responses"], template
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert doc["paths"]["/aap/sessions"]["get"]["security"] == [{"aapBearer": []}]
    # every AAP operation says whether it needs the key: `/meta` of both versions does not
    for path, operations in doc["paths"].items():
        if path.startswith("/aap"):
            for method, op in operations.items():
                public = method == "options" or path.endswith("/meta")
                assert op["security"] == ([] if public else [{"aapBearer": []}]), (path, method)


# ---- paths the router does not hand to AAP ---------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/aap%2Fsessions", "/aap%2fv1%2Fsessions", "/aap%2F..%2Fsessions"]
)
async def test_an_encoded_slash_after_aap_is_an_unknown_metis_path(
    daemon: Daemon, path: str, closing: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # decoded, the path reads `/aap/…`; the router keeps `%2F` and matches no AAP route, so the
    # metis guards apply: 401 without the key, 404 with it, and nothing logged as an error
    url = URL(daemon.base_url + path, encoded=True)
    anonymous = closing(aiohttp.ClientSession())
    keyed = closing(aiohttp.ClientSession(headers=auth_headers(daemon)))
    with caplog.at_level(logging.INFO):
        async with anonymous.get(url) as r:
            assert_unauthorized(r.status, dict(r.headers), await r.json(), path)
        async with keyed.get(url) as r:
            body = await r.json()
            assert r.status == 404 and body["error"]["code"] == "route_not_found", body
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text


async def test_a_wider_sessions_file_is_tightened_at_start(
    start_daemon: Callable[..., Any], metis_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metis_home.mkdir(parents=True, exist_ok=True)
    stored = metis_home / SESSIONS_FILE
    stored.write_text('{"format":1,"sessions":{}}')
    stored.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        await start_daemon()
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert "tightened to 0600" in caplog.text
