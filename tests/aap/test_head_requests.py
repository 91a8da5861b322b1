"""HEAD on the AAP surface: every GET route answers it through the AAP pipeline (CORS, auth,
the AAP envelope's status) with the GET's headers and no body."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from multidict import CIMultiDictProxy

from metis.server.runner import Daemon
from tests.aap.client import AapClient

ORIGIN = "http://app.example:4173"


async def head(
    client: AapClient, path: str, *, auth: bool = True, headers: dict[str, str] | None = None
) -> tuple[int, CIMultiDictProxy[str], bytes]:
    """A HEAD's status, headers and the bytes that came after them (none are due)."""
    sent = {**(client.auth() if auth else {}), **(headers or {})}
    async with client.http.head(client.base + path, headers=sent) as r:
        return r.status, r.headers, await r.read()


async def test_every_aap_get_route_answers_head_with_the_gets_status_and_headers(
    daemon_and_aap: tuple[Daemon, AapClient],
) -> None:
    _, aap = daemon_and_aap
    sid = await aap.create()
    for client, path in (
        (aap, "/meta"),
        (aap, "/sessions"),
        (aap, f"/sessions/{sid}"),
        (aap, f"/sessions/{sid}/history"),
        (aap.v1, "/meta"),
        (aap.v1, "/sessions"),
        (aap.v1, f"/session/{sid}"),
        (aap, "/sessions/sess_01M7YA76RDGJRJS6TX6XK99B3P"),  # 404 session_not_found
    ):
        got = await client.request("GET", path)
        status, headers, body = await head(client, path)
        where = (client.base, path)
        assert status == got.status and body == b"", where
        assert headers["Content-Type"] == got.headers["Content-Type"], where
        assert headers["Content-Length"] == got.headers["Content-Length"], where


async def test_an_aap_head_without_the_key_is_401_with_the_challenge_and_no_body(
    aap: AapClient,
) -> None:
    got = await aap.request("GET", "/sessions", auth=False)
    status, headers, body = await head(aap, "/sessions", auth=False)
    assert status == got.status == 401 and body == b""
    assert headers["WWW-Authenticate"] == got.headers["WWW-Authenticate"]
    assert headers["Content-Length"] == got.headers["Content-Length"]
    # /meta is public, as its GET
    assert (await head(aap, "/meta", auth=False))[0] == 200


async def test_an_aap_head_carries_the_cors_headers_of_an_allowed_origin(
    start_daemon: Callable[..., Any], client_for: Callable[..., Any]
) -> None:
    d = await start_daemon(aap={"cors_origins": [ORIGIN]})
    aap = await client_for(d)
    status, headers, _ = await head(aap, "/sessions", headers={"Origin": ORIGIN})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == ORIGIN


async def test_a_405_on_an_aap_get_path_lists_head(aap: AapClient) -> None:
    reply = await aap.request("PATCH", "/meta", {})
    assert reply.status == 405
    assert reply.headers["Allow"] == "GET, HEAD, OPTIONS"
    assert reply.body["error"]["details"]["allowed"] == ["GET", "HEAD", "OPTIONS"]
