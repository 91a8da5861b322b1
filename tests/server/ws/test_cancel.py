"""Cancellation as every socket sees it.

Each case is reached deterministically: a provider that holds its first byte (C2), a slowly
streaming model (C3), a confirmation wait (C4 and test 9) and a running shell command (C5).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.testing import FakeProviderServer, FakeReply
from tests.processes import gone, live_group_members, the_noted_group
from tests.ws_client import (
    SLOW_SCRIPTED,
    Ws,
    check_turn_grammar,
    comparable,
    fake_models,
    is_event,
    rebuild,
    types_of,
)


def after(events: list[dict[str, Any]], kind: str) -> list[str]:
    """Types emitted after the first event of `kind`."""
    types = types_of(events)
    return types[types.index(kind) + 1 :]


async def test_cancel_before_the_stream_opens_fails_the_call_then_the_turn(
    fake: FakeProviderServer, make_api: Callable[..., Any], workspace: Path
) -> None:
    """C2: llm.call_started sent, no content yet → llm.call_failed{cancelled} → turn.cancelled."""
    d, api = await make_api(models=fake_models(fake))
    fake.enqueue("anthropic", FakeReply.say("never streamed", first_byte_delay_ms=5000))
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "hi")
    assert status == 202, accepted
    await client.until(is_event("llm.call_started"))
    await client.send({"type": "cancel", "turn_id": accepted["turn_id"]})
    events = await client.turn(accepted["turn_id"])
    check_turn_grammar(events)
    assert after(events, "llm.call_started") == ["llm.call_failed", "turn.cancelled"]
    failed = events[-2]["payload"]
    assert failed["error_class"] == "cancelled" and failed["will_retry"] is False
    assert d.core.availability.unavailable_scope("anthropic:claude-haiku-4-5") is None
    await client.close()


async def test_cancel_during_streaming_closes_the_message_and_stores_it_cancelled(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    """C3 (test 7): message.complete{cancelled} → llm.call_failed → turn.cancelled."""
    _, api = await make_api(models=SLOW_SCRIPTED)
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    other, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "a sentence long enough to be cut in the middle")
    assert status == 202, accepted
    await client.until(is_event("text.delta"))
    await client.until(is_event("text.delta"))
    await client.send({"type": "cancel", "turn_id": accepted["turn_id"]})
    events = await client.turn(accepted["turn_id"])
    check_turn_grammar(events)
    assert types_of(events)[-3:] == ["message.complete", "llm.call_failed", "turn.cancelled"]
    assert not {"tool.failed", "tool.called", "llm.call_completed"} & set(types_of(events))
    complete = events[-3]["payload"]
    assert complete["stop_reason"] == "cancelled"
    assert events[-2]["payload"]["error_class"] == "cancelled"
    assert rebuild(events, complete["message_id"]) == comparable(complete["final_content"])
    stored = {m["id"]: m for m in (await api.messages(sid))["messages"]}
    message = stored[complete["message_id"]]
    assert message["metadata"]["status"] == "cancelled"
    assert message["content"] == complete["final_content"]  # text only: nothing to drop
    assert await other.turn(accepted["turn_id"]) == events  # every socket: the same sequence
    for c in (client, other):
        await c.close()


async def test_cancel_during_tool_input_streaming_closes_the_open_tool_block(
    fake: FakeProviderServer, make_api: Callable[..., Any], workspace: Path
) -> None:
    """C3 inside a tool_use block: tool.use_end (final_input {} when unparseable) first."""
    _, api = await make_api(models=fake_models(fake))
    fake.enqueue(
        "anthropic",
        FakeReply.call("read_file", {"path": "README.md" * 20}, chunk_chars=2, delay_ms=15),
    )
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "read it")
    assert status == 202, accepted
    await client.until(is_event("tool.use_input_delta"))
    await client.send({"type": "cancel", "turn_id": accepted["turn_id"]})
    events = await client.turn(accepted["turn_id"])
    check_turn_grammar(events)
    tail = types_of(events)[-4:]
    assert tail == ["tool.use_end", "message.complete", "llm.call_failed", "turn.cancelled"]
    assert events[-4]["payload"]["final_input"] == {}
    assert not {"tool.called", "tool.failed", "llm.call_completed"} & set(types_of(events))
    await client.close()


async def test_cancel_during_a_confirmation_wait_withdraws_it(
    fake: FakeProviderServer, make_api: Callable[..., Any], workspace: Path
) -> None:
    """Test 9 / C4: no tool.confirmation_resolved; tool.failed{cancelled} → turn.cancelled;
    nothing runs, and a later answer is 409 withdrawn."""
    config = "tools:\n  confirmation:\n    per_tool: {write_file: prompt}\n"
    _, api = await make_api(models=fake_models(fake), config=config)
    fake.enqueue("anthropic", FakeReply.call("write_file", {"path": "new.txt", "content": "x"}))
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    files_before = sorted(p.name for p in workspace.iterdir())
    status, accepted = await api.submit(sid, "write it")
    frames = await client.until(is_event("tool.confirmation_requested"))
    request = frames[-1]["event"]["payload"]
    assert request["tool_name"] == "write_file"
    await client.send({"type": "cancel", "turn_id": accepted["turn_id"]})
    events = await client.turn(accepted["turn_id"])
    check_turn_grammar(events)
    assert after(events, "tool.confirmation_requested") == ["tool.failed", "turn.cancelled"]
    assert events[-2]["payload"]["error_class"] == "cancelled"
    assert sorted(p.name for p in workspace.iterdir()) == files_before  # nothing written
    status, session = await api.call("GET", f"/sessions/{sid}")
    assert session["pending_confirmations"] == []
    status, body = await api.call(
        "POST",
        f"/sessions/{sid}/turns/{accepted['turn_id']}/confirmations/"
        f"{request['confirmation_request_id']}",
        {"decision": "allow"},
    )
    assert status == 409 and body["error"]["details"]["resolution"] == "withdrawn"
    await client.close()


async def test_cancel_of_a_read_confirmation_wait_gives_the_same_sequence(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    _, api = await make_api(config="tools:\n  confirmation:\n    per_tool: {read_file: prompt}\n")
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "please use server tool")
    await client.until(is_event("tool.confirmation_requested"))
    status, body = await api.call(
        "POST", f"/sessions/{sid}/turns/{accepted['turn_id']}/cancel", {"reason": "user_cancel"}
    )
    assert status == 202 and body["cancellation_initiated"] is True
    events = await client.turn(accepted["turn_id"])
    assert after(events, "tool.confirmation_requested") == ["tool.failed", "turn.cancelled"]
    assert "tool.confirmation_resolved" not in types_of(events)
    await client.close()


async def test_cancel_during_tool_dispatch_stops_the_shell_process_group(
    fake: FakeProviderServer, make_api: Callable[..., Any], workspace: Path, metis_home: Path
) -> None:
    """C5 (test 8): tool.failed{cancelled} → turn.cancelled; the command's group is gone."""
    config = "tools:\n  confirmation:\n    per_tool: {shell: auto}\n"
    _, api = await make_api(models=fake_models(fake), config=config)
    command = "echo started > started.txt; sleep 30 & sleep 30; wait"
    fake.enqueue("anthropic", FakeReply.call("shell", {"command": command}))
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "run it")
    assert status == 202, accepted
    await client.until(is_event("tool.called"))
    started = workspace / "started.txt"
    async with asyncio.timeout(5):
        while not started.exists() or not started.read_text().strip():
            await asyncio.sleep(0.01)
    pgid = await the_noted_group(metis_home)
    assert live_group_members(pgid)  # running
    await client.send({"type": "cancel", "turn_id": accepted["turn_id"]})
    events = await client.turn(accepted["turn_id"], timeout=15)
    check_turn_grammar(events)
    assert after(events, "tool.called") == ["tool.failed", "turn.cancelled"]
    assert events[-2]["payload"]["error_class"] == "cancelled"
    assert await gone(pgid)
    await client.close()
