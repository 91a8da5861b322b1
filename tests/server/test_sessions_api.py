"""REST sessions, turns, messages and events against the real daemon.

The offline scripted model serves the turns; a `prompt` confirmation policy on read_file holds a
turn in flight deterministically where a test needs one.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from metis.server.errors import ERROR_CODES
from metis.server.runner import Daemon
from tests.api import Api, api_session
from tests.helpers import HOLD


@pytest.fixture
async def held(start_daemon: Callable[..., Any]) -> AsyncIterator[tuple[Daemon, Api]]:
    """A daemon whose read_file calls wait for a confirmation (turns stay in flight)."""
    d = await start_daemon(config=HOLD)
    async with api_session(d) as http:
        yield d, Api(http)


async def hold_turn(api: Api, session_id: str) -> tuple[str, dict[str, Any]]:
    """Start a turn that waits on a read_file confirmation; returns (turn_id, the request)."""
    status, accepted = await api.submit(session_id, "please use server tool")
    assert status == 202, accepted
    requested = await api.wait_for_event(
        session_id, lambda e: e["type"] == "tool.confirmation_requested"
    )
    return accepted["turn_id"], requested["payload"]


def confirmation_url(sid: str, turn_id: str, request: dict[str, Any]) -> str:
    """Where the answer to `request` (a `tool.confirmation_requested` payload) is posted."""
    return f"/sessions/{sid}/turns/{turn_id}/confirmations/{request['confirmation_request_id']}"


async def held_confirmation(api: Api, workspace: Path) -> tuple[str, str, str]:
    """A new session whose turn waits on a confirmation: (session id, turn id, answer URL)."""
    sid = (await api.create_session(workspace))["id"]
    turn_id, request = await hold_turn(api, sid)
    return sid, turn_id, confirmation_url(sid, turn_id, request)


# ---- lifecycle ---------------------------------------------------------------------------------


async def test_session_lifecycle_shapes(api: Api, workspace: Path) -> None:
    created = await api.create_session(workspace)
    sid = created["id"]
    assert sid.startswith("sess_") and created["surface"] == "metis"
    assert created["workspace_path"] == str(workspace.resolve())
    assert created["cost_so_far_usd"] == "0" and created["turn_count"] == 0
    status, got = await api.call("GET", f"/sessions/{sid}")
    assert (
        status == 200
        and got["attach_token"].startswith("atk_")
        and got["ws_url"].endswith(got["attach_token"])
    )
    status, listed = await api.call("GET", "/sessions")
    assert [s["id"] for s in listed["sessions"]] == [sid] and listed["next_cursor"] is None
    status, ended = await api.call("DELETE", f"/sessions/{sid}")
    assert status == 200 and ended["id"] == sid and ended["ended_at"]
    status, got = await api.call("GET", f"/sessions/{sid}")
    assert got["ended_at"] and got["attach_token"] is None and got["ws_url"] is None
    status, purged = await api.call("DELETE", f"/sessions/{sid}", params={"purge": "true"})
    assert status == 200 and purged["purged"] is True and purged["deleted"]["events"] >= 2
    status, body = await api.call("GET", f"/sessions/{sid}")
    assert status == 404 and body["error"]["code"] == "session_not_found"


async def test_create_location_header_and_missing_workspace_field(
    api: Api, workspace: Path
) -> None:
    async with api.http.post("/sessions", json={"workspace_path": str(workspace)}) as r:
        body = await r.json()
        assert r.headers["Location"] == f"/sessions/{body['id']}"
    status, body = await api.call("POST", "/sessions", {})
    assert status == 400 and body["error"]["code"] == "validation_error"
    assert body["error"]["details"]["errors"][0]["loc"] == ["body", "workspace_path"]


@pytest.mark.parametrize(
    ("make_path", "reason"),
    [
        (lambda ws: ws / "missing", "not_found"),
        (lambda ws: ws / "README.md", "not_a_directory"),
        (lambda ws: "relative/path", "not_absolute"),
    ],
)
async def test_bad_workspaces_are_refused_with_a_reason(
    api: Api, workspace: Path, make_path: Any, reason: str
) -> None:
    status, body = await api.call(
        "POST", "/sessions", {"workspace_path": str(make_path(workspace))}
    )
    assert status == 400 and body["error"]["code"] == "workspace_not_found"
    assert body["error"]["details"]["reason"] == reason


async def test_unknown_initial_model_is_refused(api: Api, workspace: Path) -> None:
    status, body = await api.call(
        "POST", "/sessions", {"workspace_path": str(workspace), "initial_active_model": "nope"}
    )
    assert status == 400 and body["error"]["code"] == "model_not_configured"
    assert body["error"]["details"]["reason"] == "unknown"


async def test_list_pages_newest_first_with_stable_cursors(api: Api, workspace: Path) -> None:
    ids = [(await api.create_session(workspace))["id"] for _ in range(5)]
    status, page1 = await api.call("GET", "/sessions", params={"limit": 2})
    assert [s["id"] for s in page1["sessions"]] == ids[::-1][:2]
    await api.create_session(workspace)  # a new session never shifts later pages
    status, page2 = await api.call(
        "GET", "/sessions", params={"limit": 2, "cursor": page1["next_cursor"]}
    )
    assert [s["id"] for s in page2["sessions"]] == ids[::-1][2:4]
    # the session a cursor points at is purged: paging goes on past where it was
    status, _ = await api.call("DELETE", f"/sessions/{ids[3]}", params={"purge": "true"})
    assert status == 200
    status, page1_again = await api.call(
        "GET", "/sessions", params={"limit": 2, "cursor": page1["next_cursor"]}
    )
    assert status == 200 and [s["id"] for s in page1_again["sessions"]] == [ids[2], ids[1]]
    status, body = await api.call("GET", "/sessions", params={"cursor": "garbage!"})
    assert status == 400 and body["error"]["details"]["errors"][0]["loc"] == ["query", "cursor"]


async def test_a_cursor_continues_its_own_listings_filters(
    api: Api, workspace: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    ended = [(await api.create_session(workspace))["id"] for _ in range(3)]
    for sid in ended:
        await api.call("DELETE", f"/sessions/{sid}")
    await api.create_session(other)
    _, page1 = await api.call("GET", "/sessions", params={"status": "ended", "limit": 1})
    # the next page with the cursor alone: still the ended sessions
    _, page2 = await api.call(
        "GET", "/sessions", params={"cursor": page1["next_cursor"], "limit": 5}
    )
    listed = page1["sessions"] + page2["sessions"]
    assert [s["id"] for s in listed] == ended[::-1]
    assert {s["status"] for s in listed} == {"ended"} and page2["next_cursor"] is None
    # repeated as they were, the filters are welcome; changed, the cursor is refused
    status, _ = await api.call(
        "GET", "/sessions", params={"cursor": page1["next_cursor"], "status": "ended"}
    )
    assert status == 200
    status, body = await api.call(
        "GET", "/sessions", params={"cursor": page1["next_cursor"], "status": "active"}
    )
    assert status == 400 and body["error"]["code"] == "validation_error"
    assert body["error"]["details"]["errors"][0]["type"] == "cursor_invalid"
    assert body["error"]["details"]["errors"][0]["loc"] == ["query", "status"]
    # events: the type filter travels with the cursor too
    sid = (await api.create_session(workspace))["id"]
    for model in ("local:scripted", None, "local:scripted"):
        status, _ = await api.call("PATCH", f"/sessions/{sid}", {"active_model": model})
        assert status == 200
    wanted = {"event_types": "session.model_changed", "limit": 1}
    _, first = await api.call("GET", f"/sessions/{sid}/events", params=wanted)
    _, rest = await api.call(
        "GET", f"/sessions/{sid}/events", params={"cursor": first["next_cursor"]}
    )
    types = {e["type"] for e in first["events"] + rest["events"]}
    assert types == {"session.model_changed"} and len(first["events"] + rest["events"]) == 3


async def test_list_filters(api: Api, workspace: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    a = await api.create_session(workspace)
    b = await api.create_session(other)
    await api.call("DELETE", f"/sessions/{b['id']}")
    _, body = await api.call("GET", "/sessions", params={"workspace_path": str(workspace)})
    assert [s["id"] for s in body["sessions"]] == [a["id"]]
    _, body = await api.call("GET", "/sessions", params={"status": "ended"})
    assert [s["id"] for s in body["sessions"]] == [b["id"]]
    _, body = await api.call("GET", "/sessions", params={"workspace_path": str(tmp_path / "nope")})
    assert body["sessions"] == []
    other.rmdir()  # a directory deleted since still finds its sessions
    _, body = await api.call("GET", "/sessions", params={"workspace_path": str(other)})
    assert [s["id"] for s in body["sessions"]] == [b["id"]]
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    status, body = await api.call("GET", "/sessions", params={"workspace_path": str(loop / "x")})
    assert (status, body["sessions"]) == (200, []), body
    relative = os.path.relpath(workspace)  # never resolved against the daemon's own cwd
    status, body = await api.call("GET", "/sessions", params={"workspace_path": relative})
    assert status == 400 and body["error"]["code"] == "invalid_workspace", body
    assert body["error"]["details"]["reason"] == "not_absolute"


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "0"},
        {"limit": "201"},
        {"limit": "abc"},
        {"status": "maybe"},
        *({"limit": loose} for loose in ("5_0", "1.0", "+3", " 3 ", "٣")),
    ],
)
async def test_bad_list_queries_are_400(api: Api, query: dict[str, str]) -> None:
    status, body = await api.call("GET", "/sessions", params=query)
    assert status == 400 and body["error"]["code"] == "validation_error"


async def test_repeated_query_parameter_is_400(api: Api) -> None:
    status, body = await api.call("GET", "/sessions?limit=1&limit=2")
    assert status == 400 and body["error"]["details"]["errors"][0]["type"] == "repeated"


# ---- turns ---------------------------------------------------------------------------------------


async def test_turn_ids_in_the_202_are_the_real_ones(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    accepted, terminal = await api.run_turn(sid, "hello metis")
    assert terminal["type"] == "turn.completed"
    events = await api.turn_events(sid, accepted["turn_id"])
    started = next(e for e in events if e["type"] == "turn.started")
    assert started["payload"]["user_message_id"] == accepted["user_message_id"]
    assert accepted["model"] == "local:scripted"
    messages = (await api.messages(sid))["messages"]
    assert messages[0]["id"] == accepted["user_message_id"] and messages[0]["role"] == "user"
    assert messages[1]["content"] == [{"type": "text", "text": 'You said: "hello metis"'}]
    assert [e["type"] for e in events][:4] == [
        "turn.started",
        "route.decided",
        "llm.call_started",
        "llm.call_completed",
    ]
    _status, got = await api.call("GET", f"/sessions/{sid}")
    assert got["turn_count"] == 1 and got["current_turn_id"] is None


async def test_submit_while_in_flight_is_409_with_current_turn(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = held
    sid = (await api.create_session(workspace))["id"]
    turn_id, _ = await hold_turn(api, sid)
    status, body = await api.submit(sid, "again")
    assert status == 409 and body["error"]["code"] == "turn_in_flight"
    assert body["error"]["details"]["current_turn_id"] == turn_id
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["current_turn_id"] == turn_id and got["current_turn_status"] == "in_flight"
    assert got["pending_confirmations"][0]["turn_id"] == turn_id


async def test_the_list_counts_each_sessions_tool_calls_waiting_for_an_answer(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = held
    waiting = (await api.create_session(workspace))["id"]
    idle = (await api.create_session(workspace))["id"]
    await hold_turn(api, waiting)
    _, listed = await api.call("GET", "/sessions")
    counts = {s["id"]: s["pending_confirmation_count"] for s in listed["sessions"]}
    assert counts == {waiting: 1, idle: 0}
    _, got = await api.call("GET", f"/sessions/{waiting}")
    request = got["pending_confirmations"][0]
    status, _ = await api.answer(waiting, request["turn_id"], request["confirmation_request_id"])
    assert status == 200
    _, listed = await api.call("GET", "/sessions")
    assert {s["pending_confirmation_count"] for s in listed["sessions"]} == {0}


async def test_concurrent_submits_accept_exactly_one(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    daemon, api = held
    sid = (await api.create_session(workspace))["id"]
    results = await asyncio.gather(*(api.submit(sid, f"use server tool {i}") for i in range(20)))
    statuses = sorted(s for s, _ in results)
    assert statuses.count(202) == 1 and statuses.count(409) == 19
    rows = await daemon.core.db.fetchall("SELECT id FROM turns WHERE session_id=?", (sid,))
    assert len(rows) == 1


async def test_submit_right_after_turn_completed_is_accepted(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    for i in range(5):
        status, accepted = await api.submit(sid, f"turn {i}")
        assert status == 202, accepted
        await api.wait_turn(sid, accepted["turn_id"])


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ([], "at least one"),
        ([{"type": "text", "text": ""}], "empty"),
        ([{"type": "tool_use", "id": "x", "name": "a", "input": {}}], "not allowed"),
        ([{"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}], "https"),
        ([{"type": "text", "text": "@scripted"}], "override without a message"),
        (
            [
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/jpeg",
                        "data": base64.b64encode(b"GIF89a" + b"\0" * 30).decode(),
                    },
                }
            ],
            "image data is image/gif, not image/jpeg",
        ),
    ],
)
async def test_invalid_content_is_400_and_stores_nothing(
    api: Api, workspace: Path, content: list, fragment: str
) -> None:
    sid = (await api.create_session(workspace))["id"]
    status, body = await api.call("POST", f"/sessions/{sid}/turns", {"content": content})
    assert status == 400 and body["error"]["code"] == "invalid_content"
    assert fragment in str(body["error"]["details"]["errors"])
    assert (await api.messages(sid))["messages"] == []


async def test_alias_prefix_is_stripped_and_unknown_alias_refused(
    api: Api, workspace: Path
) -> None:
    sid = (await api.create_session(workspace))["id"]
    accepted, _ = await api.run_turn(sid, "@scripted do it")
    messages = (await api.messages(sid))["messages"]
    assert messages[0]["content"][0]["text"] == "do it"
    started = next(
        e for e in await api.turn_events(sid, accepted["turn_id"]) if e["type"] == "turn.started"
    )
    assert started["payload"]["per_message_override"] == "local:scripted"
    status, body = await api.submit(sid, "@nonexistent hi")
    assert status == 400 and body["error"]["code"] == "model_not_configured"
    assert body["error"]["details"]["source"] == "per_message_override"


async def test_unknown_session_turn_is_404(api: Api) -> None:
    status, body = await api.submit("sess_01M7YA76RDGJRJS6TX6XK99B3P", "hi")
    assert status == 404 and body["error"]["code"] == "session_not_found"
    status, body = await api.submit("not-an-id", "hi")
    assert status == 404


# ---- routing failure ---------------------------------------------------------------------------

FAKE_MODELS = """
pricing_version: "test"
providers:
  anthropic: {adapter: anthropic, base_url: "http://127.0.0.1:9", api_key: "ak-test"}
models:
  - id: anthropic:claude-haiku-4-5
    aliases: [haiku]
    capabilities: {max_context_tokens: 200000, max_output_tokens: 8192}
    pricing: {input_per_mtok: "1", output_per_mtok: "5"}
"""


async def test_routing_failure_is_503_and_leaves_nothing_but_one_route_decided(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(models=FAKE_MODELS)
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        d.core.availability.record_failure("anthropic:claude-haiku-4-5", "auth")
        status, body = await api.submit(sid, "hello")
        assert status == 503 and body["error"]["code"] == "routing_failed"
        tried = body["error"]["details"]["tried"]
        assert (
            tried[0]["model"] == "anthropic:claude-haiku-4-5"
            and tried[0]["reason"] == "provider_unavailable"
        )
        events = await api.events(sid)
        assert [e["type"] for e in events] == ["session.created", "route.decided"]
        assert events[1]["turn_id"] is None and events[1]["payload"]["winner_index"] == -1
        assert (await api.messages(sid))["messages"] == []
        assert await d.core.db.fetchone("SELECT 1 FROM turns WHERE session_id=?", (sid,)) is None
        assert d.core.slots.get(sid) is None
        d.core.availability.reset()
        status, body = await api.submit(sid, "@scripted now it works")
        assert status == 202


# ---- cancel --------------------------------------------------------------------------------------


async def test_cancel_is_idempotent_then_409_after_the_end(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    d, api = held
    sid = (await api.create_session(workspace))["id"]
    turn_id, request = await hold_turn(api, sid)
    url = f"/sessions/{sid}/turns/{turn_id}/cancel"
    answers = await asyncio.gather(
        api.call("POST", url), api.call("POST", url, {"reason": "user_cancel"})
    )
    initiated = [body["cancellation_initiated"] for status, body in answers if status == 202]
    assert initiated.count(True) == 1 and initiated.count(False) == len(initiated) - 1
    assert all(status in (202, 409) for status, _ in answers)
    terminal = await api.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.cancelled" and terminal["payload"]["reason"] == "user_cancel"
    await d.core.turns.wait_all()
    status, body = await api.call("POST", f"/sessions/{sid}/turns/{turn_id}/cancel")
    assert status == 409 and body["error"]["details"]["status"] == "cancelled"
    types = [e["type"] for e in await api.turn_events(sid, turn_id)]
    assert "tool.confirmation_resolved" not in types and types[-2:] == [
        "tool.failed",
        "turn.cancelled",
    ]
    assert types.count("turn.cancelled") == 1
    status, body = await api.call(
        "POST",
        f"/sessions/{sid}/turns/{turn_id}/confirmations/{request['confirmation_request_id']}",
        {"decision": "allow"},
    )
    assert status == 409 and body["error"]["details"]["resolution"] == "withdrawn"


async def test_cancel_errors(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    status, body = await api.call(
        "POST", f"/sessions/{sid}/turns/01M7YA76RDGJRJS6TX6XK99B3P/cancel"
    )
    assert status == 404 and body["error"]["code"] == "turn_not_found"
    status, body = await api.call("POST", f"/sessions/{sid}/turns/x/cancel", {"reason": "because"})
    assert status == 400


async def test_five_user_cancels_leave_the_model_healthy(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    d, api = held
    sid = (await api.create_session(workspace))["id"]
    for _ in range(5):
        turn_id, _ = await hold_turn(api, sid)
        await api.call("POST", f"/sessions/{sid}/turns/{turn_id}/cancel")
        await api.wait_turn(sid, turn_id)
        await d.core.turns.wait_all()
    _, models = await api.call("GET", "/models")
    assert all(m["availability"] == "healthy" for m in models["models"])


# ---- confirmations -------------------------------------------------------------------------------


async def test_confirmation_allow_runs_the_tool_and_repeat_is_not_applied(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = held
    sid, turn_id, url = await held_confirmation(api, workspace)
    status, body = await api.call("POST", url, {"decision": "allow"})
    assert status == 200 and body == {
        "request_id": url.rsplit("/", 1)[1],
        "decision": "allow",
        "scope": "once",
        "applied": True,
    }
    status, body = await api.call("POST", url, {"decision": "allow"})
    assert status == 200 and body["applied"] is False
    status, body = await api.call("POST", url, {"decision": "deny"})
    assert status == 409 and body["error"]["details"]["resolution"] == "allow"
    await api.wait_turn(sid, turn_id)
    types = [e["type"] for e in await api.turn_events(sid, turn_id)]
    i = types.index("tool.confirmation_requested")
    assert types[i : i + 4] == [
        "tool.confirmation_requested",
        "tool.confirmation_resolved",
        "tool.called",
        "tool.failed",
    ]


async def test_confirmation_deny_reaches_the_model_with_the_reason(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = held
    sid, turn_id, url = await held_confirmation(api, workspace)
    status, _ = await api.call("POST", url, {"decision": "deny", "reason": "not now"})
    assert status == 200
    terminal = await api.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.completed"
    messages = (await api.messages(sid))["messages"]
    result = next(m for m in messages if m["role"] == "tool")
    assert result["content"][0]["content"][0]["text"] == "Tool call denied: not now"
    types = [e["type"] for e in await api.turn_events(sid, turn_id)]
    assert "tool.called" not in types


async def test_page_sizes_and_the_reason_length_are_settings(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """Every number is a setting tests may lower (pages.*, limits.max_reason_chars)."""
    config = HOLD + (
        "limits: {max_reason_chars: 5}\n"
        "pages: {sessions: {default: 2, maximum: 3}, events: {default: 1, maximum: 1000}}\n"
    )
    d = await start_daemon(config=config)
    async with api_session(d) as http:
        api = Api(http)
        for _ in range(4):
            sid = (await api.create_session(workspace))["id"]
        _, page = await api.call("GET", "/sessions")
        assert len(page["sessions"]) == 2 and page["next_cursor"]
        status, body = await api.call("GET", "/sessions", params={"limit": "4"})
        assert status == 400 and body["error"]["details"]["errors"][0]["loc"] == ["query", "limit"]
        _, page = await api.call("GET", f"/sessions/{sid}/events")
        assert len(page["events"]) == 1
        turn_id, request = await hold_turn(api, sid)
        url = confirmation_url(sid, turn_id, request)
        status, body = await api.call("POST", url, {"decision": "deny", "reason": "too long"})
        assert status == 400 and body["error"]["details"]["errors"][0]["loc"] == ["body", "reason"]
        status, _ = await api.call("POST", url, {"decision": "deny", "reason": "short"})
        assert status == 200


async def test_confirmation_ids_wrong_turn_and_unknown_request(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = held
    sid = (await api.create_session(workspace))["id"]
    turn_id, request = await hold_turn(api, sid)
    rid = request["confirmation_request_id"]
    status, body = await api.call(
        "POST",
        f"/sessions/{sid}/turns/01M7YA76RDGJRJS6TX6XK99B3P/confirmations/{rid}",
        {"decision": "allow"},
    )
    assert status == 404 and body["error"]["code"] == "turn_not_found"
    status, body = await api.call(
        "POST",
        f"/sessions/{sid}/turns/{turn_id}/confirmations/01M7YA76RDGJRJS6TX6XK99B3P",
        {"decision": "allow"},
    )
    assert status == 404 and body["error"]["code"] == "confirmation_not_found"
    url = f"/sessions/{sid}/turns/{turn_id}/confirmations/{rid}"
    status, body = await api.call("POST", url, {"decision": "maybe"})
    assert status == 400
    # a key given twice once let the last win: this deny-then-allow applied allow
    twice = b'{"decision": "deny", "decision": "allow", "scope": "once"}'
    async with api.http.post(url, data=twice, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
        body = await r.json()
    assert body["error"]["details"]["errors"] == [
        {
            "loc": ["body"],
            "msg": 'malformed JSON: Detected duplicate key "decision" at line 1 column 33',
            "type": "json_invalid",
        }
    ]
    status, body = await api.call("POST", url, {"decision": "deny"})  # still unanswered
    assert status == 200 and body["decision"] == "deny", body
    await api.call("POST", f"/sessions/{sid}/turns/{turn_id}/cancel")


async def test_confirmation_timeout_fails_the_tool(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(
        config="tools:\n  confirmation:\n    per_tool: {read_file: prompt}\n    timeout_seconds: 1\n"
    )
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        turn_id, request = await hold_turn(api, sid)
        await api.wait_turn(sid, turn_id)
        events = await api.turn_events(sid, turn_id)
        resolved = next(e for e in events if e["type"] == "tool.confirmation_resolved")
        assert resolved["payload"]["decision"] == "timeout" and resolved["actor"] == "system"
        failed = next(e for e in events if e["type"] == "tool.failed")
        assert failed["payload"]["error_class"] == "confirmation_timeout"
        url = confirmation_url(sid, turn_id, request)
        status, body = await api.call("POST", url, {"decision": "allow"})
        assert status == 409 and body["error"]["details"]["resolution"] == "timeout"


async def test_session_scope_answer_is_remembered(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = held
    sid, turn_id, url = await held_confirmation(api, workspace)
    await api.call("POST", url, {"decision": "allow", "scope": "session"})
    await api.wait_turn(sid, turn_id)
    accepted, _terminal = await api.run_turn(sid, "use server tool again")
    types = [e["type"] for e in await api.turn_events(sid, accepted["turn_id"])]
    assert "tool.confirmation_requested" not in types and "tool.called" in types


async def test_a_deny_for_the_session_is_remembered_and_its_scope_reported_on_a_repeat(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = held
    sid, turn_id, url = await held_confirmation(api, workspace)
    status, body = await api.call("POST", url, {"decision": "deny", "scope": "session"})
    assert status == 200 and body["applied"] is True
    status, body = await api.call("POST", url, {"decision": "deny", "scope": "session"})
    assert status == 200 and body["applied"] is False
    # the same decision with the other scope would settle it otherwise: refused, and the details
    # say how it was settled, scope included (else they would read like the request itself)
    status, body = await api.call("POST", url, {"decision": "deny"})
    assert status == 409 and body["error"]["code"] == "confirmation_already_resolved"
    assert body["error"]["details"]["resolution"] == "deny"
    assert body["error"]["details"]["scope"] == "session"
    await api.wait_turn(sid, turn_id)
    accepted, _terminal = await api.run_turn(sid, "use server tool again")
    events = await api.turn_events(sid, accepted["turn_id"])
    types = [e["type"] for e in events]
    assert "tool.confirmation_requested" not in types and "tool.called" not in types
    [failed] = [e for e in events if e["type"] == "tool.failed"]
    assert failed["payload"]["error_class"] == "user_denied", failed


# ---- sticky model and swaps ------------------------------------------------------------------------


async def test_patch_idle_applies_at_once_and_clearing_restores_routing(
    api: Api, workspace: Path
) -> None:
    sid = (await api.create_session(workspace))["id"]
    status, body = await api.call("PATCH", f"/sessions/{sid}", {"active_model": "scripted"})
    assert status == 200 and body == {
        "id": sid,
        "active_model": "local:scripted",
        "swap_queued": False,
        "swap_queued_until_turn": None,
    }
    accepted, _ = await api.run_turn(sid, "hi")
    route = next(
        e for e in await api.turn_events(sid, accepted["turn_id"]) if e["type"] == "route.decided"
    )
    assert route["payload"]["chain"][route["payload"]["winner_index"]]["policy"] == "manual_sticky"
    status, body = await api.call("PATCH", f"/sessions/{sid}", {"active_model": None})
    assert status == 200 and body["swap_queued"] is False
    accepted, _ = await api.run_turn(sid, "hi again")
    route = next(
        e for e in await api.turn_events(sid, accepted["turn_id"]) if e["type"] == "route.decided"
    )
    assert route["payload"]["chain"][route["payload"]["winner_index"]]["policy"] != "manual_sticky"
    status, body = await api.call("PATCH", f"/sessions/{sid}", {})
    assert status == 400
    status, body = await api.call("PATCH", f"/sessions/{sid}", {"active_model": "nope"})
    assert status == 400 and body["error"]["code"] == "model_not_configured"


async def test_patch_mid_turn_is_queued_and_applied_for_the_next_turn(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    d, api = held
    sid = (await api.create_session(workspace))["id"]
    turn_id, _ = await hold_turn(api, sid)
    status, body = await api.call("PATCH", f"/sessions/{sid}", {"active_model": "scripted"})
    assert (
        status == 200 and body["swap_queued"] is True and body["swap_queued_until_turn"] == turn_id
    )
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["pending_swap"] == {"sticky_model": "local:scripted", "until_turn": turn_id}
    assert got["sticky_model"] is None
    # a PATCH of the title alone answers with the swap still queued, not "nothing queued"
    status, body = await api.call("PATCH", f"/sessions/{sid}", {"title": "while it runs"})
    assert status == 200 and body == {
        "id": sid,
        "active_model": "local:scripted",
        "swap_queued": True,
        "swap_queued_until_turn": turn_id,
        "title": "while it runs",
    }
    await api.call("POST", f"/sessions/{sid}/turns/{turn_id}/cancel")
    await api.wait_turn(sid, turn_id)
    await d.core.turns.wait_all()
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["sticky_model"] == "local:scripted" and got["pending_swap"] is None


# ---- end and purge ---------------------------------------------------------------------------------


async def test_delete_mid_turn_cancels_then_ends_and_refuses_later_writes(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = held
    sid = (await api.create_session(workspace))["id"]
    _turn_id, _ = await hold_turn(api, sid)
    status, _ = await api.call("DELETE", f"/sessions/{sid}")
    assert status == 200
    types = [e["type"] for e in await api.events(sid)]
    assert types[-2:] == ["turn.cancelled", "session.ended"]
    for method, path, body in (
        ("POST", f"/sessions/{sid}/turns", {"content": [{"type": "text", "text": "x"}]}),
        ("PATCH", f"/sessions/{sid}", {"active_model": None}),
        ("DELETE", f"/sessions/{sid}", None),
    ):
        status, err = await api.call(method, path, body)
        assert status == 409 and err["error"]["code"] == "session_already_ended"


async def test_a_turn_racing_the_end_is_refused_or_cancelled_never_run_after_it(
    daemon: Daemon, api: Api, workspace: Path
) -> None:
    """Once the end begins, turns and PATCH get 409. Submits, PATCHes and
    DELETEs are fired together; whatever order they land in, nothing happens after
    `session.ended` and an accepted turn ended before it."""
    for _ in range(12):
        sid = (await api.create_session(workspace))["id"]
        (submitted, accepted), (patched, _), (ended, _) = await asyncio.gather(
            api.submit(sid, "hello"),
            api.call("PATCH", f"/sessions/{sid}", {"active_model": "scripted"}),
            api.call("DELETE", f"/sessions/{sid}"),
        )
        assert ended == 200 and submitted in (202, 409) and patched in (200, 409)
        await daemon.core.turns.wait_all()
        types = [e["type"] for e in await api.events(sid)]
        assert types[-1] == "session.ended", types
        if submitted == 202:
            assert {"turn.completed", "turn.cancelled"} & set(types), types
        else:
            assert "turn.started" not in types and accepted["error"]["code"] in (
                "session_already_ended",
                "session_not_found",
            )
        _, got = await api.call("GET", f"/sessions/{sid}")
        assert got["turn_count"] == types.count("turn.started")


async def test_purge_removes_every_row_and_records_session_purged(
    api: Api, workspace: Path, daemon: Daemon
) -> None:
    sid = (await api.create_session(workspace))["id"]
    await api.run_turn(sid, "use server tool")
    # a mistyped parameter or the purge sent as a body once ended the session instead: refused
    status, body = await api.call("DELETE", f"/sessions/{sid}", params={"purged": "true"})
    assert status == 400 and body["error"]["details"]["errors"] == [
        {
            "loc": ["query", "purged"],
            "msg": "unknown query parameter; this route takes purge",
            "type": "extra_forbidden",
        }
    ]
    async with api.http.delete(f"/sessions/{sid}", json={"purge": True}) as r:
        assert r.status == 400 and r.headers["Connection"] == "close"
        error = (await r.json())["error"]
    assert error["details"]["errors"] == [
        {"loc": ["body"], "msg": "this route takes no body", "type": "extra_forbidden"}
    ]
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["ended_at"] is None
    status, body = await api.call("DELETE", f"/sessions/{sid}", params={"purge": "true"})
    assert status == 200 and body["deleted"]["messages"] >= 4
    for table, column in (
        ("sessions", "id"),
        ("messages", "session_id"),
        ("turns", "session_id"),
        ("events", "session_id"),
        ("tool_calls", "session_id"),
        ("confirmations", "session_id"),
    ):
        assert (
            await daemon.core.db.fetchone(f"SELECT 1 FROM {table} WHERE {column}=?", (sid,)) is None
        )
    await daemon.core.flush()
    row = await daemon.core.db.fetchone(
        "SELECT payload_json FROM events WHERE session_id='system' AND type='session.purged' ORDER BY seq DESC LIMIT 1"
    )
    assert sid in row["payload_json"]
    for method, path in (
        ("GET", f"/sessions/{sid}"),
        ("GET", f"/sessions/{sid}/messages"),
        ("GET", f"/sessions/{sid}/events"),
    ):
        status, _ = await api.call(method, path)
        assert status == 404
    status, body = await api.call("DELETE", f"/sessions/{sid}", params={"purge": "yes"})
    assert status == 400


async def test_ends_and_purges_sent_together_take_effect_one_after_another(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    """Each answer is the one it would get alone, after the ones before it: one purge deletes,
    the others find no session; an end beside a purge ends, the purge then deletes; a second
    end is told when the session ended."""
    d, api = held
    purge = {"purge": "true"}

    async def purges_of(sid: str, n: int) -> list[tuple[int, Any]]:
        return list(
            await asyncio.gather(
                *(api.call("DELETE", f"/sessions/{sid}", params=purge) for _ in range(n))
            )
        )

    for already_ended in (False, True):
        sid = (await api.create_session(workspace))["id"]
        await hold_turn(api, sid)  # the end waits for the turn's cancellation
        if already_ended:
            assert (await api.call("DELETE", f"/sessions/{sid}"))[0] == 200
        answers = await purges_of(sid, 4)
        assert sorted(status for status, _ in answers) == [200, 404, 404, 404], answers
        [deleted] = [body["deleted"] for status, body in answers if status == 200]
        assert deleted["messages"] >= 1 and deleted["events"] >= 1
        for status, body in answers:
            if status == 404:
                assert body["error"]["code"] == "session_not_found"
    await d.core.flush()
    purged = await d.core.db.fetchall(
        "SELECT payload_json FROM events WHERE session_id='system' AND type='session.purged'"
    )
    assert len(purged) == 2  # one per session, not one per purge

    sid = (await api.create_session(workspace))["id"]
    await hold_turn(api, sid)
    (ended, _), (purged_status, body) = await asyncio.gather(
        api.call("DELETE", f"/sessions/{sid}"),
        api.call("DELETE", f"/sessions/{sid}", params=purge),
    )
    # whichever came first: the purge deletes the session, ended or not
    assert purged_status == 200 and body["purged"] is True and ended in (200, 404), body
    assert (await api.call("GET", f"/sessions/{sid}"))[0] == 404

    sid = (await api.create_session(workspace))["id"]
    await hold_turn(api, sid)
    answers = await asyncio.gather(*(api.call("DELETE", f"/sessions/{sid}") for _ in range(3)))
    assert sorted(status for status, _ in answers) == [200, 409, 409], answers
    ended_at = next(body["ended_at"] for status, body in answers if status == 200)
    for status, body in answers:
        if status == 409:
            assert body["error"]["code"] == "session_already_ended"
            assert body["error"]["details"] == {"ended_at": ended_at}


# ---- messages and events ------------------------------------------------------------------------------


async def test_message_pages_walk_both_ways_exactly_once(
    api: Api, workspace: Path, daemon: Daemon
) -> None:
    sid = (await api.create_session(workspace))["id"]
    for i in range(58):  # 116 messages through real turns
        await api.run_turn(sid, f"message {i}")
    all_ids = [m["id"] for m in (await api.messages(sid, limit=200))["messages"]]
    assert len(all_ids) == 116
    seen: list[str] = []
    page = await api.messages(sid, limit=50)
    assert page["has_more_after"] is False
    seen = [m["id"] for m in page["messages"]]
    while page["has_more_before"]:
        page = await api.messages(sid, limit=50, before=seen[0])
        seen = [m["id"] for m in page["messages"]] + seen
    assert seen == all_ids
    forward: list[str] = []
    page = await api.messages(sid, limit=50, after="00000000000000000000000000")
    forward.extend(m["id"] for m in page["messages"])
    while page["has_more_after"]:
        page = await api.messages(sid, limit=50, after=forward[-1])
        forward.extend(m["id"] for m in page["messages"])
    assert forward == all_ids
    empty = await api.messages(sid, after=all_ids[-1])
    assert (
        empty["messages"] == []
        and empty["has_more_before"] is True
        and empty["has_more_after"] is False
    )


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "0"},
        {"limit": "201"},
        {"before": "nope"},
        {"before": "01M7YA76RDGJRJS6TX6XK99B3P", "after": "01M7YA76RDGJRJS6TX6XK99B3P"},
    ],
)
async def test_bad_message_queries_are_400(
    api: Api, workspace: Path, query: dict[str, str]
) -> None:
    sid = (await api.create_session(workspace))["id"]
    status, body = await api.call("GET", f"/sessions/{sid}/messages", params=query)
    assert status == 400 and body["error"]["code"] == "validation_error"


async def test_events_filters_ranges_and_cursor_walk(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    for i in range(3):
        await api.run_turn(sid, f"use server tool {i}")
    everything = await api.events(sid)
    assert [e["seq"] for e in everything] == list(range(1, len(everything) + 1))
    only = await api.events(sid, event_types="turn.started,turn.completed")
    assert {e["type"] for e in only} == {"turn.started", "turn.completed"} and len(only) == 6
    mid = everything[4]["id"]
    status, body = await api.call(
        "GET", f"/sessions/{sid}/events", params={"since": mid, "until": everything[9]["id"]}
    )
    assert [e["seq"] for e in body["events"]] == [6, 7, 8, 9, 10]
    walked: list[int] = []
    cursor = None
    while True:
        params = {"limit": 7, **({"cursor": cursor} if cursor else {})}
        _, body = await api.call("GET", f"/sessions/{sid}/events", params=params)
        walked.extend(e["seq"] for e in body["events"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert walked == [e["seq"] for e in everything]
    for bad in (
        {"event_types": "text.delta"},
        {"limit": "1001"},
        {"since": "01M7YA76RDGJRJS6TX6XK99B3P"},
        {"cursor": "zz"},
    ):
        status, body = await api.call("GET", f"/sessions/{sid}/events", params=bad)
        assert status == 400, bad
    messages = {
        "text.delta,nope": "unknown event types: text.delta, nope",
        ",": "no event type named (leave event_types out for every type)",
    }
    for value, said in messages.items():
        _, body = await api.call("GET", f"/sessions/{sid}/events", params={"event_types": value})
        assert body["error"]["details"]["errors"][0]["msg"] == said


async def test_decimal_costs_are_strings_everywhere(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    _, terminal = await api.run_turn(sid, "hello")
    assert terminal["payload"]["total_cost_usd"] == "0"
    completed = next(e for e in await api.events(sid) if e["type"] == "llm.call_completed")
    assert completed["payload"]["cost_usd"] == "0"
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["cost_so_far_usd"] == "0"


# ---- body and media-type failures ---------------------------------------------------------------------

BODY_ROUTES = [
    ("POST", "/sessions"),
    ("PATCH", "/sessions/{sid}"),
    ("POST", "/sessions/{sid}/turns"),
    (
        "POST",
        "/sessions/{sid}/turns/01M7YA76RDGJRJS6TX6XK99B3P/confirmations/01M7YA76RDGJRJS6TX6XK99B3P",
    ),
]


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
@pytest.mark.parametrize(
    "headers_body",
    [
        ({"Content-Type": "text/plain"}, b"{}"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, b"a=1"),
        ({}, b"{}"),
    ],
)
async def test_non_json_bodies_are_415(
    api: Api, workspace: Path, method: str, path: str, headers_body: tuple
) -> None:
    sid = (await api.create_session(workspace))["id"]
    headers, body = headers_body
    async with api.http.request(
        method, path.format(sid=sid), data=body, headers=headers, skip_auto_headers=["Content-Type"]
    ) as r:
        assert r.status == 415
        payload = await r.json()
    assert payload["error"]["code"] == "unsupported_media_type"


async def test_empty_cancel_body_is_accepted_without_content_type(
    held: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = held
    sid = (await api.create_session(workspace))["id"]
    turn_id, _ = await hold_turn(api, sid)
    async with api.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel") as r:
        assert r.status == 202


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        (b"{not json", ["body"]),
        (b"[1,2]", ["body"]),
        (b"null", ["body"]),  # not "no body" (it was a 500)
        (b'{"workspace_path": 5}', ["body", "workspace_path"]),
        (b'{"workspace_path": "/tmp", "extra": "secret-value"}', ["body", "extra"]),
        (b"\xff\xfe", ["body"]),
    ],
)
async def test_bad_bodies_are_400_with_loc_and_no_echo(
    api: Api, raw: bytes, loc: list[str]
) -> None:
    async with api.http.post(
        "/sessions", data=raw, headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == 400
        text = await r.text()
    body = __import__("json").loads(text)
    assert body["error"]["code"] == "validation_error"
    assert body["error"]["details"]["errors"][0]["loc"] == loc
    assert "secret-value" not in text


async def test_a_lone_surrogate_in_a_turn_is_400_and_the_session_goes_on(
    api: Api, workspace: Path
) -> None:
    """JSON may escape a lone surrogate; it cannot be stored or sent as UTF-8 (it was a 500).
    A key given twice is refused too, never last-wins."""
    twice = f'{{"workspace_path": "/nonexistent", "workspace_path": "{workspace}"}}'.encode()
    async with api.http.post(
        "/sessions", data=twice, headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == 400
        body = await r.json()
    assert body["error"]["details"]["errors"][0]["msg"] == (
        'malformed JSON: Detected duplicate key "workspace_path" at line 1 column 53'
    )
    sid = (await api.create_session(workspace))["id"]
    raw = b'{"content": [{"type": "text", "text": "bad \\ud800 text"}]}'
    async with api.http.post(
        f"/sessions/{sid}/turns", data=raw, headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == 400
        body = await r.json()
    assert body["error"]["code"] == "validation_error"
    assert body["error"]["details"]["errors"][0]["type"] == "json_invalid"
    status, accepted = await api.call(
        "POST", f"/sessions/{sid}/turns", {"content": [{"type": "text", "text": "fine \U0001f600"}]}
    )
    assert status == 202, accepted


def _junk_bodies(seed: int, count: int) -> list[Any]:
    """JSON values shaped like what the body routes read, with the wrong types and sizes."""
    rng = random.Random(seed)
    leaves: list[Any] = [None, True, 0, -1, 2**70, 1.5, "", "x" * 3000, "../..", [], {}, [1, "a"]]
    keys = [
        "content",
        "type",
        "text",
        "workspace_path",
        "decision",
        "scope",
        "reason",
        "title",
        "initial_active_model",
        "active_model",
        "per_message_override",
        "source",
        "image",
    ]

    def value(depth: int) -> Any:
        if depth > 2 or rng.random() < 0.4:
            return rng.choice(leaves)
        if rng.random() < 0.4:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(keys): value(depth + 1) for _ in range(rng.randint(0, 4))}

    return [None, *(value(0) for _ in range(count))]


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
async def test_no_malformed_body_gets_a_5xx(
    api: Api, workspace: Path, method: str, path: str
) -> None:
    """Bad input is always the client's error, in the envelope (fuzzing found two 500s)."""
    sid = (await api.create_session(workspace))["id"]
    for body in _junk_bodies(seed=len(path), count=40):
        async with api.http.request(
            method,
            path.format(sid=sid),
            data=json.dumps(body),
            headers={"Content-Type": "application/json"},
        ) as r:
            assert r.status < 500, (body, await r.text())
            if r.status >= 400:
                assert (await r.json())["error"]["code"] in ERROR_CODES


async def test_oversized_body_is_413_and_stores_nothing(
    api: Api, workspace: Path, daemon: Daemon
) -> None:
    sid = (await api.create_session(workspace))["id"]
    big = b'{"content":[{"type":"text","text":"' + b"x" * (16 * 1024 * 1024 + 10) + b'"}]}'
    async with api.http.post(
        f"/sessions/{sid}/turns", data=big, headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == 413
        body = await r.json()
    assert body["error"]["details"]["max_bytes"] == 16 * 1024 * 1024
    assert (await api.messages(sid))["messages"] == []


async def test_foreign_origin_is_refused_on_state_changing_requests(
    api: Api, workspace: Path, daemon: Daemon
) -> None:
    sid = (await api.create_session(workspace))["id"]
    for method, path, body in (
        ("POST", "/sessions", {"workspace_path": str(workspace)}),
        ("DELETE", f"/sessions/{sid}", None),
    ):
        status, err = await api.call(method, path, body, headers={"Origin": "http://evil.example"})
        assert status == 403 and err["error"]["code"] == "origin_not_allowed"
    status, _ = await api.call(
        "POST", "/sessions", {"workspace_path": str(workspace)}, headers={"Origin": "null"}
    )
    assert status == 403
    status, _ = await api.call(
        "POST",
        "/sessions",
        {"workspace_path": str(workspace)},
        headers={"Origin": f"http://127.0.0.1:{daemon.port}"},
    )
    assert status == 201
    status, _ = await api.call("GET", "/sessions", headers={"Origin": "http://evil.example"})
    assert status == 200


async def test_internal_error_is_generic_and_logged(
    api: Api, workspace: Path, daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    sid = (await api.create_session(workspace))["id"]

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("very secret internal detail")

    daemon.core.sessions.view = explode  # a forced handler failure inside the real app
    status, body = await api.call("GET", f"/sessions/{sid}")
    assert status == 500 and body["error"] == {
        "code": "internal_error",
        "message": "internal error",
        "details": {},
    }
    assert "very secret internal detail" in caplog.text


async def test_every_error_code_seen_is_in_the_closed_table(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    probes = [
        ("GET", "/nope", None),
        ("PUT", "/sessions", None),
        ("POST", f"/sessions/{sid}/turns", {"content": []}),
        ("GET", "/sessions/sess_x", None),
        ("POST", "/sessions", {"workspace_path": "rel"}),
    ]
    for method, path, body in probes:
        status, err = await api.call(method, path, body)
        assert err["error"]["code"] in ERROR_CODES and ERROR_CODES[err["error"]["code"]] == status


async def test_a_corrupt_stored_row_never_makes_the_session_unreadable(
    api: Api, workspace: Path, daemon: Daemon
) -> None:
    sid = (await api.create_session(workspace))["id"]
    await api.run_turn(sid, "first")
    messages = (await api.messages(sid))["messages"]
    async with daemon.core.db.write() as conn:
        await conn.execute(
            "UPDATE messages SET content_json='{not json' WHERE id=?", (messages[1]["id"],)
        )
        await conn.execute(
            "UPDATE messages SET content_json=? WHERE id=?",
            ('[{"type":"audio","data":"x"},{"type":"text","text":"first"}]', messages[0]["id"]),
        )
    daemon.core.session_cache.forget(sid)  # make the next turn read the rows back from SQLite
    daemon.core.session_cache.created_here(sid)
    page = (await api.messages(sid))["messages"]
    assert page[0]["content"] == [{"type": "text", "text": "first"}]
    assert page[1]["content"] == [] and page[1]["metadata"]["status"] == "error"
    _, terminal = await api.run_turn(sid, "second")
    assert terminal["type"] == "turn.completed"


async def test_a_turn_over_its_time_limit_is_cancelled_with_reason_timeout(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(config=HOLD, limits={"turn_timeout_s": 0.5})
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        turn_id, _ = await hold_turn(api, sid)  # waits on a confirmation nobody answers
        terminal = await api.wait_turn(sid, turn_id)
        assert terminal["type"] == "turn.cancelled" and terminal["payload"]["reason"] == "timeout"
        assert terminal["actor"] == "system"
        types = [e["type"] for e in await api.turn_events(sid, turn_id)]
        assert (
            types[-2:] == ["tool.failed", "turn.cancelled"]
            and "tool.confirmation_resolved" not in types
        )
