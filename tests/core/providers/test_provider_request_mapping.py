"""Request mapping, asserted on the bodies the fake server recorded."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from metis.core.canonical.content import (
    ImageBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UrlSource,
)
from metis.testing import FakeProviderServer
from tests.core.providers.provider_kit import (
    APIS,
    KEYS,
    LIST_DIR,
    PNG_B64,
    READ_FILE,
    caps,
    collect,
    msg,
    png,
    request,
    tool_msg,
    user,
)

EPHEMERAL = {"type": "ephemeral"}


async def _body(make_adapter, fake: FakeProviderServer, kind: str, *messages, **kw: Any) -> dict:
    options = kw.pop("options", {})
    adapter = make_adapter(kind, options=options) if options else make_adapter(kind)
    await collect(adapter.stream(request(kind, *messages, **kw)))
    return fake.requests[-1].body


def _tool_history() -> list:
    call_a = ToolUseBlock(id="tu_01AAAAAAAAAAAAAAAAAAAAAAAA", name="read_file", input={"path": "a"})
    call_b = ToolUseBlock(id="tu_01BBBBBBBBBBBBBBBBBBBBBBBB", name="list_dir", input={})
    return [
        user("start"),
        msg("assistant", TextBlock(text="Two calls."), call_a, call_b, provider="anthropic"),
        tool_msg(call_b.id, "dir listing"),  # out of call order on purpose
        tool_msg(call_a.id, "boom", is_error=True),
        user("and now?"),
    ]


async def test_anthropic_system_blocks_and_cache_breakpoints(
    fake: FakeProviderServer, make_adapter
) -> None:
    body = await _body(
        make_adapter,
        fake,
        "anthropic",
        *_tool_history(),
        system="stable rules",
        system_volatile="today is Tuesday",
        tools=[READ_FILE, LIST_DIR],
        capabilities=caps(supports_prompt_caching=True),
    )
    assert body["system"] == [
        {"type": "text", "text": "stable rules", "cache_control": EPHEMERAL},
        {"type": "text", "text": "today is Tuesday"},
    ]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][1]["cache_control"] == EPHEMERAL
    last = body["messages"][-1]["content"]
    assert last[-1] == {"type": "text", "text": "and now?", "cache_control": EPHEMERAL}
    assert str(body).count("'cache_control'") == 3  # at most 3 of Anthropic's 4 breakpoints


async def test_anthropic_without_caching_capability_sends_no_breakpoints(
    fake: FakeProviderServer, make_adapter
) -> None:
    body = await _body(
        make_adapter, fake, "anthropic", user("hi"), system="stable", tools=[READ_FILE]
    )
    assert "cache_control" not in str(body)
    assert body["system"] == [{"type": "text", "text": "stable"}]


async def test_anthropic_breakpoint_skips_trailing_thinking_blocks(
    fake: FakeProviderServer, make_adapter
) -> None:
    from metis.core.canonical.content import ThinkingBlock

    history = [
        user("q"),
        msg(
            "assistant",
            TextBlock(text="partial"),
            ThinkingBlock(thinking="t", signature="s"),
            provider="anthropic",
        ),
    ]
    body = await _body(
        make_adapter,
        fake,
        "anthropic",
        *history,
        capabilities=caps(supports_prompt_caching=True, supports_thinking=True),
        thinking_budget_tokens=2000,
    )
    content = body["messages"][-1]["content"]
    assert content[0]["cache_control"] == EPHEMERAL and "cache_control" not in content[1]


async def test_anthropic_empty_system_is_omitted(fake: FakeProviderServer, make_adapter) -> None:
    body = await _body(make_adapter, fake, "anthropic", user("hi"))
    assert "system" not in body and "tools" not in body and "temperature" not in body


async def test_anthropic_merges_results_and_following_user_text_into_one_message(
    fake: FakeProviderServer, make_adapter
) -> None:
    body = await _body(make_adapter, fake, "anthropic", *_tool_history(), tools=[READ_FILE])
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user"]
    merged = body["messages"][2]["content"]
    assert merged == [
        {
            "type": "tool_result",
            "tool_use_id": "tu_01AAAAAAAAAAAAAAAAAAAAAAAA",
            "content": [{"type": "text", "text": "boom"}],
            "is_error": True,
        },
        {
            "type": "tool_result",
            "tool_use_id": "tu_01BBBBBBBBBBBBBBBBBBBBBBBB",
            "content": [{"type": "text", "text": "dir listing"}],
        },
        {"type": "text", "text": "and now?"},
    ]


async def test_openai_sends_each_result_as_its_own_tool_message_in_call_order(
    fake: FakeProviderServer, make_adapter
) -> None:
    body = await _body(
        make_adapter,
        fake,
        "openai",
        *_tool_history(),
        system="stable",
        system_volatile="volatile",
        tools=[READ_FILE],
    )
    messages = body["messages"]
    assert messages[0] == {"role": "system", "content": "stable\n\nvolatile"}
    assert messages[1] == {"role": "user", "content": "start"}
    assert messages[2]["content"] == "Two calls."
    assert [c["id"] for c in messages[2]["tool_calls"]] == [
        "call_01AAAAAAAAAAAAAAAAAAAAAAAA",
        "call_01BBBBBBBBBBBBBBBBBBBBBBBB",
    ]
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "call_01AAAAAAAAAAAAAAAAAAAAAAAA",
        "content": "[tool error] boom",
    }
    assert messages[4]["tool_call_id"] == "call_01BBBBBBBBBBBBBBBBBBBBBBBB"
    assert messages[5] == {"role": "user", "content": "and now?"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file",
                "parameters": READ_FILE.input_schema,
            },
        }
    ]


@pytest.mark.parametrize(
    ("options", "field", "absent"),
    [
        ({}, "max_completion_tokens", "max_tokens"),
        ({"max_tokens_field": "max_tokens"}, "max_tokens", "max_completion_tokens"),
    ],
)
async def test_openai_output_limit_field_follows_the_provider_option(
    options: dict, field: str, absent: str, fake: FakeProviderServer, make_adapter
) -> None:
    body = await _body(
        make_adapter, fake, "openai", user("hi"), options=options, max_output_tokens=777
    )
    assert body[field] == 777 and absent not in body


async def test_openai_stream_options_follow_stream_include_usage(
    fake: FakeProviderServer, make_adapter
) -> None:
    on = await _body(make_adapter, fake, "openai", user("hi"))
    assert on["stream"] is True and on["stream_options"] == {"include_usage": True}
    off = await _body(
        make_adapter, fake, "openai", user("hi"), options={"stream_include_usage": False}
    )
    assert off["stream"] is True and "stream_options" not in off


@pytest.mark.parametrize("kind", APIS)
async def test_parallel_tool_calls_flag_only_when_tools_exist_and_capability_is_false(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    serial = caps(supports_parallel_tool_calls=False)
    with_tools = await _body(
        make_adapter, fake, kind, user("hi"), tools=[READ_FILE], capabilities=serial
    )
    without_tools = await _body(make_adapter, fake, kind, user("hi"), capabilities=serial)
    parallel = await _body(make_adapter, fake, kind, user("hi"), tools=[READ_FILE])
    if kind == "anthropic":
        assert with_tools["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
        assert "tool_choice" not in without_tools and "tool_choice" not in parallel
        assert with_tools["tools"] == [
            {
                "name": "read_file",
                "description": "Read a file",
                "input_schema": READ_FILE.input_schema,
            }
        ]
    else:
        assert with_tools["parallel_tool_calls"] is False
        assert "parallel_tool_calls" not in without_tools
        assert "parallel_tool_calls" not in parallel


@pytest.mark.parametrize("kind", APIS)
async def test_tools_are_not_offered_to_a_model_without_tool_support(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    body = await _body(
        make_adapter,
        fake,
        kind,
        user("hi"),
        tools=[READ_FILE],
        capabilities=caps(supports_tools=False),
    )
    assert "tools" not in body


@pytest.mark.parametrize("kind", APIS)
async def test_temperature_and_stop_are_sent_only_when_set(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    plain = await _body(make_adapter, fake, kind, user("hi"))
    tuned = await _body(
        make_adapter, fake, kind, user("hi"), temperature=0.2, stop_sequences=["END"]
    )
    stop_key = "stop_sequences" if kind == "anthropic" else "stop"
    assert "temperature" not in plain and stop_key not in plain
    assert tuned["temperature"] == 0.2 and tuned[stop_key] == ["END"]


def _image_history() -> list:
    url_image = ImageBlock(source=UrlSource(url="https://example.com/cat.png"))
    call = ToolUseBlock(id="tu_01CCCCCCCCCCCCCCCCCCCCCCCC", name="screenshot", input={})
    result = ToolResultBlock(
        tool_use_id=call.id, content=[TextBlock(text="shot:"), png()], is_error=False
    )
    return [
        msg("user", TextBlock(text="look"), png(), url_image),
        msg("assistant", call, provider="anthropic"),
        msg("tool", result, tool_use_id=call.id),
    ]


async def test_anthropic_images_base64_url_and_in_tool_results(
    fake: FakeProviderServer, make_adapter
) -> None:
    body = await _body(
        make_adapter, fake, "anthropic", *_image_history(), capabilities=caps(supports_images=True)
    )
    first = body["messages"][0]["content"]
    assert first[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64},
    }
    assert first[2] == {
        "type": "image",
        "source": {"type": "url", "url": "https://example.com/cat.png"},
    }
    result = body["messages"][2]["content"][0]
    assert result["content"][1]["type"] == "image"


async def test_openai_images_as_parts_with_data_urls(
    fake: FakeProviderServer, make_adapter
) -> None:
    body = await _body(
        make_adapter, fake, "openai", *_image_history(), capabilities=caps(supports_images=True)
    )
    parts = body["messages"][0]["content"]
    assert parts == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    assert body["messages"][2] == {
        "role": "tool",
        "tool_call_id": "call_01CCCCCCCCCCCCCCCCCCCCCCCC",
        "content": "shot:\n[image]",
    }


@pytest.mark.parametrize("kind", APIS)
async def test_non_vision_models_get_an_image_placeholder(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    body = await _body(make_adapter, fake, kind, *_image_history())
    assert "base64" not in str(body) and "example.com" not in str(body)
    first = body["messages"][0]["content"]
    assert {"type": "text", "text": "[image omitted]"} in first
    if kind == "anthropic":
        inner = body["messages"][2]["content"][0]["content"]
        assert inner[1] == {"type": "text", "text": "[image omitted]"}


@pytest.mark.parametrize("kind", APIS)
async def test_orphans_are_repaired_and_stray_results_dropped(
    kind: str, fake: FakeProviderServer, make_adapter, caplog: pytest.LogCaptureFixture
) -> None:
    orphan = ToolUseBlock(id="tu_01DDDDDDDDDDDDDDDDDDDDDDDD", name="read_file", input={})
    history = [
        user("go"),
        msg("assistant", orphan, provider=kind),
        tool_msg("tu_01EEEEEEEEEEEEEEEEEEEEEEEE", "stray result"),
        user("continue"),
    ]
    body = await _body(make_adapter, fake, kind, *history)
    assert "stray result" not in str(body)
    assert "Tool call was not completed" in str(body)
    if kind == "anthropic":
        merged = body["messages"][2]["content"]
        assert merged[0] == {
            "type": "tool_result",
            "tool_use_id": orphan.id,
            "content": [{"type": "text", "text": "Tool call was not completed"}],
            "is_error": True,
        }
        assert merged[1] == {"type": "text", "text": "continue"}
    else:
        assert body["messages"][2] == {
            "role": "tool",
            "tool_call_id": "call_01DDDDDDDDDDDDDDDDDDDDDDDD",
            "content": "[tool error] Tool call was not completed",
        }
    assert "without its call" in caplog.text


@pytest.mark.parametrize("kind", APIS)
async def test_empty_text_blocks_and_empty_assistant_messages_are_dropped(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    history = [
        msg("user", TextBlock(text="one"), TextBlock(text="")),
        msg("assistant", TextBlock(text=""), provider=kind),
        user("two"),
    ]
    body = await _body(make_adapter, fake, kind, *history)
    messages = [m for m in body["messages"] if m["role"] != "system"]
    if kind == "anthropic":
        assert messages == [
            {
                "role": "user",
                "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
            }
        ]
    else:
        assert messages == [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]


async def test_keyless_provider_sends_the_placeholder_key(
    fake: FakeProviderServer, make_adapter
) -> None:
    fake.expected_keys.clear()
    adapter = make_adapter("openai", api_key=None)
    await collect(adapter.stream(request("openai", user("hi"))))
    assert fake.requests[0].headers["authorization"] == "Bearer metis-no-key"


@pytest.mark.parametrize("kind", APIS)
async def test_a_growing_session_sends_its_whole_history_on_every_call(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    """The adapter reuses the encoded history between calls; the server must not notice."""
    adapter = make_adapter(kind)
    history = [user("q0")]
    for turn in range(1, 6):
        await collect(adapter.stream(request(kind, *history)))
        history += [msg("assistant", TextBlock(text=f"a{turn}"), provider=kind), user(f"q{turn}")]
    await collect(adapter.stream(request(kind, *history)))
    sent = [m["content"] for m in fake.requests[-1].body["messages"]]
    texts = [c if isinstance(c, str) else c[0]["text"] for c in sent]
    assert texts == ["q0", "a1", "q1", "a2", "q2", "a3", "q3", "a4", "q4", "a5", "q5"]


@pytest.mark.parametrize("kind", APIS)
async def test_request_bodies_are_logged_at_debug_level_only(
    kind: str, fake: FakeProviderServer, make_adapter, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = make_adapter(kind)
    with caplog.at_level(logging.INFO):
        await collect(adapter.stream(request(kind, user("quiet words"))))
    assert "quiet words" not in caplog.text
    with caplog.at_level(logging.DEBUG):
        await collect(adapter.stream(request(kind, user("loud words"))))
    assert "loud words" in caplog.text and KEYS[kind] not in caplog.text
