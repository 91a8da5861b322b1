"""Writes to one resolved path run in tool_use order, whatever order their confirmations are
answered in, through the real daemon.

A real daemon on loopback with a real SQLite file and a temp workspace; the model is the fake
provider server reached through the real Anthropic SDK, scripted to reply with several tool
calls at once. `write_file` (and, where a test needs it, `read_file`) is on `prompt`, so every
call of the batch waits for a confirmation, and the test answers them over REST, later tool
uses first. A write allowed before an earlier write to its path must wait for that write (no
`tool.called`, file untouched) without holding a session slot, so a read still runs meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from metis.core.tools.pathorder import PathOrder
from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api
from tests.core.tools.test_dispatch_concurrency import (
    TERMINAL_TOOL,
    all_messages,
    batch,
    of_type,
    one_per_tool_use,
    results_sent_to_model,
    stored_result_order,
    tool_uses_and_results,
    ts,
)
from tests.e2e.test_provider_turns import AUTO_TOOLS, models_yaml, session_on

# nested under AUTO_TOOLS' `confirmation:` block
PROMPT_WRITES = "    per_tool: {write_file: prompt}\n"
PROMPT_WRITES_AND_READS = "    per_tool: {write_file: prompt, read_file: prompt}\n"
# How long a write allowed out of order gets to (wrongly) run before the test looks; the
# correct behaviour never depends on it.
GRACE_S = 0.4


@pytest.fixture
async def fake() -> AsyncIterator[FakeProviderServer]:
    async with FakeProviderServer(expected_keys={"anthropic": "ak-test"}) as server:
        yield server


@pytest.fixture
def make_api(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> Callable[..., Any]:
    """Start a daemon: every class `auto` but the `confirmation` lines given, plus `tools:` keys."""

    async def make(confirmation: str, **tools: int) -> Api:
        extra = "".join(f"  {key}: {value}\n" for key, value in tools.items())
        d = await start_daemon(config=AUTO_TOOLS + confirmation + extra, models=models_yaml(fake))
        return api_of(d)

    return make


# -- helpers -------------------------------------------------------------------------------------


async def start_batch(
    api: Api, sid: str, text: str, count: int
) -> tuple[str, list[str], dict[str, dict[str, Any]]]:
    """Submit a turn and wait until all `count` tool uses of its batch ask for confirmation.

    Returns (turn id, tool_use ids in tool_use order, each one's confirmation request).
    """
    status, accepted = await api.submit(sid, text)
    assert status == 202, accepted
    turn_id = accepted["turn_id"]
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        requests = one_per_tool_use(
            await api.turn_events(sid, turn_id), "tool.confirmation_requested"
        )
        if len(requests) == count:
            break
        assert asyncio.get_running_loop().time() < deadline, requests
        await asyncio.sleep(0.02)
    assistant = [m for m in await all_messages(api, sid) if m["role"] == "assistant"]
    order = [b["id"] for b in assistant[-1]["content"] if b["type"] == "tool_use"]
    assert sorted(order) == sorted(requests)
    return turn_id, order, {k: v["payload"] for k, v in requests.items()}


async def answer(
    api: Api, sid: str, turn_id: str, request: dict[str, Any], decision: str
) -> dict[str, Any]:
    """Answer one confirmation over REST; return its `tool.confirmation_resolved` event."""
    request_id = request["confirmation_request_id"]
    status, body = await api.call(
        "POST",
        f"/sessions/{sid}/turns/{turn_id}/confirmations/{request_id}",
        {"decision": decision},
    )
    assert status == 200 and body["applied"] is True, body
    return await api.wait_for_event(
        sid,
        lambda e: (
            e["type"] == "tool.confirmation_resolved"
            and e["payload"]["confirmation_request_id"] == request_id
        ),
    )


async def called_ids(api: Api, sid: str, turn_id: str) -> list[str]:
    """`tool.called` of the turn so far, in emission order."""
    called = of_type(await api.turn_events(sid, turn_id), "tool.called")
    return [e["payload"]["tool_use_id"] for e in called]


def writes(*contents: str) -> FakeReply:
    return batch(*(("write_file", {"path": "same.txt", "content": c}) for c in contents))


# -- the path order is tool_use order, not confirmation order -----------------------------------


@pytest.mark.parametrize("first_decision", ["allow", "deny"])
async def test_writes_to_one_path_run_in_tool_use_order_when_allowed_in_reverse(
    make_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
    first_decision: str,
) -> None:
    api = await make_api(PROMPT_WRITES)
    sid = await session_on(api, workspace, "anthropic")
    target = workspace / "same.txt"
    fake.enqueue("anthropic", writes("FIRST", "SECOND"), FakeReply.say("written"))
    turn_id, order, requests = await start_batch(api, sid, "write twice", 2)
    first, second = order

    # the later write is allowed first: it must wait for the earlier one, whose confirmation
    # is still pending, without running (no `tool.called`, nothing on disk)
    await answer(api, sid, turn_id, requests[second], "allow")
    await asyncio.sleep(GRACE_S)
    assert await called_ids(api, sid, turn_id) == []
    assert not target.exists()

    # answering the earlier one lets both go, in tool_use order
    await answer(api, sid, turn_id, requests[first], first_decision)
    terminal = await api.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.completed", terminal

    events = await api.turn_events(sid, turn_id)
    uses, results = await tool_uses_and_results(api, sid)
    assert [u["id"] for u in uses] == order
    texts = {i: results[i]["content"][0]["text"] for i in order}
    assert target.read_text() == "SECOND"
    if first_decision == "allow":
        assert await called_ids(api, sid, turn_id) == order
        called = one_per_tool_use(events, "tool.called")
        completed = one_per_tool_use(events, "tool.completed")
        # the second ran only after the first had finished
        ran_until = ts(called[first]) + completed[first]["payload"]["duration_ms"] / 1000
        assert ts(called[second]) >= ran_until
        assert texts == {
            first: "Wrote 5 bytes to same.txt (created).",
            second: "Wrote 6 bytes to same.txt (replaced).",
        }
    else:
        assert await called_ids(api, sid, turn_id) == [second]
        assert results[first]["is_error"] is True
        assert one_per_tool_use(events, "tool.failed")[first]["payload"]["error_class"] == (
            "user_denied"
        )
        assert texts[second] == "Wrote 6 bytes to same.txt (created)."
    # publication stays in tool_use order
    terminals = of_type(events, *TERMINAL_TOOL)
    assert [e["payload"]["tool_use_id"] for e in terminals] == order
    assert stored_result_order(await all_messages(api, sid)) == order
    assert results_sent_to_model(fake, "anthropic", 1) == order


async def test_three_writes_answered_last_first_run_first_to_last(
    make_api: Callable[..., Any], fake: FakeProviderServer, workspace: Path
) -> None:
    """A write between two others drops out (denied) first: the last still waits for the first."""
    api = await make_api(PROMPT_WRITES)
    sid = await session_on(api, workspace, "anthropic")
    target = workspace / "same.txt"
    fake.enqueue("anthropic", writes("ONE", "TWO", "THREE"), FakeReply.say("written"))
    turn_id, order, requests = await start_batch(api, sid, "write three times", 3)

    await answer(api, sid, turn_id, requests[order[2]], "allow")
    await answer(api, sid, turn_id, requests[order[1]], "deny")
    await asyncio.sleep(GRACE_S)
    assert await called_ids(api, sid, turn_id) == []
    assert not target.exists()

    await answer(api, sid, turn_id, requests[order[0]], "allow")
    terminal = await api.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.completed", terminal
    assert await called_ids(api, sid, turn_id) == [order[0], order[2]]
    assert target.read_text() == "THREE"
    events = await api.turn_events(sid, turn_id)
    assert [e["payload"]["tool_use_id"] for e in of_type(events, *TERMINAL_TOOL)] == order
    assert stored_result_order(await all_messages(api, sid)) == order


# -- reads never wait for the path order: a write waiting for its path holds no slot -------------


async def test_a_write_waiting_for_its_path_holds_no_slot(
    make_api: Callable[..., Any], fake: FakeProviderServer, workspace: Path
) -> None:
    api = await make_api(PROMPT_WRITES_AND_READS, max_concurrent_per_session=1)
    sid = await session_on(api, workspace, "anthropic")
    (workspace / "notes.txt").write_text("some notes\n")
    fake.enqueue(
        "anthropic",
        batch(
            ("write_file", {"path": "same.txt", "content": "FIRST"}),
            ("write_file", {"path": "same.txt", "content": "SECOND"}),
            ("read_file", {"path": "notes.txt"}),
        ),
        FakeReply.say("done"),
    )
    turn_id, order, requests = await start_batch(api, sid, "write twice and read", 3)
    first, second, read = order

    # the second write now waits for the first (unanswered); with one session slot, the read
    # allowed next must still get the slot and run
    await answer(api, sid, turn_id, requests[second], "allow")
    await answer(api, sid, turn_id, requests[read], "allow")
    await api.wait_for_event(
        sid, lambda e: e["type"] == "tool.called" and e["payload"]["tool_use_id"] == read
    )
    assert await called_ids(api, sid, turn_id) == [read]
    assert not (workspace / "same.txt").exists()

    await answer(api, sid, turn_id, requests[first], "allow")
    terminal = await api.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.completed", terminal
    assert await called_ids(api, sid, turn_id) == [read, first, second]
    assert (workspace / "same.txt").read_text() == "SECOND"
    _, results = await tool_uses_and_results(api, sid)
    assert results[read]["content"][0]["text"] == "some notes\n"
    assert not any(r["is_error"] for r in results.values())
    events = await api.turn_events(sid, turn_id)
    assert [e["payload"]["tool_use_id"] for e in of_type(events, *TERMINAL_TOOL)] == order
    assert stored_result_order(await all_messages(api, sid)) == order


# -- cancelled while waiting for the path --------------------------------------------------------


async def test_cancel_while_a_write_waits_for_its_path(
    make_api: Callable[..., Any], fake: FakeProviderServer, workspace: Path
) -> None:
    """The waiting write ends `cancelled` with no `tool.called`; the pending one is withdrawn."""
    api = await make_api(PROMPT_WRITES)
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue("anthropic", writes("FIRST", "SECOND"))
    turn_id, order, requests = await start_batch(api, sid, "write twice", 2)
    second = order[1]

    await answer(api, sid, turn_id, requests[second], "allow")
    await asyncio.sleep(GRACE_S)
    status, body = await api.call("POST", f"/sessions/{sid}/turns/{turn_id}/cancel")
    assert status == 202, body
    terminal = await api.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.cancelled", terminal

    events = await api.turn_events(sid, turn_id)
    assert of_type(events, "tool.called") == []
    resolved = of_type(events, "tool.confirmation_resolved")
    assert [e["payload"]["tool_use_id"] for e in resolved] == [second]  # first: withdrawn
    failed = of_type(events, "tool.failed")
    assert [e["payload"]["tool_use_id"] for e in failed] == order
    assert {e["payload"]["error_class"] for e in failed} == {"cancelled"}
    assert failed[-1]["seq"] < terminal["seq"]
    assert not (workspace / "same.txt").exists()
    _, results = await tool_uses_and_results(api, sid)
    assert all(results[i]["is_error"] for i in order)
    assert stored_result_order(await all_messages(api, sid)) == order


# -- the queue itself ------------------------------------------------------------------------------


async def test_path_order_lets_a_tool_use_go_only_at_the_head_of_all_its_paths() -> None:
    order = PathOrder()
    a1 = order.enqueue([("s", "/a")])
    ab = order.enqueue([("s", "/a"), ("s", "/b"), ("s", "/a")])
    b1 = order.enqueue([("s", "/b")])
    a2 = order.enqueue([("s", "/a")])
    other = order.enqueue([("t", "/a")])  # another session: its own queue
    assert order.enqueue([]) is None
    assert a1 is not None and ab is not None and b1 is not None and a2 is not None
    assert other is not None and other.ready.is_set()
    assert ab.keys == (("s", "/a"), ("s", "/b"))
    assert [t.ready.is_set() for t in (a1, ab, b1, a2)] == [True, False, False, False]
    order.release(b1)  # drops out before its turn: nobody behind it overtakes anyone
    assert [t.ready.is_set() for t in (ab, a2)] == [False, False]
    order.release(a1)
    order.release(a1)  # idempotent
    assert ab.ready.is_set() and not a2.ready.is_set()
    order.release(ab)
    assert a2.ready.is_set()
    order.release(a2)
    order.release(other)
    assert order.pending() == 0


async def test_forgetting_a_session_lets_its_waiters_go() -> None:
    order = PathOrder()
    first, waiting, kept = (order.enqueue([key]) for key in (("s", "/a"), ("s", "/a"), ("t", "/a")))
    assert first is not None and waiting is not None and kept is not None
    assert not waiting.ready.is_set()
    order.forget(lambda key: key[0] == "s")
    assert waiting.ready.is_set() and order.pending() == 1
    order.release(first)  # a queue already forgotten: nothing to do
    order.release(kept)
    assert order.pending() == 0
