"""How a turn's last model call ends, through the real daemon, the real SDK adapters and the fake
provider: tool uses of a turn that did not end with `tool_use`, and the usage a failed or
cancelled call reports.

- after any ending other than `tool_use` (or a suspension) every tool use
  of the turn has a stored result — `Tool call cancelled`, announced by `tool.failed{cancelled}` —
  and a call cut off mid-arguments by the output limit is dropped, never stored or announced.
- `llm.call_failed` carries the quartet the provider reported before the
  failure (0 otherwise), and only that is billed to the turn and the session.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api
from tests.e2e.test_costs import assert_store_invariants
from tests.e2e.test_provider_turns import session_on, types_of
from tests.ws_client import Ws, check_turn_grammar, is_event

Env = tuple[Daemon, Api, FakeProviderServer]
CANCELLED = "Tool call cancelled"
USAGE = {"input_tokens": 1103, "output_tokens": 57, "cache_read_tokens": 0, "cache_write_tokens": 0}


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in events if e["type"] == kind]


async def tool_call_rows(daemon: Daemon, session_id: str) -> list[dict[str, Any]]:
    await daemon.core.flush()
    rows = await daemon.core.db.fetchall(
        "SELECT id, name, status, error_class, result_message_id FROM tool_calls "
        "WHERE session_id=? ORDER BY id",
        (session_id,),
    )
    return [dict(r) for r in rows]


# -- tool uses of a turn that ends without tool_use ---------------------------------------------


@pytest.mark.parametrize(
    ("api_name", "wire_stop", "stop"),
    [
        ("anthropic", "max_tokens", "max_tokens"),
        ("anthropic", "end_turn", "end_turn"),
        ("anthropic", "refusal", "refusal"),
        ("openai", "length", "max_tokens"),
        ("openai", "content_filter", "refusal"),
    ],
)
async def test_a_complete_tool_use_of_a_non_tool_use_ending_gets_a_cancelled_result(
    env: Env, workspace: Path, api_name: str, wire_stop: str, stop: str
) -> None:
    daemon, api, fake = env
    sid = await session_on(api, workspace, api_name)
    fake.enqueue(
        api_name,
        FakeReply.call(
            "write_file",
            {"path": "notes.txt", "content": "never written"},
            more_calls=[{"name": "read_file", "input": {"path": "README.md"}}],
            stop_reason=wire_stop,
        ),
    )
    accepted, terminal = await api.run_turn(sid, "write the notes")
    assert terminal["type"] == "turn.completed"
    assert terminal["payload"]["stop_reason"] == stop
    assert terminal["payload"]["pending_tool_use_ids"] == []
    assert terminal["payload"]["tool_call_count"] == 0
    assert not (workspace / "notes.txt").exists()  # nothing ran

    events = await api.turn_events(sid, accepted["turn_id"])
    check_turn_grammar(events)  # the closing tool.failed events fit the per-turn frame grammar
    assert types_of(events)[-4:] == [
        "llm.call_completed",
        "tool.failed",
        "tool.failed",
        "turn.completed",
    ]
    [completed] = of_type(events, "llm.call_completed")
    assert completed["stop_reason"] == stop and completed["tool_use_count"] == 2
    assert "tool.called" not in types_of(events)

    messages = (await api.messages(sid))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    calls = [b for b in messages[1]["content"] if b["type"] == "tool_use"]
    assert [c["name"] for c in calls] == ["write_file", "read_file"]
    # one stored result per tool use, in tool_use order, announced by its tool.failed
    failed = of_type(events, "tool.failed")
    for call, result, announced in zip(calls, messages[2:], failed, strict=True):
        assert result["content"] == [
            {
                "type": "tool_result",
                "tool_use_id": call["id"],
                "content": [{"type": "text", "text": CANCELLED}],
                "is_error": True,
            }
        ]
        assert announced["tool_use_id"] == call["id"] and announced["tool_name"] == call["name"]
        assert announced["error_class"] == "cancelled" and announced["message"] == CANCELLED
        assert announced["result_message_id"] == result["id"]
    llm_completed_id = next(e["id"] for e in events if e["type"] == "llm.call_completed")
    assert {e["parent_event_id"] for e in events if e["type"] == "tool.failed"} == {
        llm_completed_id
    }

    # the tool_calls rows are closed: nothing is left pending
    rows = await tool_call_rows(daemon, sid)
    assert [(r["status"], r["error_class"]) for r in rows] == [("cancelled", "cancelled")] * 2
    assert {r["result_message_id"] for r in rows} == {m["id"] for m in messages[2:]}

    # the history stays valid for the provider: the next request carries both results
    fake.enqueue(api_name, FakeReply.say("fine"))
    _, next_terminal = await api.run_turn(sid, "go on")
    assert next_terminal["type"] == "turn.completed"
    sent = json.dumps(fake.requests_for(api_name)[-1].body)
    assert sent.count(CANCELLED) == 2


async def run_watched(
    api: Api, sid: str, text: str
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Run a turn with a WebSocket subscribed: its acceptance, its stored terminal event, and
    what the socket received of it."""
    ws, _ = await Ws.subscribed(api, sid)
    try:
        accepted, terminal = await api.run_turn(sid, text)
        live = await ws.turn(accepted["turn_id"])
    finally:
        await ws.close()
    return accepted, terminal, live


def streamed_text(live: list[dict[str, Any]]) -> str:
    """The text a turn's `text.delta` events carried."""
    return "".join(e["text"] for e in of_type(live, "text.delta"))


def assert_costed_as_estimated(usage: dict[str, Any], input_tokens: int, text: str) -> None:
    """A cut-short call's usage: its prompt, the streamed output at four characters a token
    (ceiling), and the flag that says they are estimates."""
    assert usage["input_tokens"] == input_tokens > 0
    assert usage["output_tokens"] == -(-len(text) // 4) > 1
    assert usage["usage_estimated"] is True and usage["cost_usd"] != "0"


def anthropic_frame(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


def openai_frame(delta: dict[str, Any], finish: str | None = None) -> str:
    chunk = {
        "id": "chatcmpl-cut",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n"


CUT_ARGUMENTS = '{"path": "notes.txt", "content": "alpha\\nbe'

CUT_OFF_REPLIES = {
    "anthropic": [
        anthropic_frame(
            "message_start",
            {
                "message": {
                    "id": "msg_cut",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-6",
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 40, "output_tokens": 1},
                }
            },
        ),
        anthropic_frame(
            "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
        ),
        anthropic_frame(
            "content_block_delta",
            {"index": 0, "delta": {"type": "text_delta", "text": "Reading, then writing."}},
        ),
        anthropic_frame("content_block_stop", {"index": 0}),
        anthropic_frame(
            "content_block_start",
            {
                "index": 1,
                "content_block": {
                    "type": "tool_use",
                    "id": "toolu_read",
                    "name": "read_file",
                    "input": {},
                },
            },
        ),
        anthropic_frame(
            "content_block_delta",
            {
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"path": "README.md"}'},
            },
        ),
        anthropic_frame("content_block_stop", {"index": 1}),
        anthropic_frame(
            "content_block_start",
            {
                "index": 2,
                "content_block": {
                    "type": "tool_use",
                    "id": "toolu_cut",
                    "name": "write_file",
                    "input": {},
                },
            },
        ),
        anthropic_frame(
            "content_block_delta",
            {"index": 2, "delta": {"type": "input_json_delta", "partial_json": CUT_ARGUMENTS}},
        ),
        anthropic_frame("content_block_stop", {"index": 2}),
        anthropic_frame(
            "message_delta",
            {"delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 64}},
        ),
        anthropic_frame("message_stop", {}),
    ],
    "openai": [
        openai_frame({"role": "assistant", "content": "Reading, then writing."}),
        openai_frame(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_read",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "README.md"}'},
                    }
                ]
            }
        ),
        openai_frame(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_cut",
                        "type": "function",
                        "function": {"name": "write_file", "arguments": CUT_ARGUMENTS},
                    }
                ]
            }
        ),
        openai_frame({}, "length"),
        "data: [DONE]\n\n",
    ],
}


@pytest.mark.parametrize("api_name", ["anthropic", "openai"])
async def test_a_tool_use_cut_off_by_the_output_limit_is_dropped(
    env: Env, workspace: Path, api_name: str
) -> None:
    daemon, api, fake = env
    sid = await session_on(api, workspace, api_name)
    fake.enqueue(api_name, FakeReply(raw_sse=CUT_OFF_REPLIES[api_name]))
    accepted, terminal, live = await run_watched(api, sid, "read, then write the notes")
    assert terminal["type"] == "turn.completed"
    assert terminal["payload"]["stop_reason"] == "max_tokens"
    assert not (workspace / "notes.txt").exists()

    # the stored message keeps the text and the complete call only
    messages = (await api.messages(sid))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assistant = messages[1]
    assert [b["type"] for b in assistant["content"]] == ["text", "tool_use"]
    [kept] = [b for b in assistant["content"] if b["type"] == "tool_use"]
    assert kept["name"] == "read_file" and kept["input"] == {"path": "README.md"}
    assert messages[2]["content"][0]["tool_use_id"] == kept["id"]
    assert "write_file" not in json.dumps(messages)

    # its streamed end says it was dropped, so clients say so instead of showing a call
    ends = [e["payload"] for e in live if e["type"] == "tool.use_end"]
    assert [(end["tool_use_id"] == kept["id"], end["dropped"]) for end in ends] == [
        (True, False),
        (False, True),
    ]

    # not announced: message.complete (what clients and AAP render) holds the stored content
    [complete] = [e["payload"] for e in live if e["type"] == "message.complete"]
    assert complete["stop_reason"] == "max_tokens"
    assert complete["final_content"] == assistant["content"]
    events = await api.turn_events(sid, accepted["turn_id"])
    [completed] = of_type(events, "llm.call_completed")
    assert completed["tool_use_count"] == 1
    assert [f["tool_use_id"] for f in of_type(events, "tool.failed")] == [kept["id"]]

    # and not stored as a call: only the complete one has a tool_calls row, closed
    rows = await tool_call_rows(daemon, sid)
    assert [(r["id"], r["name"], r["status"]) for r in rows] == [
        (kept["id"], "read_file", "cancelled")
    ]


async def test_a_call_cut_off_alone_leaves_an_empty_reply_and_nothing_pending(
    env: Env, workspace: Path
) -> None:
    daemon, api, fake = env
    sid = await session_on(api, workspace, "openai")
    frames = [
        openai_frame(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_cut",
                        "type": "function",
                        "function": {"name": "write_file", "arguments": CUT_ARGUMENTS},
                    }
                ],
            }
        ),
        openai_frame({}, "length"),
        "data: [DONE]\n\n",
    ]
    fake.enqueue("openai", FakeReply(raw_sse=frames))
    accepted, terminal = await api.run_turn(sid, "write the notes")
    assert terminal["payload"]["stop_reason"] == "max_tokens"
    messages = (await api.messages(sid))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[1]["content"] == [{"type": "text", "text": ""}]
    assert await tool_call_rows(daemon, sid) == []
    events = await api.turn_events(sid, accepted["turn_id"])
    assert not [t for t in types_of(events) if t.startswith("tool.")]


# -- usage of failed and cancelled calls ----------------------------------------------------------


async def test_a_call_dropped_before_its_usage_chunk_is_costed_as_estimated(
    env: Env, workspace: Path, metis_home: Path
) -> None:
    """OpenAI sends usage only in its last chunk: a stream dropped before it is billed all the
    same, so its prompt and the output streamed so far are estimated, flagged, and counted."""
    _, api, fake = env
    sid = await session_on(api, workspace, "openai")
    fake.enqueue(
        "openai", FakeReply.drop_after(6, text="cut off in the middle", chunk_chars=4, usage=USAGE)
    )
    accepted, terminal, live = await run_watched(api, sid, "hello")
    assert terminal["type"] == "turn.failed" and terminal["payload"]["error_class"] == "network"

    events = await api.turn_events(sid, accepted["turn_id"])
    [started] = of_type(events, "llm.call_started")
    [failed] = of_type(events, "llm.call_failed")
    assert_costed_as_estimated(failed, started["estimated_input_tokens"], streamed_text(live))
    assert terminal["payload"]["total_cost_usd"] == failed["cost_usd"]
    _, session = await api.call("GET", f"/sessions/{sid}")
    assert session["cost_so_far_usd"] == failed["cost_usd"]

    # the partial message is stored and streamed with the same usage
    [complete] = [e["payload"] for e in live if e["type"] == "message.complete"]
    assert complete["stop_reason"] == "error"
    assert complete["usage"]["cost_usd"] == failed["cost_usd"]
    assert complete["usage"]["estimated"] is True
    assistant = (await api.messages(sid))["messages"][-1]
    assert assistant["metadata"]["status"] == "error"
    assert assistant["metadata"]["usage"]["cost_usd"] == failed["cost_usd"]
    assert_store_invariants(metis_home, sid)


async def test_a_call_dropped_after_message_start_adds_the_streamed_output_to_what_it_reported(
    env: Env, workspace: Path, metis_home: Path
) -> None:
    """Anthropic's message_start reports the prompt's buckets and `output_tokens: 1`; the output
    streamed after it, never reported, is estimated."""
    _, api, fake = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        FakeReply.drop_after(8, text="cut off in the middle", chunk_chars=4, usage=USAGE),
    )
    accepted, terminal, live = await run_watched(api, sid, "hello")
    assert terminal["type"] == "turn.failed"
    [failed] = of_type(await api.turn_events(sid, accepted["turn_id"]), "llm.call_failed")
    assert_costed_as_estimated(failed, USAGE["input_tokens"], streamed_text(live))
    assert failed["cost_usd"] == terminal["payload"]["total_cost_usd"]
    assert_store_invariants(metis_home, sid)


async def test_a_call_cancelled_before_its_usage_chunk_is_costed_as_estimated(
    env: Env, workspace: Path, metis_home: Path
) -> None:
    _, api, fake = env
    sid = await session_on(api, workspace, "openai")
    fake.enqueue("openai", FakeReply.hang_after(5, text="this never finishes", chunk_chars=3))
    ws, _ = await Ws.subscribed(api, sid)
    try:
        status, accepted = await api.submit(sid, "hello")
        assert status == 202
        turn_id = accepted["turn_id"]
        await ws.until(is_event("text.delta"))
        status, _ = await api.call("POST", f"/sessions/{sid}/turns/{turn_id}/cancel")
        assert status == 202
        live = await ws.turn(turn_id)
    finally:
        await ws.close()
    [complete] = of_type(live, "message.complete")
    assert complete["stop_reason"] == "cancelled" and complete["usage"]["estimated"] is True
    terminal = await api.wait_turn(sid, turn_id)  # read back once stored
    assert terminal["type"] == "turn.cancelled"
    events = await api.turn_events(sid, turn_id)
    [started] = of_type(events, "llm.call_started")
    [failed] = of_type(events, "llm.call_failed")
    assert failed["error_class"] == "cancelled"
    assert_costed_as_estimated(failed, started["estimated_input_tokens"], streamed_text(live))
    assert failed["cost_usd"] == complete["usage"]["cost_usd"]
    assert terminal["payload"]["total_cost_usd"] == failed["cost_usd"]
    assert_store_invariants(metis_home, sid)


async def test_a_turn_or_patch_sent_while_an_end_runs_is_refused_with_the_ends_time(
    brief_shell_kill_grace: None, env: Env, workspace: Path
) -> None:
    """An end waits for its turn's cancel; a shell that ignores SIGTERM holds it for the kill's
    grace (5 s, 1.5 s here). A turn or model PATCH sent meanwhile waits for the end, so its 409
    says when the session ended, as one sent after it would (a title may change after an end)."""
    d, api, fake = env
    command = "trap '' TERM; echo ready > ready; sleep 30"
    fake.enqueue("anthropic", FakeReply.call("shell", {"command": command, "timeout_seconds": 60}))
    sid = await session_on(api, workspace, "anthropic")
    status, _ = await api.submit(sid, "run it")
    assert status == 202
    async with asyncio.timeout(20):
        while not (workspace / "ready").exists():
            await asyncio.sleep(0.02)
    ending = asyncio.create_task(api.call("DELETE", f"/sessions/{sid}"))
    async with asyncio.timeout(20):
        while not d.core.sessions.is_ending(sid):
            await asyncio.sleep(0.01)
    assert not ending.done()
    text = {"content": [{"type": "text", "text": "late"}]}
    (turned, refused_turn), (patched, refused_patch), (ended, view) = await asyncio.gather(
        api.call("POST", f"/sessions/{sid}/turns", text),
        api.call("PATCH", f"/sessions/{sid}", {"active_model": "openai:gpt-5"}),
        ending,
    )
    assert ended == 200 and view["ended_at"] is not None
    for status, body in ((turned, refused_turn), (patched, refused_patch)):
        assert status == 409 and body["error"]["code"] == "session_already_ended", body
        assert body["error"]["details"] == {"ended_at": view["ended_at"]}
