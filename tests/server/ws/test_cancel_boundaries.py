"""Cancel cases C1 and C4-at-the-boundary, as every subscribed socket sees them.

tests/core/turns/test_cancel_boundaries.py proves these two cases at core level (stored event types);
tests/server/ws/test_cancel.py covers C2, C3, C4 behind a confirmation wait and C5 on a socket.
This module closes the gap issue #6 names: the exact frame sequence a WebSocket subscriber gets
for C1 and for C4 with no confirmation, and that a second socket gets the identical sequence.

Each case is reached deterministically, never by sleeping:
- C1 (after `route.decided`, before `llm.call_started`): `request_cancel` right after
  `submit`, in the same tick, before the runner task first runs. A socket `cancel` frame cannot
  be held at this point: the runner does no await between `route.decided` and
  `llm.call_started`, and the frame's core call (`TurnsService.cancel`) awaits two reads first.
- C4 from an inline bus subscriber on `llm.call_completed{tool_use}` (synchronous inside
  `emit`, the same `request_cancel` the frame's core call makes).
- C4 from a real `cancel` frame: the global tool slot (`max_concurrent_global: 1`) is held by
  another session's running shell, so the turn's tools wait for it after
  `llm.call_completed{tool_use}` and none can reach `tool.called` until the frame lands.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.core.events.envelope import AnyEvent
from metis.core.turns.service import TurnRequest
from metis.testing import FakeProviderServer, FakeReply
from tests.api import TERMINAL, Api
from tests.ws_client import (
    STREAMING,
    Ws,
    check_turn_grammar,
    fake_models,
    types_of,
)

ALL_AUTO = "tools:\n  confirmation:\n    default: {read: auto, write: auto, execute: auto}\n"
ONE_GLOBAL_SLOT = (
    "tools:\n  max_concurrent_global: 1\n"
    "  confirmation:\n    default: {read: auto, write: auto, execute: auto}\n"
)
CANCELLED_TEXT = "Tool call cancelled"


def is_event(kind: str, turn_id: str | None = None) -> Callable[[dict[str, Any]], bool]:
    return lambda f: (
        f.get("type") == "event"
        and f["event"]["type"] == kind
        and (turn_id is None or f["event"]["turn_id"] == turn_id)
    )


def live_events(client: Ws) -> list[dict[str, Any]]:
    return [f["event"] for f in client.frames if f.get("type") == "event" and not f.get("catch_up")]


def assert_cancelled_by_user(terminal: dict[str, Any], *, llm_calls: int) -> None:
    """`turn.cancelled`: actor user, reason user_cancel, the T counters of what really ran."""
    assert terminal["type"] == "turn.cancelled"
    assert terminal["actor"] == "user"
    payload = terminal["payload"]
    assert payload["reason"] == "user_cancel"
    assert payload["llm_call_count"] == llm_calls
    assert payload["tool_call_count"] == 0  # no tool.called


def assert_c4_tail(events: list[dict[str, Any]], tool_names: list[str]) -> None:
    """C4: `llm.call_completed{tool_use}` → one `tool.failed{cancelled}` per tool_use, in
    tool_use order → `turn.cancelled`; none of the events forbidden after the cancel."""
    types = types_of(events)
    n = len(tool_names)
    assert types.count("llm.call_started") == 1 and types.count("message.complete") == 1, types
    boundary = types.index("llm.call_completed")
    assert types[boundary - 1] == "message.complete"
    assert types[boundary + 1 :] == ["tool.failed"] * n + ["turn.cancelled"], types
    complete = events[boundary - 1]["payload"]
    assert complete["stop_reason"] == "tool_use"
    assert events[boundary]["payload"]["stop_reason"] == "tool_use"
    assert events[boundary]["payload"]["tool_use_count"] == n
    tool_uses = [b for b in complete["final_content"] if b["type"] == "tool_use"]
    assert [b["name"] for b in tool_uses] == tool_names
    failures = [e["payload"] for e in events[boundary + 1 : boundary + 1 + n]]
    assert [p["tool_use_id"] for p in failures] == [b["id"] for b in tool_uses]  # tool_use order
    assert [p["tool_name"] for p in failures] == tool_names
    for p in failures:
        assert p["error_class"] == "cancelled" and p["message"] == CANCELLED_TEXT, p
        assert p["result_message_id"]
    forbidden = {"tool.called", "tool.confirmation_resolved", "tool.completed", "llm.call_failed"}
    assert not forbidden & set(types), types
    assert_cancelled_by_user(events[-1], llm_calls=1)


async def assert_cancelled_results_stored(api: Api, sid: str, turn_id: str, n: int) -> None:
    """Every tool_use of the complete message got a stored is_error result."""
    messages = [m for m in (await api.messages(sid))["messages"] if m["turn_id"] == turn_id]
    assert [m["role"] for m in messages] == ["user", "assistant"] + ["tool"] * n
    for m in messages[2:]:
        block = m["content"][0]
        assert block["type"] == "tool_result" and block["is_error"] is True
        assert block["content"][0]["text"] == CANCELLED_TEXT


async def test_c1_every_socket_sees_turn_cancelled_right_after_route_decided(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    """C1: turn.started → route.decided → turn.cancelled{user_cancel}, nothing llm.* or
    streaming, the same on two sockets; a later cancel frame for the turn emits nothing."""
    d, api = await make_api()
    core = d.core
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    other, _ = await Ws.subscribed(api, sid)

    accepted = await core.turns.submit(TurnRequest(sid, [{"type": "text", "text": "hello"}]))
    slot = core.slots.get(sid)  # same tick: the runner task has not run yet
    assert slot is not None and slot.turn_id == accepted.turn_id
    assert core.turns.request_cancel(slot, "user_cancel") is True

    events = await client.turn(accepted.turn_id)
    check_turn_grammar(events)
    assert types_of(events) == ["turn.started", "route.decided", "turn.cancelled"]
    assert events[1]["payload"]["outcome"] == "chose"
    assert events[2]["parent_event_id"] == events[0]["id"]
    assert_cancelled_by_user(events[2], llm_calls=0)
    assert await other.turn(accepted.turn_id) == events  # every socket: the same sequence

    # A repeated cancel, as a frame, is a no-op: once it is handled (the pong after it), the
    # next turn's events follow turn 1's terminal with nothing in between.
    await client.send({"type": "cancel", "turn_id": accepted.turn_id})
    await client.send({"type": "ping", "nonce": "after-cancel"})
    await client.until(lambda f: f.get("type") == "pong")
    status, second = await api.submit(sid, "hello again")
    assert status == 202, second
    for c in (client, other):
        await c.turn(second["turn_id"])
        seen = live_events(c)
        assert seen[:3] == events
        assert {e["turn_id"] for e in seen[3:]} == {second["turn_id"]}
        assert seen[3]["type"] == "turn.started" and seen[-1]["type"] in TERMINAL

    messages = (await api.messages(sid))["messages"]
    assert [m["role"] for m in messages if m["turn_id"] == accepted.turn_id] == ["user"]
    for c in (client, other):
        await c.close()


async def test_c4_cancel_at_the_boundary_fails_each_tool_in_order_on_every_socket(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    """C4 with no confirmation: the cancel lands inside `emit` of llm.call_completed{tool_use};
    every socket then sees one tool.failed{cancelled} per tool_use in order → turn.cancelled,
    and no tool.called, llm.call_failed or second message.complete."""
    d, api = await make_api(config=ALL_AUTO)
    core = d.core
    sid = (await api.create_session(workspace))["id"]

    def cancel_at_boundary(event: AnyEvent) -> None:
        if event.type == "llm.call_completed" and event.payload["stop_reason"] == "tool_use":
            slot = core.slots.get(event.session_id)
            assert slot is not None
            core.turns.request_cancel(slot, "user_cancel")

    core.bus.subscribe("test-boundary", cancel_at_boundary)
    client, _ = await Ws.subscribed(api, sid)
    other, _ = await Ws.subscribed(api, sid)
    files_before = sorted(p.name for p in workspace.iterdir())

    status, accepted = await api.submit(sid, "use all tools")
    assert status == 202, accepted
    turn_id = accepted["turn_id"]
    events = await client.turn(turn_id)
    check_turn_grammar(events)
    types = types_of(events)
    boundary = types.index("llm.call_completed")
    assert types[:3] == ["turn.started", "route.decided", "llm.call_started"]
    assert set(types[3:boundary]) <= set(STREAMING) and types[3] == "message.start"
    names = [
        b["name"]
        for b in events[boundary - 1]["payload"]["final_content"]
        if b["type"] == "tool_use"
    ]
    assert len(names) == 6  # the scripted model's "use all tools": every builtin tool
    assert_c4_tail(events, names)
    assert await other.turn(turn_id) == events  # every socket: the same sequence

    assert sorted(p.name for p in workspace.iterdir()) == files_before  # nothing ran
    await assert_cancelled_results_stored(api, sid, turn_id, len(names))
    for c in (client, other):
        await c.close()


async def test_c4_cancel_frame_while_tools_wait_for_a_slot_fails_each_tool_in_order(
    fake: FakeProviderServer, make_api: Callable[..., Any], workspace: Path, tmp_path: Path
) -> None:
    """C4 from a real `cancel` frame: another session's shell holds the only global tool slot,
    so after llm.call_completed{tool_use} no tool of this turn can be called. The frame then
    gives every socket tool.failed{cancelled} per tool_use in order → turn.cancelled."""
    _, api = await make_api(models=fake_models(fake), config=ONE_GLOBAL_SLOT)

    # Session A occupies the single global tool slot with a command that runs until cancelled.
    holder_ws = tmp_path / "holder"
    holder_ws.mkdir()
    holder = (await api.create_session(holder_ws))["id"]
    holder_client, _ = await Ws.subscribed(api, holder)
    fake.enqueue("anthropic", FakeReply.call("shell", {"command": "sleep 30"}))
    status, held = await api.submit(holder, "hold the slot")
    assert status == 202, held
    await holder_client.until(is_event("tool.called", held["turn_id"]))

    # Session B: three tools, each with a visible side effect if it ever ran.
    names = ["write_file", "shell", "read_file"]
    fake.enqueue(
        "anthropic",
        FakeReply.call(
            "write_file",
            {"path": "new.txt", "content": "x"},
            more_calls=[
                {"name": "shell", "input": {"command": "touch ran.txt"}},
                {"name": "read_file", "input": {"path": "README.md"}},
            ],
        ),
    )
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    other, _ = await Ws.subscribed(api, sid)
    files_before = sorted(p.name for p in workspace.iterdir())
    status, accepted = await api.submit(sid, "use them")
    assert status == 202, accepted
    turn_id = accepted["turn_id"]
    await client.until(is_event("llm.call_completed", turn_id))
    await client.send({"type": "cancel", "turn_id": turn_id})
    events = await client.turn(turn_id)
    check_turn_grammar(events)
    assert_c4_tail(events, names)
    assert await other.turn(turn_id) == events  # every socket: the same sequence
    assert sorted(p.name for p in workspace.iterdir()) == files_before  # nothing ran
    await assert_cancelled_results_stored(api, sid, turn_id, len(names))

    # Session A was untouched by B's cancel: its tool is still running until its own cancel.
    assert not any(
        e["turn_id"] == held["turn_id"] and e["type"] in TERMINAL
        for e in live_events(holder_client)
    )
    await holder_client.send({"type": "cancel", "turn_id": held["turn_id"]})
    held_events = await holder_client.turn(held["turn_id"])
    tail = types_of(held_events)[types_of(held_events).index("tool.called") :]
    assert tail == ["tool.called", "tool.failed", "turn.cancelled"]
    for c in (client, other, holder_client):
        await c.close()
