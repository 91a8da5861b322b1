"""Tool calls — one, parallel, compat quirks, canonical ids, derived wire ids."""

from __future__ import annotations

from typing import Any

import pytest

from metis.core.canonical.content import TextBlock, ToolUseBlock
from metis.core.providers.base import ToolIdMap, ToolUseEnd, ToolUseInputDelta, ToolUseStart
from metis.core.providers.streaming import parse_tool_input
from metis.core.tools.schema import InputError, unparsed_input, validate_input
from metis.testing import FakeProviderServer, FakeReply
from tests.core.providers.provider_kit import (
    APIS,
    READ_FILE,
    check_invariants,
    collect,
    msg,
    request,
    tool_msg,
    user,
)
from tests.e2e.test_turn_endings import CUT_OFF_REPLIES, anthropic_frame

TWO_CALLS: list[dict[str, Any]] = [
    {"name": "read_file", "input": {"path": "a.txt"}},
    {"name": "list_dir", "input": {"path": "src", "depth": 2}},
]


async def _stream(make_adapter, kind: str, reply: FakeReply, fake: FakeProviderServer, **kw: Any):
    fake.enqueue(kind, reply)
    adapter = make_adapter(kind, **kw)
    req = request(kind, user("go"), tools=[READ_FILE])
    events, error = await collect(adapter.stream(req))
    assert error is None
    return req, events, check_invariants(events)


def _calls(complete) -> list[tuple[str, dict[str, Any]]]:
    return [(b.name, b.input) for b in complete.final_content if isinstance(b, ToolUseBlock)]


@pytest.mark.parametrize("kind", APIS)
async def test_single_tool_call_streams_start_deltas_end_with_a_canonical_id(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    reply = FakeReply.call("read_file", {"path": "README.md"}, text="Reading.", chunk_chars=4)
    req, events, complete = await _stream(make_adapter, kind, reply, fake)
    start = next(e for e in events if isinstance(e, ToolUseStart))
    deltas = [e for e in events if isinstance(e, ToolUseInputDelta)]
    end = next(e for e in events if isinstance(e, ToolUseEnd))
    assert start.tool_use_id.startswith("tu_") and len(start.tool_use_id) == 29
    assert start.tool_name == "read_file" and start.content_block_index == 1
    assert len(deltas) > 1 and all(d.tool_use_id == start.tool_use_id for d in deltas)
    assert end.final_input == {"path": "README.md"}
    assert complete.stop_reason == "tool_use"
    assert complete.final_content[0] == TextBlock(text="Reading.")
    wire_id = "toolu_fake_0_0" if kind == "anthropic" else "call_fake_0_0"
    assert req.tool_ids.provider_id(start.tool_use_id) == wire_id
    assert req.tool_ids.canonical_id(wire_id) == start.tool_use_id


@pytest.mark.parametrize("kind", APIS)
async def test_parallel_calls_get_distinct_ids_and_indexes(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    _, events, complete = await _stream(make_adapter, kind, FakeReply(tool_calls=TWO_CALLS), fake)
    starts = [e for e in events if isinstance(e, ToolUseStart)]
    assert [s.content_block_index for s in starts] == [0, 1]
    assert len({s.tool_use_id for s in starts}) == 2
    assert _calls(complete) == [(c["name"], c["input"]) for c in TWO_CALLS]


@pytest.mark.parametrize(
    "quirk",
    [
        {"same_index_parallel": True},
        {"omit_tool_index": True},
        {"name_late": True},
        {"arguments_as_object": True},
        {"same_index_parallel": True, "name_late": True},
    ],
    ids=["same_index_parallel", "omit_tool_index", "name_late", "arguments_as_object", "mixed"],
)
async def test_openai_compat_quirks_are_repaired(
    quirk: dict[str, Any], fake: FakeProviderServer, make_adapter
) -> None:
    reply = FakeReply(tool_calls=TWO_CALLS, chunk_chars=3, **quirk)
    _, events, complete = await _stream(make_adapter, "openai", reply, fake)
    assert _calls(complete) == [(c["name"], c["input"]) for c in TWO_CALLS]
    starts = [e for e in events if isinstance(e, ToolUseStart)]
    assert [s.tool_name for s in starts] == ["read_file", "list_dir"]
    assert complete.stop_reason == "tool_use"


async def test_openai_stop_finish_with_calls_becomes_tool_use(
    fake: FakeProviderServer, make_adapter
) -> None:
    reply = FakeReply(tool_calls=TWO_CALLS[:1], stop_reason="stop")
    _, _, complete = await _stream(make_adapter, "openai", reply, fake)
    assert complete.stop_reason == "tool_use"
    assert complete.provider_stop_reason == "stop"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    import json

    body = {
        "id": "chatcmpl-raw",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n"


async def test_openai_calls_without_ids_and_broken_json_end_saying_what_was_wrong(
    fake: FakeProviderServer, make_adapter, caplog: pytest.LogCaptureFixture
) -> None:
    frames = [
        _chunk({"role": "assistant"}),
        _chunk(
            {"tool_calls": [{"index": 0, "function": {"name": "read_file", "arguments": '{"pa'}}]}
        ),
        _chunk(
            {"tool_calls": [{"index": 1, "function": {"name": "list_dir", "arguments": "[1]"}}]}
        ),
        _chunk({}, "tool_calls"),
        "data: [DONE]\n\n",
    ]
    reply = FakeReply(raw_sse=frames)
    _, events, complete = await _stream(make_adapter, "openai", reply, fake)
    broken = unparsed_input(
        "arguments were not valid JSON (EOF while parsing a string at line 1 column 4, 4 chars)"
    )
    not_object = unparsed_input("arguments were not a JSON object (a JSON array)")
    # a call whose JSON stops short ends once the stop reason says it was not cut off
    ends = [e for e in events if isinstance(e, ToolUseEnd)]
    assert [(e.content_block_index, e.final_input) for e in ends] == [(1, not_object), (0, broken)]
    assert not any(e.dropped for e in ends)
    assert _calls(complete) == [("read_file", broken), ("list_dir", not_object)]
    assert "not valid JSON" in caplog.text and "not a JSON object" in caplog.text


async def test_text_resuming_after_a_call_opens_a_new_text_block(
    fake: FakeProviderServer, make_adapter
) -> None:
    frames = [
        _chunk({"role": "assistant", "content": "before "}),
        _chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "function": {"name": "read_file", "arguments": "{}"}}
                ]
            }
        ),
        _chunk({"content": "after"}),
        _chunk({}, "tool_calls"),
        "data: [DONE]\n\n",
    ]
    _, _, complete = await _stream(make_adapter, "openai", FakeReply(raw_sse=frames), fake)
    kinds = [(b.type, getattr(b, "text", None)) for b in complete.final_content]
    assert kinds == [("text", "before "), ("tool_use", None), ("text", "after")]


@pytest.mark.parametrize("kind", APIS)
async def test_next_request_carries_derived_wire_ids(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply.call("read_file", {"path": "x"}))
    adapter = make_adapter(kind)
    ids = ToolIdMap()
    first = request(kind, user("use tool"), tools=[READ_FILE], tool_ids=ids)
    events, _ = await collect(adapter.stream(first))
    complete = events[-1]
    call = next(b for b in complete.final_content if isinstance(b, ToolUseBlock))
    history = [
        user("use tool"),
        msg("assistant", *complete.final_content, provider=kind),
        tool_msg(call.id, "file body"),
    ]
    await collect(adapter.stream(request(kind, *history, tools=[READ_FILE], tool_ids=ids)))
    body = fake.requests[1].body
    ulid = call.id[3:]
    if kind == "anthropic":
        assistant = body["messages"][1]
        assert assistant["content"][-1]["id"] == call.id
        result = body["messages"][2]["content"][0]
        assert result == {
            "type": "tool_result",
            "tool_use_id": call.id,
            "content": [{"type": "text", "text": "file body"}],
        }
    else:
        assistant = body["messages"][1]
        assert assistant["tool_calls"][0]["id"] == f"call_{ulid}"
        assert assistant["tool_calls"][0]["function"] == {
            "name": "read_file",
            "arguments": '{"path": "x"}',
        }
        assert body["messages"][2] == {
            "role": "tool",
            "tool_call_id": f"call_{ulid}",
            "content": "file body",
        }
    # the reply to the results is the scripted summary of them
    assert events[-1].stop_reason == "tool_use"


@pytest.mark.parametrize("kind", APIS)
async def test_complete_mints_canonical_ids_for_json_tool_calls(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply(tool_calls=TWO_CALLS))
    adapter = make_adapter(kind)
    req = request(kind, user("go"), tools=[READ_FILE])
    result = await adapter.complete(req)
    calls = [b for b in result.final_content if isinstance(b, ToolUseBlock)]
    assert [c.name for c in calls] == ["read_file", "list_dir"]
    assert all(c.id.startswith("tu_") for c in calls)
    assert len(req.tool_ids) == 2
    assert result.stop_reason == "tool_use"


@pytest.mark.parametrize(
    "arguments",
    ['{"path": "\\ud800"}', "[" * 100_000 + "]" * 100_000, '{"a": ' * 5000 + "1" + "}" * 5000],
)
def test_unholdable_tool_arguments_parse_as_unparsed_input(arguments: str) -> None:
    """A lone surrogate cannot be stored as UTF-8 and deep nesting exhausts the recursion
    limit: both are unparseable input (said why, for the schema check), never an exception."""
    [reason] = parse_tool_input(arguments, warn=False).values()
    assert reason.startswith("arguments were not valid JSON (")
    assert reason.endswith(f", {len(arguments)} chars)")


@pytest.mark.parametrize("kind", APIS)
async def test_a_call_cut_off_by_the_output_limit_ends_dropped_and_leaves_the_message(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    """Its end comes last before `message.complete` (only the stop reason tells a cut-off call
    from broken JSON), saying `dropped`, so clients never take it for a call that runs."""
    reply = FakeReply(raw_sse=CUT_OFF_REPLIES[kind])
    _, events, complete = await _stream(make_adapter, kind, reply, fake)
    starts = {e.tool_use_id: e.tool_name for e in events if isinstance(e, ToolUseStart)}
    ends = [e for e in events if isinstance(e, ToolUseEnd)]
    assert [(starts[e.tool_use_id], e.dropped) for e in ends] == [
        ("read_file", False),
        ("write_file", True),
    ]
    assert events[-2] == ends[-1] and ends[-1].final_input == {}
    assert complete.stop_reason == "max_tokens"
    assert _calls(complete) == [("read_file", {"path": "README.md"})]


async def test_a_call_cut_off_by_the_output_limit_leaves_a_non_streaming_reply_too(
    fake: FakeProviderServer, make_adapter
) -> None:
    """`complete()` keeps the streaming rule: the last call, its arguments stopping mid-JSON
    under a `length` finish, was never made, so it is not in the message; the complete call
    before it stays."""

    def call(n: int, name: str, arguments: str) -> dict[str, Any]:
        return {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            call(1, "read_file", '{"path": "README.md"}'),
            call(2, "write_file", '{"path": "a.txt", "content": "abc'),
        ],
    }
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
    }
    fake.enqueue("openai", FakeReply(raw_json=body))
    result = await make_adapter("openai").complete(request("openai", user("go"), tools=[READ_FILE]))
    assert result.stop_reason == "max_tokens"
    assert _calls(result) == [("read_file", {"path": "README.md"})]


def anthropic_call(arguments: str, stop: str) -> list[str]:
    """One streamed tool_use whose arguments are `arguments`, ended by `stop`."""
    block = {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {}}
    delta = {"type": "input_json_delta", "partial_json": arguments}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": {}}
    return [
        anthropic_frame("message_start", {"message": message}),
        anthropic_frame("content_block_start", {"index": 0, "content_block": block}),
        anthropic_frame("content_block_delta", {"index": 0, "delta": delta}),
        anthropic_frame("content_block_stop", {"index": 0}),
        anthropic_frame("message_delta", {"delta": {"stop_reason": stop}, "usage": {}}),
        anthropic_frame("message_stop", {}),
    ]


async def test_a_finished_call_with_broken_json_tells_the_schema_check_why(
    fake: FakeProviderServer, make_adapter
) -> None:
    """Not cut off (the model stopped for `tool_use`): the call stays, with an input that can be
    sent back to the provider and that validation reports as broken JSON, not as every
    required field missing."""
    arguments = '{"path": "a.txt", "content": "abc'
    reply = FakeReply(raw_sse=anthropic_call(arguments, "tool_use"))
    _, events, complete = await _stream(make_adapter, "anthropic", reply, fake)
    [end] = [e for e in events if isinstance(e, ToolUseEnd)]
    assert not end.dropped
    why = "arguments were not valid JSON (EOF while parsing a string at line 1 column 33, 33 chars)"
    assert _calls(complete) == [("write_file", unparsed_input(why))]
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    }
    assert validate_input(schema, end.final_input).errors == (InputError("$", why),)


async def test_openai_skips_a_named_event_it_does_not_know(
    fake: FakeProviderServer, make_adapter
) -> None:
    """Chat Completions sends unnamed chunks only; a compatible server's extra named event (not
    JSON, here) is skipped as SSE consumers skip events they have no listener for, instead of
    failing the call and forcing a retry."""
    frames = [
        _chunk({"role": "assistant", "content": "Hello"}),
        "event: weird\ndata: hi\n\n",
        _chunk({"content": " there"}, "stop"),
        "data: [DONE]\n\n",
    ]
    _, _, complete = await _stream(make_adapter, "openai", FakeReply(raw_sse=frames), fake)
    assert complete.final_content == [TextBlock(text="Hello there")]
    assert len(fake.requests) == 1
