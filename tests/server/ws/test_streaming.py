"""Live frames of real turns over the WebSocket: frame order, deltas that rebuild the stored
message, several clients, mid-stream joiners and provider failures.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from metis.core.turns.resume import SuspendingTurn
from metis.core.turns.service import TurnRequest
from metis.server.runner import Daemon
from metis.server.ws.protocol import PRESETS
from metis.testing import FakeProviderServer, FakeReply
from tests.api import Api, api_session
from tests.ws_client import (
    SLOW_SCRIPTED,
    STREAMING,
    Ws,
    check_turn_grammar,
    comparable,
    events_of,
    fake_models,
    is_event,
    rebuild,
    types_of,
)


@pytest.fixture
async def fake_api(
    fake: FakeProviderServer, start_daemon: Callable[..., Any]
) -> AsyncIterator[Api]:
    d = await start_daemon(models=fake_models(fake))
    async with api_session(d) as http:
        yield Api(http)


@pytest.fixture
async def slow_api(start_daemon: Callable[..., Any]) -> AsyncIterator[tuple[Daemon, Api]]:
    d = await start_daemon(models=SLOW_SCRIPTED)
    async with api_session(d) as http:
        yield d, Api(http)


def message_ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["payload"]["message_id"] for e in events if e["type"] == "message.complete"]


async def assert_rebuilds_stored(api: Api, sid: str, events: list[dict[str, Any]]) -> None:
    """Invariant 5: deltas → final_content → the stored message, for every complete message."""
    stored = {m["id"]: m for m in (await api.messages(sid, limit=200))["messages"]}
    for complete in (e for e in events if e["type"] == "message.complete"):
        p = complete["payload"]
        assert rebuild(events, p["message_id"]) == comparable(p["final_content"])
        if p["stop_reason"] not in ("cancelled", "error"):
            assert stored[p["message_id"]]["content"] == p["final_content"]


# ---- the happy path and the ordering pitfall (tests 1, 21) -----------------------------------------


async def test_plain_turn_frames_follow_the_grammar_and_rebuild_the_message(
    api: Api, workspace: Path
) -> None:
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "hello, stream me a reply please")
    assert status == 202, accepted
    events = await client.turn(accepted["turn_id"])
    check_turn_grammar(events)  # message.start follows llm.call_started with no await: in order
    assert types_of(events)[:4] == [
        "turn.started",
        "route.decided",
        "llm.call_started",
        "message.start",
    ]
    assert types_of(events)[-3:] == ["message.complete", "llm.call_completed", "turn.completed"]
    assert all(e["turn_id"] == accepted["turn_id"] for e in events)
    started = next(e for e in events if e["type"] == "llm.call_started")
    for e in events:
        if e["type"] in STREAMING:
            assert set(e) == {
                "session_id",
                "turn_id",
                "parent_event_id",
                "type",
                "actor",
                "payload",
            }
            assert e["parent_event_id"] == started["id"] and e["actor"] == "agent"
        else:
            assert {"id", "seq", "timestamp", "sensitivity"} <= set(e)
    seqs = [e["seq"] for e in events if "seq" in e]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    await assert_rebuilds_stored(api, sid, events)
    stored = await api.turn_events(sid, accepted["turn_id"])
    assert [e for e in events if "id" in e] == stored  # live equals GET …/events
    await client.close()


async def test_a_reply_of_more_deltas_than_the_queue_holds_reaches_a_reading_client_whole(
    daemon: Daemon, api: Api, workspace: Path
) -> None:
    """The offline scripted model yields to the event loop between deltas, as a provider
    stream does, so a long reply never overflows the queue of a client that keeps reading."""
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "lorem ipsum " * 1700)  # ~20,000 chars
    assert status == 202, accepted
    events = await client.turn(accepted["turn_id"], timeout=60)
    assert types_of(events)[-1] == "turn.completed"
    deltas = sum(e["type"] == "text.delta" for e in events)
    assert deltas > daemon.settings.websocket.queue_max_events
    await assert_rebuilds_stored(api, sid, events)
    await client.close()


async def test_tool_turn_frames_follow_the_grammar(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "please use server tool")
    assert status == 202, accepted
    events = await client.turn(accepted["turn_id"])
    check_turn_grammar(events)
    types = types_of(events)
    assert types.count("llm.call_started") == 2 and types.count("tool.use_start") == 1
    first_done = types.index("llm.call_completed")
    assert types.index("tool.use_end") < types.index("message.complete") < first_done
    assert types.index("tool.called") > first_done
    assert types[-1] == "turn.completed"
    called = next(e for e in events if e["type"] == "tool.called")
    start = next(e for e in events if e["type"] == "tool.use_start")
    assert called["payload"]["tool_use_id"] == start["payload"]["tool_use_id"]
    await assert_rebuilds_stored(api, sid, events)
    await client.close()


async def test_thinking_deltas_rebuild_with_their_signature(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "think about it, then answer")
    assert status == 202, accepted
    events = await client.turn(accepted["turn_id"])
    check_turn_grammar(events)
    assert "thinking.delta" in types_of(events)
    await assert_rebuilds_stored(api, sid, events)
    await client.close()


# ---- several clients (tests 6, 15) ---------------------------------------------------------------


async def test_two_clients_with_one_filter_see_identical_sequences(
    api: Api, workspace: Path
) -> None:
    sid = (await api.create_session(workspace))["id"]
    a, _ = await Ws.subscribed(api, sid)
    b, _ = await Ws.subscribed(api, sid)
    chat, _ = await Ws.subscribed(api, sid, filter="preset:chat")
    agent, _ = await Ws.subscribed(api, sid, filter={"actors": ["agent"]})
    for text in ("first", "please use server tool", "think, then answer"):
        accepted, _ = await api.run_turn(sid, text)
        for client in (a, b, chat, agent):
            await client.turn(accepted["turn_id"])
    assert a.frames == b.frames
    everything = events_of(a.frames)
    assert events_of(chat.frames) == [e for e in everything if e["type"] in PRESETS["chat"]]
    assert events_of(agent.frames) == [e for e in everything if e["actor"] == "agent"]
    for client in (a, b, chat, agent):
        await client.close()


async def test_a_rest_started_turn_is_visible_live(api: Api, workspace: Path) -> None:
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid, filter="preset:chat")
    status, accepted = await api.submit(sid, "started over REST")
    assert status == 202
    events = await client.turn(accepted["turn_id"])
    assert events[0]["type"] == "turn.started"
    assert events[0]["payload"]["user_message_id"] == accepted["user_message_id"]
    await client.close()


# ---- joiners and leavers (tests 23, 29) -------------------------------------------------------------


async def test_mid_stream_joiner_gets_catch_up_frames_that_rebuild_final_content(
    slow_api: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = slow_api
    sid = (await api.create_session(workspace))["id"]
    early, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "a long enough sentence to stream slowly")
    assert status == 202, accepted
    await early.until(is_event("text.delta"), timeout=5)
    await early.until(is_event("text.delta"), timeout=5)
    late, _ = await Ws.subscribed(api, sid)
    await late.turn(accepted["turn_id"])
    await early.turn(accepted["turn_id"])
    early_events = events_of(early.frames)
    catch_up = [f for f in late.frames if f.get("catch_up")]
    assert catch_up and all(f["type"] == "event" for f in catch_up)
    assert [f["event"]["type"] for f in catch_up][:2] == ["message.start", "text.delta"]
    assert late.frames.index(catch_up[0]) == 1  # right after the ack
    all_late = events_of(late.frames, catch_up=True)
    complete = next(e for e in all_late if e["type"] == "message.complete")
    message_id = complete["payload"]["message_id"]
    assert rebuild(all_late, message_id) == comparable(complete["payload"]["final_content"])
    assert rebuild(early_events, message_id) == rebuild(all_late, message_id)
    # after the hand-off the late client receives exactly the early client's tail
    live = events_of(late.frames)
    assert live == early_events[len(early_events) - len(live) :]
    for client in (early, late):
        await client.close()


async def test_dropping_the_socket_mid_turn_does_not_cancel_and_since_gets_the_rest(
    slow_api: tuple[Daemon, Api], workspace: Path
) -> None:
    _, api = slow_api
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "keep streaming after I leave")
    assert status == 202, accepted
    seen = await client.until(is_event("text.delta"), timeout=5)
    last_bus = [e for e in events_of(seen) if "id" in e][-1]
    await client.close()
    terminal = await api.wait_turn(sid, accepted["turn_id"])
    assert terminal["type"] == "turn.completed"
    again, ack = await Ws.subscribed(api, sid, since=last_bus["id"])
    replayed = events_of(await again.take(ack["replay_event_count"]))
    stored = await api.events(sid)
    tail = [e for e in stored if e["seq"] > last_bus["seq"]]
    assert ack["replay_event_count"] == len(tail) and replayed == tail
    assert replayed[-1]["type"] == "turn.completed"
    await again.close()


# ---- provider errors (test 26) ------------------------------------------------------------------


async def test_retries_before_the_first_token_show_as_call_pairs_without_frames(
    fake: FakeProviderServer, fake_api: Api, workspace: Path
) -> None:
    api = fake_api
    fake.enqueue(
        "anthropic",
        FakeReply.fail(429, "rate_limit_error", retry_after=0),
        FakeReply.fail(429, "rate_limit_error", retry_after=0),
        FakeReply.say("third time lucky"),
    )
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "hi")
    assert status == 202, accepted
    events = await client.turn(accepted["turn_id"])
    check_turn_grammar(events)
    types = types_of(events)
    assert types[:8] == [
        "turn.started",
        "route.decided",
        "llm.call_started",
        "llm.call_failed",
        "llm.call_started",
        "llm.call_failed",
        "llm.call_started",
        "message.start",
    ]
    failed = [e for e in events if e["type"] == "llm.call_failed"]
    assert all(
        f["payload"]["will_retry"] and f["payload"]["error_class"] == "rate_limit" for f in failed
    )
    assert types.count("message.start") == 1 and types[-1] == "turn.completed"
    await assert_rebuilds_stored(api, sid, events)
    await client.close()


async def test_a_drop_after_the_first_token_closes_every_frame_and_fails_the_turn(
    fake: FakeProviderServer, fake_api: Api, workspace: Path
) -> None:
    api = fake_api
    fake.enqueue(
        "anthropic",
        FakeReply.drop_after(6, text="a reply that will be cut short", chunk_chars=3),
    )
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "hi")
    assert status == 202, accepted
    events = await client.turn(accepted["turn_id"])
    check_turn_grammar(events)
    types = types_of(events)
    assert types[-3:] == ["message.complete", "llm.call_failed", "turn.failed"]
    assert types.count("llm.call_started") == 1  # no retry after a token
    complete = next(e for e in events if e["type"] == "message.complete")
    assert complete["payload"]["stop_reason"] == "error"
    failed = next(e for e in events if e["type"] == "llm.call_failed")
    assert failed["payload"]["will_retry"] is False
    assert events[-1]["payload"]["reason"] == "provider_error"
    await client.close()


async def test_random_chunkings_rebuild_final_content_for_every_client(
    fake: FakeProviderServer, fake_api: Api, workspace: Path
) -> None:
    """P2: for random texts, chunk sizes, thinking and tool calls, the deltas rebuild
    `final_content`, on a client attached before the turn and on one joining mid-stream."""
    api = fake_api
    rng = random.Random(20260508)
    sid = (await api.create_session(workspace))["id"]
    early, _ = await Ws.subscribed(api, sid)
    alphabet = 'abcdefghij ÄÖü–→ 😀\n"{}'
    joined_mid_stream = 0
    for _ in range(6):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(60, 160)))
        reply: dict[str, Any] = {"text": text, "chunk_chars": rng.randint(1, 6)}
        if rng.random() < 0.5:
            reply["thinking"] = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        fake.enqueue("anthropic", FakeReply(**reply, delay_ms=3))
        status, accepted = await api.submit(sid, "go")
        assert status == 202, accepted
        await early.until(is_event("message.start"))
        late, _ = await Ws.subscribed(api, sid, filter="preset:chat")
        early_events = await early.turn(accepted["turn_id"])
        late_events = events_of(
            await late.until(is_event("turn.completed")),
            catch_up=True,
        )
        check_turn_grammar(early_events)
        await assert_rebuilds_stored(api, sid, early_events)
        for message_id in message_ids(early_events):
            complete = next(
                e
                for e in early_events
                if e["type"] == "message.complete" and e["payload"]["message_id"] == message_id
            )
            expected = comparable(complete["payload"]["final_content"])
            assert rebuild(late_events, message_id) == expected
        joined_mid_stream += any(e.get("catch_up") for e in late.frames)
        await late.close()
    await early.close()
    assert joined_mid_stream >= 3


# ---- an AAP-surface turn on a metis socket (test 30) -------------------------------------------------


async def test_an_aap_session_turn_streams_to_a_metis_socket_in_order(
    daemon: Daemon, api: Api, workspace: Path
) -> None:
    core = daemon.core
    view = await core.sessions.create(str(workspace), surface="aap")
    client, _ = await Ws.subscribed(api, view.id)
    accepted = await core.turns.submit(
        TurnRequest(
            view.id,
            [{"type": "text", "text": "hello from AAP"}],
            surface="aap",
            strategy=SuspendingTurn(),
        )
    )
    events = await client.turn(accepted.turn_id)
    check_turn_grammar(events)
    assert types_of(events)[-1] == "turn.completed"
    await assert_rebuilds_stored(api, view.id, events)
    await client.close()
