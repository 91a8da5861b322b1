"""More REST contract items against the real daemon and its real SQLite file (no mocks of metis).

- message paging: ≥ 230 messages walked both ways with `limit=50`,
  each seen exactly once, `has_more_*` right on the oldest, newest and empty pages.
- events paging: a cursor walk over ≥ 250 events with `limit=100`, each event once,
  in seq order; `next_cursor` non-null iff another row matches (also on an exact boundary).
- 415 on the optional-body routes (cancel, `/routing/check`), with
  `details.content_type`; an empty body with any Content-Type is no body and passes.
- `PUT /sessions` and `OPTIONS /health` → 405 with `Allow` and
  `details.allowed`; `HEAD /sessions/{id}` → 200 and mints no attach token.
- after a purge, every metis route for the id and the upgrade
  → 404 `session_not_found`; so is every AAP route; the SQLite file has no row left for the id
  (`aap_message_forms` and `aap_sessions` included).
- messages of a session that never existed → 404, never an empty 200.

The ground truth for "every message / every event" is read from the SQLite file through a
separate read-only connection, not from the API under test.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.server.runner import Daemon
from tests.aap.client import AapClient
from tests.aap.conftest import KEY, roots
from tests.api import Api, api_session
from tests.server.test_sessions_api import HOLD, hold_turn

NEVER = "sess_01M7YA76RDGJRJS6TX6XK99B3P"  # well-formed, never created
ULID_MIN = "00000000000000000000000000"
ULID_MAX = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"
SESSION_TABLES = (
    ("sessions", "id"),
    ("messages", "session_id"),
    ("turns", "session_id"),
    ("events", "session_id"),
    ("tool_calls", "session_id"),
    ("confirmations", "session_id"),
    ("aap_sessions", "session_id"),
    ("aap_message_forms", "session_id"),
)


# ---- helpers ------------------------------------------------------------------------------------


def read_db(metis_home: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows from the daemon's SQLite file over a separate read-only connection."""
    path = metis_home / "metis.db"
    assert path.exists(), path
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def counts_by_table(metis_home: Path, session_id: str) -> dict[str, int]:
    return {
        table: read_db(metis_home, f"SELECT COUNT(*) FROM {table} WHERE {column}=?", (session_id,))[
            0
        ][0]
        for table, column in SESSION_TABLES
    }


async def run_turns(api: Api, session_id: str, texts: list[str]) -> list[dict[str, Any]]:
    """Submit the turns one after the other; each must complete."""
    accepted: list[dict[str, Any]] = []
    for text in texts:
        status, body = await api.submit(session_id, text)
        assert status == 202, body
        accepted.append(body)
        ended = await api.wait_turn(session_id, body["turn_id"])
        assert ended["type"] == "turn.completed", ended
    return accepted


def assert_error(status: int, body: Any, http: int, code: str) -> dict[str, Any]:
    assert status == http, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str)
    return body["error"]["details"]


@pytest.fixture
async def api(start_daemon: Callable[..., Any]) -> AsyncIterator[tuple[Daemon, Api]]:
    d = await start_daemon()
    async with api_session(d) as http:
        yield d, Api(http)


# ---- 1. message paging ---------------------------------------------------------------------------


async def test_230_plus_messages_walk_both_ways_exactly_once_with_correct_flags(
    api: tuple[Daemon, Api], workspace: Path, metis_home: Path
) -> None:
    _, client = api
    (workspace / "metis-demo.txt").write_text("a file for read_file\n")
    sid = (await client.create_session(workspace))["id"]
    # Each "use server tool" turn stores 4 messages: user, assistant(tool_use), tool, assistant.
    accepted = await run_turns(client, sid, [f"use server tool {i}" for i in range(58)])

    truth = [
        row[0]
        for row in read_db(
            metis_home, "SELECT id FROM messages WHERE session_id=? ORDER BY id", (sid,)
        )
    ]
    assert len(truth) == 232 and len(set(truth)) == 232
    roles = [
        row[0]
        for row in read_db(
            metis_home, "SELECT role FROM messages WHERE session_id=? ORDER BY id", (sid,)
        )
    ]
    assert roles == ["user", "assistant", "tool", "assistant"] * 58
    assert [truth[4 * i] for i in range(58)] == [a["user_message_id"] for a in accepted]

    def ids(page: dict[str, Any]) -> list[str]:
        got = [m["id"] for m in page["messages"]]
        assert got == sorted(got), "a page is always in ascending id order"
        assert all(m["session_id"] == sid for m in page["messages"])
        return got

    # Backwards from the newest page with `before`.
    pages: list[list[str]] = []
    page = await client.messages(sid, limit=50)
    pages.append(ids(page))
    assert page["has_more_after"] is False and page["has_more_before"] is True
    while page["has_more_before"]:
        page = await client.messages(sid, limit=50, before=pages[-1][0])
        pages.append(ids(page))
        if page["has_more_before"]:
            assert page["has_more_after"] is True and len(pages[-1]) == 50
    assert [len(p) for p in pages] == [50, 50, 50, 50, 32]
    oldest = page
    assert oldest["has_more_before"] is False and oldest["has_more_after"] is True
    backward = [i for p in reversed(pages) for i in p]
    assert backward == truth  # every message once, in order

    # The empty page at the `before` end, judged against the cursor.
    empty = await client.messages(sid, limit=50, before=truth[0])
    assert empty == {"messages": [], "has_more_before": False, "has_more_after": True}
    empty = await client.messages(sid, limit=50, before=ULID_MIN)
    assert empty == {"messages": [], "has_more_before": False, "has_more_after": True}

    # Forwards from before the oldest with `after`.
    pages = []
    page = await client.messages(sid, limit=50, after=ULID_MIN)
    pages.append(ids(page))
    assert page["has_more_before"] is False and page["has_more_after"] is True
    while page["has_more_after"]:
        page = await client.messages(sid, limit=50, after=pages[-1][-1])
        pages.append(ids(page))
        if page["has_more_after"]:
            assert page["has_more_before"] is True and len(pages[-1]) == 50
    assert [len(p) for p in pages] == [50, 50, 50, 50, 32]
    newest = page
    assert newest["has_more_after"] is False and newest["has_more_before"] is True
    assert [i for p in pages for i in p] == truth

    # The empty page at the `after` end, judged against the cursor.
    empty = await client.messages(sid, limit=50, after=truth[-1])
    assert empty == {"messages": [], "has_more_before": True, "has_more_after": False}
    empty = await client.messages(sid, limit=50, after=ULID_MAX)
    assert empty == {"messages": [], "has_more_before": True, "has_more_after": False}

    # A cursor that names no message: the nearest `limit` on that side.
    page = await client.messages(sid, limit=50, before=ULID_MAX)
    assert ids(page) == truth[-50:] and page["has_more_after"] is False
    # A full page that ends exactly at the oldest / newest message: no phantom `has_more`.
    page = await client.messages(sid, limit=32, before=truth[32])
    assert ids(page) == truth[:32] and page["has_more_before"] is False
    assert page["has_more_after"] is True
    page = await client.messages(sid, limit=50, after=truth[-51])
    assert ids(page) == truth[-50:] and page["has_more_after"] is False
    assert page["has_more_before"] is True

    # A session with no message: empty pages, no flag set, whatever the cursor.
    fresh = (await client.create_session(workspace))["id"]
    for query in ({}, {"before": ULID_MAX}, {"after": ULID_MIN}, {"before": truth[100]}):
        page = await client.messages(fresh, limit=50, **query)
        assert page == {"messages": [], "has_more_before": False, "has_more_after": False}, query


# ---- 2. events cursor walk -----------------------------------------------------------------------


async def test_events_cursor_walk_over_250_plus_events_sees_each_once_in_seq_order(
    api: tuple[Daemon, Api], workspace: Path, metis_home: Path
) -> None:
    _, client = api
    sid = (await client.create_session(workspace))["id"]
    texts = [f"use server tool {i}" for i in range(30)]
    await run_turns(client, sid, texts)

    def truth() -> list[tuple[str, int]]:
        return [
            (row[0], row[1])
            for row in read_db(
                metis_home, "SELECT id, seq FROM events WHERE session_id=? ORDER BY seq", (sid,)
            )
        ]

    rows = truth()
    assert len(rows) >= 250, len(rows)
    assert [seq for _, seq in rows] == list(range(1, len(rows) + 1))

    url = f"/sessions/{sid}/events"
    seen: list[tuple[str, int]] = []
    sizes: list[int] = []
    cursor: str | None = None
    while True:
        params = {"limit": "100", **({"cursor": cursor} if cursor else {})}
        status, page = await client.call("GET", url, params=params)
        assert status == 200, page
        got = [(e["id"], e["seq"]) for e in page["events"]]
        assert all(e["session_id"] == sid for e in page["events"])
        seen.extend(got)
        sizes.append(len(got))
        cursor = page["next_cursor"]
        # next_cursor is non-null iff another row matches.
        assert (cursor is not None) == (len(seen) < len(rows)), (len(seen), cursor)
        if cursor is None:
            break
    assert seen == rows  # each event exactly once, ascending seq, nothing skipped
    assert sizes == [100] * (len(rows) // 100) + ([len(rows) % 100] if len(rows) % 100 else [])

    # An exact boundary: 200 rows left after `since` → two full pages, the second with no cursor.
    since = rows[len(rows) - 201][0]
    status, page = await client.call("GET", url, params={"limit": "100", "since": since})
    assert status == 200 and [(e["id"], e["seq"]) for e in page["events"]] == rows[-200:-100]
    assert page["next_cursor"] is not None
    status, page = await client.call(
        "GET", url, params={"limit": "100", "cursor": page["next_cursor"]}
    )
    assert status == 200 and [(e["id"], e["seq"]) for e in page["events"]] == rows[-100:]
    assert page["next_cursor"] is None

    # `until` bounds what "another row matches" means: no cursor once the bound is reached,
    # also when the bound falls exactly on a page boundary.
    for bound in (149, 199):
        until = rows[bound][0]
        status, page = await client.call("GET", url, params={"limit": "100", "until": until})
        assert status == 200 and [(e["id"], e["seq"]) for e in page["events"]] == rows[:100]
        assert page["next_cursor"] is not None
        status, page = await client.call(
            "GET", url, params={"limit": "100", "until": until, "cursor": page["next_cursor"]}
        )
        assert status == 200
        assert [(e["id"], e["seq"]) for e in page["events"]] == rows[100 : bound + 1]
        assert page["next_cursor"] is None, bound

    # A filtered walk continues by cursor over the filtered rows only.
    kinds = ("llm.call_started", "tool.failed")  # read_file of a missing file fails
    placeholders = ",".join("?" * len(kinds))
    filtered = [
        (row[0], row[1])
        for row in read_db(
            metis_home,
            f"SELECT id, seq FROM events WHERE session_id=? AND type IN ({placeholders}) "
            "ORDER BY seq",
            (sid, *kinds),
        )
    ]
    assert len(filtered) >= 90
    walked_filtered: list[tuple[str, int]] = []
    cursor = None
    while True:
        params = {
            "limit": "7",
            "event_types": ",".join(kinds),
            **({"cursor": cursor} if cursor else {}),
        }
        status, page = await client.call("GET", url, params=params)
        assert status == 200, page
        walked_filtered.extend((e["id"], e["seq"]) for e in page["events"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert walked_filtered == filtered

    # A cursor names a row of this session only: another session's cursor → 400.
    other = (await client.create_session(workspace))["id"]
    status, page = await client.call("GET", f"/sessions/{other}/events", params={"limit": "1"})
    assert status == 200 and page["next_cursor"] is None  # only session.created
    status, page = await client.call("GET", url, params={"limit": "1"})
    status, body = await client.call(
        "GET", f"/sessions/{other}/events", params={"cursor": page["next_cursor"]}
    )
    details = assert_error(status, body, 400, "validation_error")
    assert details["errors"][0]["loc"] == ["query", "cursor"]

    # Rows created after page 1 never shift later pages: a walk resumed after a new turn goes on
    # where it stopped and then includes the new events, still each once.
    status, first = await client.call("GET", url, params={"limit": "100"})
    assert status == 200
    await run_turns(client, sid, ["use server tool again"])
    after = truth()
    assert len(after) > len(rows)
    walked = [(e["id"], e["seq"]) for e in first["events"]]
    cursor = first["next_cursor"]
    while cursor is not None:
        status, page = await client.call("GET", url, params={"limit": "100", "cursor": cursor})
        assert status == 200, page
        walked.extend((e["id"], e["seq"]) for e in page["events"])
        cursor = page["next_cursor"]
    assert walked == after


# ---- 3. 415 on the optional-body routes ----------------------------------------------------------

NON_JSON = [
    pytest.param({"Content-Type": "text/plain"}, b"{}", "text/plain", id="text-plain"),
    pytest.param(
        {"Content-Type": "text/plain; charset=utf-8"},
        b'{"reason": "user_cancel"}',
        "text/plain; charset=utf-8",
        id="text-plain-charset",
    ),
    pytest.param(
        {"Content-Type": "application/x-www-form-urlencoded"},
        b"reason=user_cancel",
        "application/x-www-form-urlencoded",
        id="form",
    ),
    pytest.param({}, b"{}", None, id="no-content-type"),
]


async def _raw_post(
    api: Api, path: str, body: Any, headers: dict[str, str]
) -> tuple[int, Any, dict[str, str]]:
    async with api.http.post(
        path, data=body, headers=headers, skip_auto_headers=["Content-Type"]
    ) as r:
        payload = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, payload, dict(r.headers)


@pytest.mark.parametrize(("headers", "body", "received"), NON_JSON)
async def test_non_json_cancel_body_is_415_and_the_turn_runs_on(
    make_api: Callable[..., Any],
    workspace: Path,
    headers: dict[str, str],
    body: bytes,
    received: str | None,
) -> None:
    _, api = await make_api(config=HOLD)
    sid = (await api.create_session(workspace))["id"]
    turn_id, _ = await hold_turn(api, sid)
    before = len(await api.events(sid))
    url = f"/sessions/{sid}/turns/{turn_id}/cancel"
    status, payload, response_headers = await _raw_post(api, url, body, headers)
    details = assert_error(status, payload, 415, "unsupported_media_type")
    assert details == {"content_type": received}
    assert response_headers["Content-Type"] == "application/json; charset=utf-8"

    # 415 comes before the per-endpoint checks: an unknown session or turn is still 415.
    for other in (
        f"/sessions/{NEVER}/turns/{turn_id}/cancel",
        f"/sessions/{sid}/turns/01M7YA76RDGJRJS6TX6XK99B3P/cancel",
    ):
        status, payload, _ = await _raw_post(api, other, body, headers)
        assert assert_error(status, payload, 415, "unsupported_media_type") == {
            "content_type": received
        }

    # A refused request changes nothing: the turn is still in flight, no event was written.
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["current_turn_id"] == turn_id and got["current_turn_status"] == "in_flight"
    assert len(await api.events(sid)) == before

    status, accepted = await api.call("POST", url, {"reason": "user_cancel"})
    assert status == 202 and accepted["cancellation_initiated"] is True
    assert (await api.wait_turn(sid, turn_id))["type"] == "turn.cancelled"


async def test_chunked_non_json_cancel_body_is_415(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    """A chunked body counts as present, whatever its length."""
    _, api = await make_api(config=HOLD)
    sid = (await api.create_session(workspace))["id"]
    turn_id, _ = await hold_turn(api, sid)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"{}"

    url = f"/sessions/{sid}/turns/{turn_id}/cancel"
    status, payload, _ = await _raw_post(api, url, chunks(), {"Content-Type": "text/plain"})
    assert assert_error(status, payload, 415, "unsupported_media_type") == {
        "content_type": "text/plain"
    }
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["current_turn_status"] == "in_flight"
    await api.call("POST", url)
    await api.wait_turn(sid, turn_id)


async def test_empty_cancel_body_with_a_non_json_content_type_is_no_body(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    """The media type is checked only for a present body (or a required one); the cancel
    body is optional, so Content-Length 0 with `text/plain` is a plain cancel."""
    _, api = await make_api(config=HOLD)
    sid = (await api.create_session(workspace))["id"]
    turn_id, _ = await hold_turn(api, sid)
    url = f"/sessions/{sid}/turns/{turn_id}/cancel"
    status, payload, _ = await _raw_post(api, url, b"", {"Content-Type": "text/plain"})
    assert status == 202, payload
    assert payload == {"turn_id": turn_id, "cancellation_initiated": True}
    assert (await api.wait_turn(sid, turn_id))["type"] == "turn.cancelled"


@pytest.mark.parametrize(("headers", "body", "received"), NON_JSON)
async def test_non_json_routing_check_body_is_415(
    api: tuple[Daemon, Api], headers: dict[str, str], body: bytes, received: str | None
) -> None:
    _, client = api
    status, payload, response_headers = await _raw_post(client, "/routing/check", body, headers)
    assert assert_error(status, payload, 415, "unsupported_media_type") == {
        "content_type": received
    }
    assert response_headers["Content-Type"] == "application/json; charset=utf-8"
    assert not any(h.lower().startswith("access-control-") for h in response_headers)


async def test_routing_check_media_type_edges(api: tuple[Daemon, Api]) -> None:
    _, client = api
    # A JSON body whose media type only differs in case and parameters is accepted.
    status, payload, _ = await _raw_post(
        client, "/routing/check", b"{}", {"Content-Type": "Application/JSON; Charset=UTF-8"}
    )
    assert status == 200 and payload["valid"] is True, payload
    # No body at all (Content-Length 0), whatever the Content-Type: checks the on-disk file.
    for headers in ({}, {"Content-Type": "text/plain"}):
        status, payload, _ = await _raw_post(client, "/routing/check", b"", headers)
        assert status == 200 and set(payload) == {
            "valid",
            "errors",
            "warnings",
            "diagnostics",
            "version",
        }, payload
    # 415 precedes validation: a text/plain body that would also be invalid JSON is still 415.
    status, payload, _ = await _raw_post(
        client, "/routing/check", b"{not json", {"Content-Type": "text/plain"}
    )
    assert_error(status, payload, 415, "unsupported_media_type")


# ---- 4. 405 with Allow; HEAD mints nothing -------------------------------------------------------


def _allowed(header: str) -> set[str]:
    return {m.strip() for m in header.split(",") if m.strip()}


async def test_put_sessions_is_405_with_allow_and_details_allowed(
    api: tuple[Daemon, Api], workspace: Path
) -> None:
    _, client = api
    for method, path, allowed in (
        ("PUT", "/sessions", {"GET", "HEAD", "POST"}),
        ("OPTIONS", "/health", {"GET", "HEAD"}),
        ("PUT", f"/sessions/{NEVER}", {"GET", "HEAD", "PATCH", "DELETE"}),
    ):
        async with client.http.request(method, path) as r:
            assert r.status == 405, (method, path)
            assert r.headers["Content-Type"] == "application/json; charset=utf-8"
            assert not any(h.lower().startswith("access-control-") for h in r.headers)
            assert _allowed(r.headers["Allow"]) == allowed, r.headers["Allow"]
            body = await r.json()
        assert body["error"]["code"] == "method_not_allowed"
        assert set(body["error"]["details"]["allowed"]) == allowed
        assert len(body["error"]["details"]["allowed"]) == len(allowed)

    # 405 precedes origin, media-type and body checks, and writes nothing.
    sessions_before = len((await client.call("GET", "/sessions"))[1]["sessions"])
    status, body = await client.call(
        "PUT",
        "/sessions",
        {"workspace_path": str(workspace)},
        headers={"Origin": "http://evil.example"},
    )
    assert assert_error(status, body, 405, "method_not_allowed")["allowed"]
    async with client.http.put(
        "/sessions", data=b"x" * 10, headers={"Content-Type": "text/plain"}
    ) as r:
        assert r.status == 405 and (await r.json())["error"]["code"] == "method_not_allowed"
    assert len((await client.call("GET", "/sessions"))[1]["sessions"]) == sessions_before


async def test_a_preflight_on_metis_routes_is_405_without_cors_even_with_aap_origins(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """No preflight handling on the metis surface, whatever `aap.cors_origins` says;
    405 precedes `origin_not_allowed`."""
    app_origin = "http://app.example:4173"
    d = await start_daemon(aap={"cors_origins": [app_origin]})
    async with api_session(d) as http:
        sid = (await Api(http).create_session(workspace))["id"]
        preflight = {"Access-Control-Request-Method": "POST"}
        for origin in (app_origin, "http://evil.example"):
            for path, allowed in (
                ("/sessions", {"GET", "HEAD", "POST"}),
                (f"/sessions/{sid}", {"GET", "HEAD", "PATCH", "DELETE"}),
                ("/health", {"GET", "HEAD"}),
            ):
                async with http.options(path, headers={"Origin": origin, **preflight}) as r:
                    assert r.status == 405, (origin, path, r.status)
                    assert _allowed(r.headers["Allow"]) == allowed
                    assert not any(h.lower().startswith("access-control-") for h in r.headers)
                    body = await r.json()
                assert body["error"]["code"] == "method_not_allowed"
                assert set(body["error"]["details"]["allowed"]) == allowed


async def test_head_on_a_session_answers_as_get_and_mints_no_token(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    # One outstanding token per session: any extra mint would evict the first one.
    d = await start_daemon(websocket={"attach_tokens_per_session_max": 1})
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        status, got = await api.call("GET", f"/sessions/{sid}")
        assert status == 200 and got["attach_token"]
        assert d.core.hub.token_count(sid) == 1
        for _ in range(3):
            async with http.head(f"/sessions/{sid}") as r:
                assert r.status == 200
                assert r.headers["Content-Type"] == "application/json; charset=utf-8"
                assert r.headers["Cache-Control"] == "no-store"
                # the length only the minted token would determine is not claimed
                assert "Content-Length" not in r.headers
                assert await r.read() == b""
        async with http.head(f"/sessions/{NEVER}") as r:  # the lookup still runs
            assert r.status == 404
            assert await r.read() == b""
        assert d.core.hub.token_count() == 1
        # The token minted by the GET is still the one outstanding: it attaches.
        ws = await http.ws_connect(got["ws_url"])
        try:
            await ws.send_json({"type": "subscribe"})
            ack = await ws.receive_json(timeout=5)
            assert ack["type"] == "subscribe_ack", ack
        finally:
            await ws.close()


# ---- 5. after a purge, every route is 404 --------------------------------------------------------


def metis_routes(sid: str, turn_id: str, request_id: str) -> list[tuple[str, str, Any]]:
    return [
        ("GET", f"/sessions/{sid}", None),
        ("PATCH", f"/sessions/{sid}", {"active_model": None}),
        ("DELETE", f"/sessions/{sid}", None),
        ("DELETE", f"/sessions/{sid}?purge=true", None),
        ("POST", f"/sessions/{sid}/turns", {"content": [{"type": "text", "text": "hi"}]}),
        ("POST", f"/sessions/{sid}/turns/{turn_id}/cancel", None),
        (
            "POST",
            f"/sessions/{sid}/turns/{turn_id}/confirmations/{request_id}",
            {"decision": "allow"},
        ),
        ("GET", f"/sessions/{sid}/messages", None),
        ("GET", f"/sessions/{sid}/events", None),
    ]


async def assert_metis_routes_404(api: Api, sid: str, turn_id: str, request_id: str) -> None:
    for method, path, body in metis_routes(sid, turn_id, request_id):
        status, payload = await api.call(method, path, body)
        details = assert_error(status, payload, 404, "session_not_found")
        assert details["session_id"] == sid, (method, path, payload)
    status, listed = await api.call("GET", "/sessions", params={"status": "all", "limit": "200"})
    assert status == 200 and sid not in {s["id"] for s in listed["sessions"]}


async def assert_upgrade_404(http: aiohttp.ClientSession, ws_url: str, sid: str) -> None:
    """The upgrade checks: a token minted before the purge meets a session that is gone."""
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(ws_url)
    assert refused.value.status == 404
    # The refusal is an ordinary response in the REST envelope.
    upgrade = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    async with http.get(ws_url.replace("ws://", "http://"), headers=upgrade) as r:
        status, body = r.status, await r.json()
    assert assert_error(status, body, 404, "session_not_found") == {"session_id": sid}


@pytest.fixture
def aap_key(metis_home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("METIS_API_KEY", KEY)
    return KEY


async def test_purged_metis_session_is_404_on_every_route_and_leaves_no_row(
    start_daemon: Callable[..., Any], workspace: Path, metis_home: Path, aap_key: str
) -> None:
    d = await start_daemon(config=HOLD, **roots(workspace))
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        await run_turns(api, sid, ["hello"])
        turn_id, request = await hold_turn(api, sid)  # purge mid-turn, a confirmation pending
        _, got = await api.call("GET", f"/sessions/{sid}")
        before = counts_by_table(metis_home, sid)
        for table in ("sessions", "messages", "turns", "events", "tool_calls", "confirmations"):
            assert before[table] > 0, before

        status, purged = await api.call("DELETE", f"/sessions/{sid}", params={"purge": "true"})
        assert status == 200 and purged["id"] == sid and purged["purged"] is True, purged
        assert purged["deleted"]["messages"] >= 3 and purged["deleted"]["events"] > 0

        await assert_metis_routes_404(api, sid, turn_id, request["confirmation_request_id"])
        await assert_upgrade_404(http, got["ws_url"], sid)
        aap = AapClient(http, aap_key)
        for method, path in (("GET", f"/sessions/{sid}"), ("DELETE", f"/sessions/{sid}")):
            reply = await aap.request(method, path)
            assert reply.status == 404 and reply.error == "session_not_found", reply.body

        # Purge works on an ended session too, with the same result.
        ended = (await api.create_session(workspace))["id"]
        await run_turns(api, ended, ["hello"])
        _, ended_view = await api.call("GET", f"/sessions/{ended}")
        status, _ = await api.call("DELETE", f"/sessions/{ended}")
        assert status == 200
        status, purged = await api.call("DELETE", f"/sessions/{ended}", params={"purge": "true"})
        assert status == 200 and purged["purged"] is True and purged["ended_at"], purged
        await assert_metis_routes_404(api, ended, turn_id, request["confirmation_request_id"])
        await assert_upgrade_404(http, ended_view["ws_url"], ended)

        await d.core.flush()
        assert set(counts_by_table(metis_home, ended).values()) == {0}
        assert counts_by_table(metis_home, sid) == dict.fromkeys(before, 0)
        purged_events = read_db(
            metis_home,
            "SELECT payload_json FROM events WHERE session_id='system' AND type='session.purged' "
            "AND json_extract(payload_json, '$.purged_session_id')=?",
            (sid,),
        )
        assert len(purged_events) == 1


async def test_purged_aap_session_is_404_on_metis_and_aap_routes_and_forms_are_gone(
    start_daemon: Callable[..., Any], workspace: Path, metis_home: Path, aap_key: str
) -> None:
    d = await start_daemon(**roots(workspace))
    async with api_session(d) as http:
        api = Api(http)
        aap = AapClient(http, aap_key, workspace=str(workspace.resolve()))
        sid = await aap.create(tools=[{"name": "list_dir"}])
        reply = await aap.say(sid, "hello there")
        assert reply.status == 200, reply.body
        # An untrusted server tool suspends on a permission: a pending `suspend` confirmation.
        reply = await aap.say(sid, "use server tool")
        assert reply.status == 200 and reply.tool_calls(), reply.body
        _, got = await api.call("GET", f"/sessions/{sid}")
        assert got["surface"] == "aap"
        [pending] = got["pending_confirmations"]
        assert (await aap.request("GET", f"/sessions/{sid}")).status == 200
        before = counts_by_table(metis_home, sid)
        for table in ("messages", "turns", "events", "confirmations", "aap_sessions"):
            assert before[table] > 0, before
        assert before["aap_message_forms"] > 0, before

        status, purged = await api.call("DELETE", f"/sessions/{sid}", params={"purge": "true"})
        assert status == 200 and purged["purged"] is True, purged

        await assert_metis_routes_404(
            api, sid, pending["turn_id"], pending["confirmation_request_id"]
        )
        await assert_upgrade_404(http, got["ws_url"], sid)
        for client, method, path, body in (
            (aap, "GET", f"/sessions/{sid}", None),
            (aap, "GET", f"/sessions/{sid}/history?type=full", None),
            (
                aap,
                "POST",
                f"/sessions/{sid}/turns",
                {"messages": [{"role": "user", "content": "hi"}]},
            ),
            (aap, "DELETE", f"/sessions/{sid}", None),
            (aap.v1, "GET", f"/session/{sid}", None),
            (aap.v1, "POST", f"/session/{sid}", {"messages": [{"role": "user", "content": "x"}]}),
            (aap.v1, "DELETE", f"/session/{sid}", None),
        ):
            reply = await client.request(method, path, body)
            assert reply.status == 404, (client.base, method, path, reply.status, reply.body)
            assert reply.error == "session_not_found", reply.body
        listed = await aap.request("GET", "/sessions")
        assert sid not in {s["sessionId"] for s in listed.body["sessions"]}

        await d.core.flush()
        assert counts_by_table(metis_home, sid) == dict.fromkeys(before, 0)
        types = read_db(
            metis_home,
            "SELECT type FROM events WHERE json_extract(payload_json, '$.purged_session_id')=?",
            (sid,),
        )
        assert types == [("session.purged",)]


async def test_aap_delete_purges_and_metis_routes_are_404(
    start_daemon: Callable[..., Any], workspace: Path, metis_home: Path, aap_key: str
) -> None:
    d = await start_daemon(**roots(workspace))
    async with api_session(d) as http:
        api = Api(http)
        aap = AapClient(http, aap_key, workspace=str(workspace.resolve()))
        sid = await aap.create()
        assert (await aap.say(sid, "hello")).status == 200
        _, got = await api.call("GET", f"/sessions/{sid}")
        [turn] = read_db(metis_home, "SELECT id FROM turns WHERE session_id=?", (sid,))
        assert counts_by_table(metis_home, sid)["aap_message_forms"] > 0

        reply = await aap.request("DELETE", f"/sessions/{sid}")
        assert reply.status == 204, reply.body

        await assert_metis_routes_404(api, sid, turn[0], "01M7YA76RDGJRJS6TX6XK99B3P")
        await assert_upgrade_404(http, got["ws_url"], sid)
        assert (await aap.request("GET", f"/sessions/{sid}")).status == 404
        await d.core.flush()
        assert set(counts_by_table(metis_home, sid).values()) == {0}
        types = read_db(
            metis_home,
            "SELECT type FROM events WHERE session_id='system' "
            "AND json_extract(payload_json, '$.purged_session_id')=?",
            (sid,),
        )
        assert types == [("session.purged",)]


# ---- 6. messages of a session that never existed -------------------------------------------------


@pytest.mark.parametrize(
    "session_id", [NEVER, "sess_nope", "not-a-session", "01M7YA76RDGJRJS6TX6XK99B3P"]
)
async def test_messages_of_a_session_that_never_existed_is_404(
    api: tuple[Daemon, Api], workspace: Path, session_id: str
) -> None:
    _, client = api
    await client.create_session(workspace)  # the store is not empty
    for query in ({}, {"limit": "10"}, {"after": ULID_MIN}, {"before": ULID_MAX}):
        status, body = await client.call("GET", f"/sessions/{session_id}/messages", params=query)
        details = assert_error(status, body, 404, "session_not_found")
        assert details == {"session_id": session_id}, body


async def test_a_bad_messages_query_on_an_unknown_session_is_400_first(
    api: tuple[Daemon, Api],
) -> None:
    """`validation_error` (query) precedes the per-endpoint `session_not_found`."""
    _, client = api
    for query, loc in (
        ({"limit": "0"}, ["query", "limit"]),
        ({"before": "nope"}, ["query", "before"]),
        ({"limit": "5", "bogus": "1"}, ["query", "bogus"]),
    ):
        status, body = await client.call("GET", f"/sessions/{NEVER}/messages", params=query)
        details = assert_error(status, body, 400, "validation_error")
        assert details["errors"][0]["loc"] == loc


async def test_a_query_parameter_no_route_declares_is_400_but_pages_and_aap_ignore_theirs(
    api: tuple[Daemon, Api],
) -> None:
    """Unknown parameters were ignored (`GET /sessions?bogus=1` answered 200). Refused on
    every metis route, with or without a query model, the WebSocket upgrade too; each named
    once. The dashboard's page and files, and AAP's routes, keep ignoring theirs."""
    _, client = api
    for path, params, msg in (
        ("/sessions", [("bogus", "1"), ("bogus", "2"), ("x", "")], "this route takes cursor, "),
        ("/health", [("verbose", "1")], "this route takes none"),
        (f"/sessions/{NEVER}/stream", [("attach", "t"), ("since", "x")], "this route takes attach"),
        ("/login", [("token", "t"), ("next", "/")], "this route takes token"),
    ):
        status, body = await client.call("GET", path, params=params)
        errors = assert_error(status, body, 400, "validation_error")["errors"]
        unknown = [name for name, _ in params if name not in ("token", "attach")]
        assert [e["loc"] for e in errors] == [["query", n] for n in dict.fromkeys(unknown)], body
        assert all(e["msg"].startswith(f"unknown query parameter; {msg}") for e in errors), body
    for path in ("/?v=1", "/static/js/api.js?v=2", "/aap/sessions?bogus=1", "/aap/v1/meta?x=1"):
        status, _ = await client.call("GET", path)
        assert status == 200, path
