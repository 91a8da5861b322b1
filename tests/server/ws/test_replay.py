"""Snapshot, replay and the gap-free hand-off.

Events for volume are produced through real REST calls (PATCH emits `session.model_changed`) or
straight on the real bus; the hand-off tests inject a delay through the hand-off's test hook
(`metis.server.ws.handoff.HOOKS`), which runs exactly between the hand-off point and the store reads.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.core.canonical.times import now_us
from metis.core.events.envelope import AnyEvent
from metis.core.store.prune import prune_events
from metis.server.runner import Daemon
from metis.server.ws import handoff
from tests.api import Api, api_session
from tests.helpers import HOLD, model_changed, text_delta
from tests.ws_client import Ws, events_of, types_of


async def patch_model(api: Api, sid: str, n: int) -> None:
    """`n` real bus events through REST (each PATCH emits `session.model_changed`)."""
    for i in range(n):
        status, _ = await api.call(
            "PATCH", f"/sessions/{sid}", {"active_model": "local:scripted" if i % 2 else None}
        )
        assert status == 200


# ---- snapshot (tests 2, 24) ---------------------------------------------------------------------


async def test_snapshot_matches_the_state_at_its_event(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    for text in ("one", "please use server tool", "three"):
        await api.run_turn(sid, text)
    client = await Ws.open(api, sid)
    ack = await client.subscribe(snapshot=True)
    assert ack["snapshot"] is True and ack["replay_event_count"] == 0
    snap = await client.recv()
    assert snap["type"] == "snapshot"
    stored_events = await api.events(sid)
    assert snap["snapshot_at_event_id"] == stored_events[-1]["id"]
    assert snap["snapshot_at_seq"] == stored_events[-1]["seq"]
    _status, session = await api.call("GET", f"/sessions/{sid}")
    for key in ("attach_token", "attach_token_expires_at", "ws_url"):
        session.pop(key)
    assert snap["session"] == session
    assert snap["session"]["turn_count"] == 3 and snap["session"]["current_turn_id"] is None
    assert snap["messages"] == (await api.messages(sid))["messages"]
    assert snap["has_more_before"] is False
    accepted, _ = await api.run_turn(sid, "after the snapshot")
    later = await client.turn(accepted["turn_id"])
    assert all(e["seq"] > snap["snapshot_at_seq"] for e in later if "seq" in e)
    await client.close()


async def test_snapshot_holds_the_newest_messages_and_pages_older_over_rest(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(websocket={"snapshot_messages": 3})
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        for text in ("one", "two", "three"):
            await api.run_turn(sid, text)
        client = await Ws.open(api, sid)
        await client.subscribe(snapshot=True)
        snap = await client.recv()
        everything = (await api.messages(sid))["messages"]
        assert snap["messages"] == everything[-3:] and snap["has_more_before"] is True
        older = await api.messages(sid, before=snap["messages"][0]["id"])
        assert older["messages"] == everything[:-3]
        await client.close()


async def test_snapshot_during_a_confirmation_wait_lists_the_pending_request(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    _, api = await make_api(config=HOLD)
    sid = (await api.create_session(workspace))["id"]
    status, accepted = await api.submit(sid, "please use server tool")
    assert status == 202
    requested = await api.wait_for_event(sid, lambda e: e["type"] == "tool.confirmation_requested")
    client = await Ws.open(api, sid)
    await client.subscribe(snapshot=True)
    snap = await client.recv()
    session = snap["session"]
    assert session["current_turn_id"] == accepted["turn_id"]
    assert session["current_turn_status"] == "in_flight"
    [pending] = session["pending_confirmations"]
    assert pending["confirmation_request_id"] == requested["payload"]["confirmation_request_id"]
    assert pending["requested_event_id"] == requested["id"]
    assert snap["snapshot_at_event_id"] == requested["id"]
    # the assistant message holding the tool use is committed and in the snapshot
    assert snap["messages"][-1]["id"] == requested["payload"]["message_id"]
    status, _ = await api.call(
        "POST",
        f"/sessions/{sid}/turns/{accepted['turn_id']}/confirmations/"
        f"{pending['confirmation_request_id']}",
        {"decision": "allow"},
    )
    assert status == 200
    events = await client.turn(accepted["turn_id"])
    assert types_of(events)[0] == "tool.confirmation_resolved"
    await client.close()


# ---- replay (tests 3, 4, 5, 25) -----------------------------------------------------------------


async def test_reconnect_with_since_gets_exactly_the_missed_events(
    api: Api, workspace: Path
) -> None:
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    accepted, _ = await api.run_turn(sid, "before leaving")
    seen = await client.turn(accepted["turn_id"])
    cursor = [e for e in seen if "id" in e][-1]
    await client.close()
    await api.run_turn(sid, "while away")
    await patch_model(api, sid, 3)
    missed = [e for e in await api.events(sid) if e["seq"] > cursor["seq"]]
    again, ack = await Ws.subscribed(api, sid, since=cursor["id"])
    assert ack["since"] == cursor["id"] and ack["replay_event_count"] == len(missed)
    replayed = await again.take(len(missed))
    assert events_of(replayed) == missed  # a replayed event equals GET …/events (test 25)
    assert all(not f.get("catch_up") for f in replayed)
    await patch_model(api, sid, 1)  # then live, exactly once
    live = await again.recv()
    assert live["event"]["seq"] == missed[-1]["seq"] + 1
    await again.close()


async def test_replayed_event_equals_its_live_delivery(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    first = (await api.events(sid))[0]
    live, _ = await Ws.subscribed(api, sid)
    accepted, _ = await api.run_turn(sid, "please use server tool")
    delivered = [e for e in await live.turn(accepted["turn_id"]) if "id" in e]
    again, ack = await Ws.subscribed(api, sid, since=first["id"])
    replayed = events_of(await again.take(ack["replay_event_count"]))
    assert replayed == delivered
    for client in (live, again):
        await client.close()


async def test_replay_honours_the_filter(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    first = (await api.events(sid))[0]
    await api.run_turn(sid, "please use server tool")
    stored = [e for e in await api.events(sid) if e["seq"] > first["seq"]]
    for filter_, keep in (
        (
            {"event_types": ["turn.started", "tool.called"]},
            lambda e: e["type"] in ("turn.started", "tool.called"),
        ),
        ({"actors": ["agent"]}, lambda e: e["actor"] == "agent"),
        (
            {"actors": ["tool"], "event_types": ["tool.completed", "tool.failed", "text.delta"]},
            lambda e: e["actor"] == "tool",
        ),
    ):
        client, ack = await Ws.subscribed(api, sid, since=first["id"], filter=filter_)
        expected = [e for e in stored if keep(e)]
        assert ack["replay_event_count"] == len(expected) > 0
        assert events_of(await client.take(len(expected))) == expected
        await client.close()


async def test_a_filter_of_streaming_types_only_replays_nothing(api: Api, workspace: Path) -> None:
    """Streaming events are never stored, so a filter naming no stored type matches no stored
    row: nothing is replayed and the count says so, with or without actors."""
    sid = (await api.create_session(workspace))["id"]
    first = (await api.events(sid))[0]
    await api.run_turn(sid, "while away")
    wanted = ["message.complete", "text.delta"]
    for filter_ in ({"event_types": wanted}, {"event_types": wanted, "actors": ["agent"]}):
        client, ack = await Ws.subscribed(api, sid, since=first["id"], filter=filter_)
        assert ack["replay_event_count"] == 0
        await api.run_turn(sid, "live again")
        frames = await client.until(lambda f: f["event"]["type"] == "message.complete")
        assert set(types_of(events_of(frames))) == set(wanted)  # live deltas, nothing replayed
        await client.close()


async def test_replay_limit_refuses_one_more_than_the_limit(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(websocket={"replay_max_events": 40})
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        start = (await api.events(sid))[-1]["id"]
        await patch_model(api, sid, 40)
        client, ack = await Ws.subscribed(api, sid, since=start)  # exactly the limit: replayed
        assert ack["replay_event_count"] == 40
        assert len(events_of(await client.take(40))) == 40
        await client.close()
        await patch_model(api, sid, 20)  # a 60-event gap
        client = await Ws.open(api, sid)
        error = await client.subscribe(since=start)
        assert error["type"] == "subscribe_error" and error["code"] == "replay_too_large"
        assert error["details"]["limit"] == 40 and error["details"]["since"] == start
        closed = await client.closed()
        assert closed.code == 1008 and closed.reason["code"] == "replay_too_large"
        client = await Ws.open(api, sid)  # the recovery: a snapshot
        ack = await client.subscribe(snapshot=True)
        assert ack["type"] == "subscribe_ack"
        await client.close()


async def test_replay_of_the_default_limit_at_scale(
    daemon: Daemon, api: Api, workspace: Path
) -> None:
    """15,000 missed events → replay_too_large; exactly 10,000 → replayed (test 4 at size)."""
    sid = (await api.create_session(workspace))["id"]
    start = (await api.events(sid))[-1]["id"]
    for _ in range(10_000):
        model_changed(daemon.core, sid)
    client, ack = await Ws.subscribed(api, sid, since=start)
    assert ack["replay_event_count"] == 10_000
    frames = await client.take(10_000, timeout=30)
    assert [f["event"]["seq"] for f in frames] == list(range(2, 10_002))
    await client.close()
    for _ in range(5_000):
        model_changed(daemon.core, sid)
    client = await Ws.open(api, sid)
    error = await client.subscribe(since=start)
    assert error["code"] == "replay_too_large" and error["details"]["limit"] == 10_000
    await client.close()


async def test_expired_cursors_are_refused(daemon: Daemon, api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    other = (await api.create_session(workspace))["id"]
    await patch_model(api, sid, 4)
    events = await api.events(sid)
    async with daemon.core.db.write() as conn:  # what `metis trace prune` records
        await conn.execute("UPDATE sessions SET events_floor_seq=3 WHERE id=?", (sid,))
    foreign = (await api.events(other))[0]["id"]
    for since in (events[1]["id"], events[2]["id"], "01JZZZZZZZZZZZZZZZZZZZZZZZ", foreign):
        client = await Ws.open(api, sid)
        error = await client.subscribe(since=since)
        assert error["code"] == "cursor_expired" and error["details"]["since"] == since, since
        closed = await client.closed()
        assert closed.reason["code"] == "cursor_expired"
    client, ack = await Ws.subscribed(api, sid, since=events[3]["id"])  # above the floor
    assert ack["replay_event_count"] == len(events) - 4
    await client.close()


async def test_a_prune_during_the_replay_read_expires_the_cursor(
    daemon: Daemon, api: Api, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`metis trace prune` may run beside the daemon: rows it deleted after the floor was read
    must not go missing from a replay silently."""
    sid = (await api.create_session(workspace))["id"]
    await patch_model(api, sid, 3)
    first = (await api.events(sid))[0]

    async def prune_meanwhile(kind: str) -> None:
        await prune_events(daemon.core.db, now_us() + 1)

    monkeypatch.setattr(handoff.HOOKS, "before_load", prune_meanwhile)
    client = await Ws.open(api, sid)
    error = await client.subscribe(since=first["id"])
    assert error["code"] == "cursor_expired"
    monkeypatch.setattr(handoff.HOOKS, "before_load", None)


async def test_subscribe_after_a_purge_is_session_not_found_or_closed(
    daemon: Daemon, api: Api, workspace: Path
) -> None:
    sid = (await api.create_session(workspace))["id"]
    client = await Ws.open(api, sid)
    await api.call("DELETE", f"/sessions/{sid}", params={"purge": "true"})
    closed = await client.closed()  # closed in-band even before it subscribed
    assert closed.code == 1000 and closed.reason["code"] == "session_purged"
    assert daemon.core.hub.client_count(sid) == 0 and not daemon.core.hub.knows(sid)


# ---- the hand-off (test 16, P1) ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["snapshot", "replay"])
async def test_events_emitted_during_the_handoff_reads_arrive_exactly_once(
    daemon: Daemon, api: Api, workspace: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    sid = (await api.create_session(workspace))["id"]
    first = (await api.events(sid))[0]
    await patch_model(api, sid, 3)

    async def during_the_reads(kind: str) -> None:
        assert kind == mode
        for _ in range(5):
            model_changed(daemon.core, sid)
            await asyncio.sleep(0.01)

    monkeypatch.setattr(handoff.HOOKS, "before_load", during_the_reads)
    client = await Ws.open(api, sid)
    if mode == "snapshot":
        ack = await client.subscribe(snapshot=True)
        head = await client.recv()
        h_seq = head["snapshot_at_seq"]
    else:
        ack = await client.subscribe(since=first["id"])
        replayed = events_of(await client.take(ack["replay_event_count"]))
        h_seq = replayed[-1]["seq"]
        assert [e["seq"] for e in replayed] == list(range(2, h_seq + 1))
    assert h_seq == 4
    monkeypatch.setattr(handoff.HOOKS, "before_load", None)
    live = events_of(await client.take(5))
    assert [e["seq"] for e in live] == [5, 6, 7, 8, 9]
    await patch_model(api, sid, 1)
    assert (await client.recv())["event"]["seq"] == 10
    await client.close()


async def snapshot_with_a_turn_during_its_load(
    api: Api, sid: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[Ws, dict[str, Any], str]:
    """Subscribe with a snapshot while a whole turn runs between the hand-off point and the reads;
    returns the client, its snapshot and that turn's id."""
    turn_ids: list[str] = []

    async def a_turn_during_the_load(kind: str) -> None:
        accepted, _ = await api.run_turn(sid, "committed after the hand-off point")
        turn_ids.append(accepted["turn_id"])

    monkeypatch.setattr(handoff.HOOKS, "before_load", a_turn_during_the_load)
    client = await Ws.open(api, sid)
    await client.subscribe(snapshot=True)
    snap = await client.recv()
    monkeypatch.setattr(handoff.HOOKS, "before_load", None)
    return client, snap, turn_ids[0]


async def test_snapshot_of_a_new_session_leaves_out_messages_committed_after_its_handoff(
    api: Api, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No event has named a message yet, and W still bounds the snapshot: the turn that
    ran during the load arrives live only, not also in the snapshot."""
    sid = (await api.create_session(workspace))["id"]
    client, snap, turn_id = await snapshot_with_a_turn_during_its_load(api, sid, monkeypatch)
    assert snap["snapshot_at_seq"] == 1 and snap["messages"] == []
    live = await client.turn(turn_id)
    assert types_of(live)[0] == "turn.started" and live[0]["seq"] == 2
    await client.close()


async def test_snapshot_after_a_restart_leaves_out_messages_committed_after_its_handoff(
    start_daemon: Callable[..., Any], workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted daemon has seen no event of the session name a message; W is still defined
    at the hand-off: the earlier history is in the snapshot, the turn run during the load is not."""
    before = await start_daemon()
    async with api_session(before) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        await api.run_turn(sid, "before the restart")
        history = (await api.messages(sid))["messages"]
        head = (await api.events(sid))[-1]
    await before.stop()
    after = await start_daemon()
    async with api_session(after) as http:
        api = Api(http)
        client, snap, turn_id = await snapshot_with_a_turn_during_its_load(api, sid, monkeypatch)
        assert snap["snapshot_at_event_id"] == head["id"] and snap["messages"] == history
        live = await client.turn(turn_id)
        assert types_of(live)[0] == "turn.started" and live[0]["seq"] > head["seq"]
        await client.close()


async def test_an_unexpected_failure_closes_1011_internal_error(
    api: Api, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = (await api.create_session(workspace))["id"]

    async def broken(kind: str) -> None:
        raise RuntimeError("the store went away")

    monkeypatch.setattr(handoff.HOOKS, "before_load", broken)
    client = await Ws.open(api, sid)
    await client.send({"type": "subscribe", "snapshot": True})
    closed = await client.closed()
    assert closed.code == 1011 and closed.reason["code"] == "internal_error"
    assert client.frames == []
    monkeypatch.setattr(handoff.HOOKS, "before_load", None)
    again, _ = await Ws.subscribed(api, sid)  # the session is unaffected
    await again.close()


async def test_socket_order_equals_hub_order_for_random_mixes(
    daemon: Daemon, api: Api, workspace: Path
) -> None:
    """P1: bus events and streaming events, emitted back to back with and without yielding,
    reach every socket in exactly the order the hub received them."""
    core = daemon.core
    sid = (await api.create_session(workspace))["id"]
    order: list[AnyEvent] = []
    core.bus.subscribe("order-recorder", lambda e: order.append(e), transient=True)
    clients = [(await Ws.subscribed(api, sid))[0] for _ in range(3)]
    rng = random.Random(7)
    for i in range(400):
        if rng.random() < 0.3:
            model_changed(core, sid)
        else:
            text_delta(core, sid, str(i))
        if rng.random() < 0.2:
            await asyncio.sleep(0)
    expected = [e.wire() for e in order if e.session_id == sid]
    for client in clients:
        got = events_of(await client.take(len(expected)))
        assert got == expected
        await client.close()
