"""The scripted model — planner rules and texts, schema filling, streaming, usage, cancel."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from metis.core.canonical.content import TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from metis.core.canonical.tools import ToolDefinition
from metis.core.models.types import ProviderConfig
from metis.core.providers import ProviderError, build_adapter
from metis.core.providers.base import TextDelta, ThinkingDelta, ToolUseEnd, ToolUseInputDelta
from metis.core.providers.scripted import (
    ScriptedAdapter,
    ScriptedView,
    fill_object,
    neutral_value,
    plan_scripted_reply,
)
from metis.testing import FakeProviderServer
from tests.core.providers.provider_kit import (
    APIS,
    RecordingHooks,
    caps,
    check_invariants,
    collect,
    msg,
    png,
    request,
    user,
)


def tool(
    name: str, origin: str = "builtin", schema: dict[str, Any] | None = None
) -> ToolDefinition:
    return ToolDefinition(
        name=name,
        description=f"{name} tool",
        input_schema=schema or {"type": "object", "properties": {}},
        origin=origin,  # type: ignore[arg-type]
    )


SERVER_A = tool(
    "read_file",
    schema={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
SERVER_B = tool("list_dir")
CLIENT = tool(
    "ask_user",
    "application",
    {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)


def plan(*messages, tools=(), both=False):
    return plan_scripted_reply(ScriptedView(list(messages), list(tools), all_tools_both=both))


def scripted(**options: Any) -> ScriptedAdapter:
    adapter = build_adapter(ProviderConfig(name="local", adapter="scripted", options=options))
    assert isinstance(adapter, ScriptedAdapter)
    return adapter


# ---------------------------------------------------------------------------------------------
# planner
# ---------------------------------------------------------------------------------------------


def test_echo_quotes_the_last_user_text_and_counts_images() -> None:
    assert plan(user("hello")).text == 'You said: "hello"'
    both = msg("user", TextBlock(text="look"), png(), TextBlock(text="here"), png())
    p = plan(user("older"), both)
    assert p.text == 'You said: "look\nhere" (with 2 image(s))'
    assert p.stop_reason == "end_turn" and p.tool_calls == () and p.thinking is None


def test_use_all_tools_calls_every_offered_tool_in_order() -> None:
    p = plan(user("Please USE ALL TOOLS now"), tools=[SERVER_A, CLIENT, SERVER_B])
    assert p.text == "Calling read_file, ask_user, list_dir."
    assert [(c.name, c.input) for c in p.tool_calls] == [
        ("read_file", {"path": "metis-demo.txt"}),
        ("ask_user", {"q": "conformance"}),
        ("list_dir", {}),
    ]
    assert p.stop_reason == "tool_use"


def test_the_demo_writes_only_to_a_file_named_metis_demo_txt() -> None:
    """`use all tools` runs in the user's workspace: its writes name themselves."""
    path_and = {"path": {"type": "string"}, "content": {"type": "string"}}
    write = tool(
        "write_file",
        schema={"type": "object", "properties": path_and, "required": ["path", "content"]},
    )
    p = plan(user("use all tools"), tools=[write])
    assert [c.input for c in p.tool_calls] == [{"path": "metis-demo.txt", "content": "conformance"}]


def test_use_server_tool_calls_the_first_builtin() -> None:
    p = plan(user("use server tool"), tools=[CLIENT, SERVER_B, SERVER_A])
    assert p.text == "Calling list_dir." and [c.name for c in p.tool_calls] == ["list_dir"]


def test_use_tool_prefers_the_first_application_tool_then_builtin() -> None:
    assert [c.name for c in plan(user("use tool"), tools=[SERVER_A, CLIENT]).tool_calls] == [
        "ask_user"
    ]
    assert [c.name for c in plan(user("use tool"), tools=[SERVER_B, SERVER_A]).tool_calls] == [
        "list_dir"
    ]


@pytest.mark.parametrize(
    ("text", "tools"),
    [
        ("use all tools, think", []),
        ("use server tool and think", [CLIENT]),
        ("use tool, think", []),
    ],
)
def test_a_tool_step_with_nothing_to_call_echoes_and_never_falls_through(text, tools) -> None:
    p = plan(user(text), tools=tools)
    assert p.text == f'You said: "{text}"' and p.thinking is None and p.stop_reason == "end_turn"


def test_think_adds_a_signed_thinking_block_quoting_80_code_points() -> None:
    text = "think about " + "é" * 100
    p = plan(user(text))
    assert p.thinking == f'The user asked: "{text[:80]}". I will answer by quoting it.'
    assert p.thinking_signature == "scripted" and p.text == f'You said: "{text}"'


def test_results_step_lists_every_result_after_the_last_assistant_message() -> None:
    call_a = ToolUseBlock(id="tu_a", name="read_file", input={})
    call_b = ToolUseBlock(id="tu_b", name="list_dir", input={})
    long_text = "word  \n\t" * 60
    history = [
        user("use all tools"),
        msg("assistant", TextBlock(text="Calling."), call_a, call_b),
        msg(
            "tool",
            ToolResultBlock(
                tool_use_id="tu_a", content=[TextBlock(text="line 1\n   line 2"), png()]
            ),
        ),
        msg(
            "tool",
            ToolResultBlock(tool_use_id="tu_b", content=[TextBlock(text=long_text)], is_error=True),
        ),
        msg("tool", ToolResultBlock(tool_use_id="tu_zzz", content=[TextBlock(text="x")])),
    ]
    p = plan(*history)
    snippet = ("word " * 60).strip()[:200] + "…"
    assert p.text == (
        "Tool results received:\n"
        "- read_file (ok): line 1 line 2 [image]\n"
        f"- list_dir (error): {snippet}\n"
        "- unknown_tool (ok): x"
    )
    assert p.stop_reason == "end_turn"


def test_fake_server_view_counts_every_tool_as_both_kinds() -> None:
    assert [
        c.name for c in plan(user("use server tool"), tools=[CLIENT], both=True).tool_calls
    ] == ["ask_user"]


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"const": 7, "type": "string"}, 7),
        ({"enum": ["b", "a"], "type": "string"}, "b"),
        ({"type": "string"}, "conformance"),
        ({"type": "integer"}, 0),
        ({"type": "integer", "minimum": 2.5}, 3),
        ({"type": "number", "minimum": 2.5}, 2.5),
        ({"type": "integer", "minimum": -4}, 0),
        ({"type": "boolean"}, False),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, [0, 0]),
        ({"type": "array", "items": {"type": "string"}}, []),
        ({"type": "null"}, None),
        ({}, "conformance"),
        ({"type": ["null", "string"]}, "conformance"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "boolean"}, "b": {"type": "string"}},
                "required": ["a"],
            },
            {"a": False},
        ),
    ],
)
def test_schema_filling_per_type(schema: dict[str, Any], value: Any) -> None:
    assert neutral_value(schema) == value


def test_only_required_properties_are_filled_recursively() -> None:
    schema = {
        "type": "object",
        "properties": {
            "inner": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 1}, "skip": {"type": "string"}},
                "required": ["n"],
            },
            "optional": {"type": "string"},
            "mystery": {},
        },
        "required": ["inner", "mystery"],
    }
    assert fill_object(schema) == {"inner": {"n": 1}, "mystery": "conformance"}


# ---------------------------------------------------------------------------------------------
# adapter
# ---------------------------------------------------------------------------------------------


async def test_scripted_stream_chunks_text_thinking_and_tool_input() -> None:
    adapter = scripted(chunk_chars=5)
    hooks = RecordingHooks()
    req = request("local", user("think, then use tool"), tools=[SERVER_A], hooks=hooks)
    events, error = await collect(adapter.stream(req))
    assert error is None
    complete = check_invariants(events)
    # "use tool" wins over "think": a tool step never falls through
    assert complete.final_content == [
        TextBlock(text="Calling read_file."),
        ToolUseBlock(
            id=complete.final_content[1].id, name="read_file", input={"path": "metis-demo.txt"}
        ),
    ]
    assert [e.text for e in events if isinstance(e, TextDelta)] == [
        "Calli",
        "ng re",
        "ad_fi",
        "le.",
    ]
    fragments = [e.partial_json for e in events if isinstance(e, ToolUseInputDelta)]
    assert fragments == ['{"pat', 'h":"m', "etis-", "demo.", 'txt"}']
    assert complete.stop_reason == "tool_use" and complete.provider_stop_reason is None
    assert complete.final_content[1].id.startswith("tu_")
    assert hooks.calls == [("started", 1)]


async def test_scripted_thinking_delta_carries_the_signature_last() -> None:
    adapter = scripted()
    events, _ = await collect(adapter.stream(request("local", user("think"))))
    complete = check_invariants(events)
    thinking = [e for e in events if isinstance(e, ThinkingDelta)]
    assert all(e.signature is None for e in thinking[:-1]) and thinking[-1].signature == "scripted"
    assert thinking[-1].text  # the signature rides on the last chunk of text
    assert complete.final_content == [
        ThinkingBlock(
            thinking='The user asked: "think". I will answer by quoting it.', signature="scripted"
        ),
        TextBlock(text='You said: "think"'),
    ]


async def test_scripted_usage_counts_whitespace_tokens() -> None:
    schema = {"type": "object", "properties": {}}
    tools = [ToolDefinition(name="t1", description="two words", input_schema=schema)]
    history = [
        user("alpha beta"),
        msg(
            "assistant",
            TextBlock(text="gamma"),
            ToolUseBlock(id="tu_x", name="t1", input={"k": "v w"}),
        ),
        msg("tool", ToolResultBlock(tool_use_id="tu_x", content=[TextBlock(text="delta epsilon")])),
        user("zeta eta theta"),
    ]
    req = request("local", *history, tools=tools, system="sys one", system_volatile="vol")
    events, _ = await collect(scripted().stream(req))
    usage = events[-1].usage
    # sys one | vol | alpha beta | gamma | t1 {"k":"v w"} | delta epsilon | zeta eta theta |
    # t1 two words {"properties":{},"type":"object"}
    assert usage.input_tokens == 2 + 1 + 2 + 1 + 1 + 2 + 2 + 3 + 1 + 2 + 1
    assert usage.output_tokens == len(["You", "said:", '"zeta', "eta", 'theta"'])
    assert usage.cache_read_tokens == usage.cache_write_tokens == 0 and not usage.estimated


async def test_scripted_ignores_limits_and_never_fails() -> None:
    req = request(
        "local", user("hello"), max_output_tokens=1, stop_sequences=["said"], temperature=2.0
    )
    events, error = await collect(scripted().stream(req))
    assert error is None and events[-1].stop_reason == "end_turn"
    assert events[-1].final_content == [TextBlock(text='You said: "hello"')]


async def test_scripted_cancel_before_start_raises_cancelled() -> None:
    req = request("local")
    req.cancel.set()
    with pytest.raises(ProviderError) as info:
        async for _ in scripted().stream(req):
            pytest.fail("nothing may be yielded")
    assert info.value.error_class == "cancelled"


async def test_scripted_cancel_mid_stream_closes_the_open_call() -> None:
    adapter = scripted(chunk_chars=2, delta_delay_ms=1)
    req = request("local", user("use tool"), tools=[SERVER_A])
    events = []
    async for event in adapter.stream(req):
        events.append(event)
        if isinstance(event, ToolUseInputDelta):
            req.cancel.set()
    complete = check_invariants(events)
    assert complete.stop_reason == "cancelled"
    assert isinstance(events[-2], ToolUseEnd) and events[-2].final_input == {}
    assert complete.usage.output_tokens > 0


async def test_scripted_delta_delay_is_interrupted_by_cancel() -> None:
    adapter = scripted(chunk_chars=1, delta_delay_ms=1000)
    req = request("local", user("hello"))
    events = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    loop.call_later(0.05, req.cancel.set)
    async for event in adapter.stream(req):
        events.append(event)
    assert loop.time() - start < 0.2
    assert events[-1].stop_reason == "cancelled" and events[-1].final_content == []


async def test_scripted_complete_matches_the_plan() -> None:
    req = request("local", user("think"))
    result = await scripted().complete(req)
    assert [b.type for b in result.final_content] == ["thinking", "text"]
    assert result.stop_reason == "end_turn" and result.attempts == 1


@pytest.mark.parametrize("kind", APIS)
@pytest.mark.parametrize("text", ["think about it", "use all tools", "use tool please", "plain"])
async def test_fake_server_default_equals_the_planner(
    kind: str, text: str, fake: FakeProviderServer, make_adapter
) -> None:
    tools = [SERVER_A, SERVER_B]
    history = [user(text, png())]
    vision = caps(supports_images=True)
    req = request(kind, *history, tools=tools, capabilities=vision)
    events, error = await collect(make_adapter(kind).stream(req))
    assert error is None
    expected = plan(*history, tools=tools, both=True)
    content = events[-1].final_content
    texts = [b.text for b in content if isinstance(b, TextBlock)]
    calls = [(b.name, b.input) for b in content if isinstance(b, ToolUseBlock)]
    assert texts == [expected.text]
    assert calls == [(c.name, c.input) for c in expected.tool_calls]
    assert [b.thinking for b in content if isinstance(b, ThinkingBlock)] == (
        [expected.thinking] if expected.thinking else []
    )
    assert fake.requests[0].reply_source == "default"


@pytest.mark.parametrize("kind", APIS)
async def test_fake_server_default_summarises_tool_results_like_the_planner(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    adapter = make_adapter(kind)
    first = request(kind, user("use tool"), tools=[SERVER_A])
    events, _ = await collect(adapter.stream(first))
    call = next(b for b in events[-1].final_content if isinstance(b, ToolUseBlock))
    history = [
        user("use tool"),
        msg("assistant", *events[-1].final_content, provider=kind),
        msg(
            "tool",
            ToolResultBlock(
                tool_use_id=call.id, content=[TextBlock(text="contents\nof file")], is_error=True
            ),
            tool_use_id=call.id,
        ),
    ]
    events, _ = await collect(adapter.stream(request(kind, *history, tools=[SERVER_A])))
    assert events[-1].final_content == [
        TextBlock(text="Tool results received:\n- read_file (error): contents of file")
    ]
    assert json.loads(json.dumps(fake.requests[1].body))  # recorded body is plain JSON
