"""Answer validation of a resolution turn.

Every refused request must leave history, the pending set and the session configuration exactly
as they were: nothing is stored before all answers match the pending calls once each.
"""

from __future__ import annotations

from typing import Any

import pytest

from metis.server.runner import Daemon
from tests.aap.client import WEATHER, AapClient, permission, tool_result


async def _snapshot(daemon: Daemon, aap: AapClient, sid: str) -> tuple[Any, ...]:
    rows = await daemon.core.db.fetchall(
        "SELECT (SELECT COUNT(*) FROM messages WHERE session_id=?) AS m, "
        "(SELECT COUNT(*) FROM turns WHERE session_id=?) AS t, "
        "(SELECT COUNT(*) FROM confirmations WHERE session_id=? AND status='pending') AS c, "
        "(SELECT options_json || agent_tools_json || client_tools_json FROM aap_sessions "
        "WHERE session_id=?) AS cfg",
        (sid, sid, sid, sid),
    )
    info = await aap.request("GET", f"/sessions/{sid}")
    return tuple(rows[0]), await aap.history(sid), info.body


@pytest.fixture
async def suspended(
    daemon_and_aap: tuple[Daemon, AapClient],
) -> tuple[Daemon, AapClient, str, dict[str, str]]:
    """A session suspended on one permission (list_dir) and one client call (get_weather)."""
    daemon, aap = daemon_and_aap
    sid = await aap.create(tools=[{"name": "list_dir"}], client_tools=[WEATHER])
    reply = await aap.say(sid, "use all tools")
    assert reply.stop == "tool_use"
    calls = {c["name"]: c["toolCallId"] for c in reply.tool_calls()}
    return daemon, aap, sid, calls


def _answers(calls: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {
        "grant": permission(calls["list_dir"], True),
        "result": tool_result(calls["get_weather"], "sunny"),
        "grant_as_result": tool_result(calls["list_dir"], "pretend"),
        "result_as_grant": permission(calls["get_weather"], True),
        "stranger": permission("tu_01ARZ3NDEKTSV4RRFFQ69G5FAV", True),
    }


CASES = {
    "missing": (["grant"], {"missing": ["get_weather"]}),
    "duplicate": (["grant", "result", "result"], {"duplicate": ["get_weather"]}),
    "unknown": (["grant", "result", "stranger"], {"unknown": ["tu_01ARZ3NDEKTSV4RRFFQ69G5FAV"]}),
    "wrong_kind": (["grant_as_result", "result"], {"wrong_kind": ["list_dir"]}),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_mismatched_answers_are_refused_with_nothing_stored(
    suspended: tuple[Daemon, AapClient, str, dict[str, str]], case: str
) -> None:
    daemon, aap, sid, calls = suspended
    before = await _snapshot(daemon, aap, sid)
    picks, expected = CASES[case]
    answers = _answers(calls)
    reply = await aap.turn(
        sid,
        [answers[p] for p in picks],
        "delta",
        agent={"options": {"model": "auto"}},
        tools=[WEATHER, {**WEATHER, "name": "extra_tool"}],
    )
    assert reply.status == 400 and reply.error == "invalid_tool_answers", reply.body
    details = reply.body["error"]["details"]
    for key, names in expected.items():
        ids = [calls.get(n, n) for n in names]
        assert details[key] == ids
        assert all(i in reply.body["error"]["message"] for i in ids)
    assert await _snapshot(daemon, aap, sid) == before
    # the calls are still pending: the right answers are accepted afterwards
    good = await aap.turn(sid, [answers["grant"], answers["result"]])
    assert good.status == 200 and good.stop == "end_turn"
    history = await aap.history(sid)
    assert not any(m["role"] == "tool_permission" for m in history)


async def test_a_user_message_while_calls_are_pending_is_refused(
    suspended: tuple[Daemon, AapClient, str, dict[str, str]],
) -> None:
    daemon, aap, sid, calls = suspended
    before = await _snapshot(daemon, aap, sid)
    reply = await aap.say(sid, "never mind")
    assert reply.status == 400 and reply.error == "invalid_tool_answers"
    assert set(reply.body["error"]["details"]["missing"]) == set(calls.values())
    mixed = await aap.turn(
        sid, [{"role": "user", "content": "hi"}, permission(calls["list_dir"], True)]
    )
    assert mixed.status == 400 and mixed.error == "invalid_tool_answers"
    assert await _snapshot(daemon, aap, sid) == before


BAD_IMAGE = [{"type": "image", "url": "data:image/png;base64,@@@"}]


async def test_answers_are_judged_before_their_content(
    suspended: tuple[Daemon, AapClient, str, dict[str, str]],
) -> None:
    daemon, aap, sid, calls = suspended
    before = await _snapshot(daemon, aap, sid)
    stranger = "tu_01ARZ3NDEKTSV4RRFFQ69G5FAV"
    unknown = await aap.turn(
        sid,
        [
            permission(calls["list_dir"], True),
            tool_result(calls["get_weather"], BAD_IMAGE),
            permission(stranger, True),
        ],
    )
    assert unknown.status == 400 and unknown.error == "invalid_tool_answers", unknown.body
    assert unknown.body["error"]["details"]["unknown"] == [stranger]
    pending = await aap.turn(sid, [{"role": "user", "content": BAD_IMAGE}])
    assert pending.status == 400 and pending.error == "invalid_tool_answers", pending.body
    matched = await aap.turn(
        sid, [permission(calls["list_dir"], True), tool_result(calls["get_weather"], BAD_IMAGE)]
    )
    assert matched.status == 400 and matched.error == "invalid_content", matched.body
    assert await _snapshot(daemon, aap, sid) == before


async def test_answers_while_nothing_is_pending_are_refused(aap: AapClient) -> None:
    sid = await aap.create(client_tools=[WEATHER])
    await aap.say(sid, "hello")
    reply = await aap.turn(sid, [tool_result("tu_01ARZ3NDEKTSV4RRFFQ69G5FAV", "x")])
    assert reply.status == 400 and reply.error == "invalid_tool_answers"
    assert reply.body["error"]["details"]["unknown"] == ["tu_01ARZ3NDEKTSV4RRFFQ69G5FAV"]
    assert [m["role"] for m in await aap.history(sid)] == ["user", "assistant"]


async def test_resolution_turn_events_follow_the_contract(
    suspended: tuple[Daemon, AapClient, str, dict[str, str]],
) -> None:
    daemon, aap, sid, calls = suspended
    reply = await aap.turn(
        sid,
        [tool_result(calls["get_weather"], "sunny"), permission(calls["list_dir"], False, "no")],
    )
    assert reply.status == 200
    await daemon.core.flush()
    turn = await daemon.core.db.fetchone(
        "SELECT id, trigger, resumes_turn_id, user_message_id FROM turns WHERE session_id=? "
        "ORDER BY ordinal DESC LIMIT 1",
        (sid,),
    )
    assert turn["trigger"] == "tool_resolution" and turn["user_message_id"] is None
    rows = await daemon.core.db.fetchall(
        "SELECT type, payload_json FROM events WHERE turn_id=? ORDER BY seq", (turn["id"],)
    )
    types = [r["type"] for r in rows]
    assert types[:5] == [
        "turn.started",
        "route.decided",
        "tool.confirmation_resolved",
        "tool.failed",
        "tool.completed",
    ], types
    import json

    started = json.loads(rows[0]["payload_json"])
    assert (
        started["trigger"] == "tool_resolution"
        and started["resumes_turn_id"] == turn["resumes_turn_id"]
    )
    assert json.loads(rows[3]["payload_json"])["error_class"] == "user_denied"
    statuses = await daemon.core.db.fetchall(
        "SELECT id, status FROM tool_calls WHERE session_id=?", (sid,)
    )
    assert {r["status"] for r in statuses} == {"completed", "failed"}
    confirmations = await daemon.core.db.fetchall(
        "SELECT status, resolved_in_turn_id, reason FROM confirmations WHERE session_id=?", (sid,)
    )
    assert [tuple(r) for r in confirmations] == [("denied", turn["id"], "no")]


async def test_a_turn_of_the_wrong_shape_is_refused_before_the_session_is_looked_up(
    aap: AapClient,
) -> None:
    """No messages, or two user messages, is a malformed request (a shape error, as
    `"messages": 5` is), whichever session it names and whatever overrides it carries: the
    shape is judged with the body, before the session (404) and the overrides (400)."""
    unknown = "sess_01ARZ3NDEKTSV4RRFFQ69G5FAV"
    real = await aap.create()
    user = {"role": "user", "content": "hi"}
    for messages in ([], [user, user]):
        for client in (aap, aap.v1):
            for sid in (unknown, real):
                reply = await client.turn(sid, messages)
                assert reply.status == 400 and reply.error == "validation_error", (sid, messages)
            bad_override = {"agent": {"options": {"nope": "x"}}}
            reply = await client.turn(real, messages, **bad_override)
            assert reply.status == 400 and reply.error == "validation_error", reply.body
    assert await aap.history(real) == []
