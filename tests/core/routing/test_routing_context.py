"""The per-turn token estimate shared by predicates and validation."""

from __future__ import annotations

import json

from metis.core.canonical.content import (
    Base64Source,
    ContentBlock,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message
from metis.core.canonical.tools import ToolDefinition
from metis.core.routing.context import estimate_input_tokens

IMAGE = ImageBlock(source=Base64Source(media_type="image/png", data="aGVsbG8="))


def message(content: list[ContentBlock]) -> Message:
    return Message(
        id=new_ulid(), session_id="s", turn_id=None, role="user", content=content, created_at_us=1
    )


def test_estimate_is_a_quarter_of_the_characters_rounded_up_plus_images() -> None:
    assert estimate_input_tokens() == 0
    assert estimate_input_tokens(new_content=[TextBlock(text="abcde")]) == 2
    assert estimate_input_tokens(new_content=[TextBlock(text="abcd"), IMAGE]) == 1 + 1600


def test_estimate_counts_prompt_tools_history_and_message() -> None:
    tool = ToolDefinition(name="read", description="Read a file", input_schema={"type": "object"})
    tool_json = json.dumps(
        {"description": "Read a file", "input_schema": {"type": "object"}, "name": "read"},
        separators=(",", ":"),
    )
    history = [
        message([TextBlock(text="x" * 10)]),
        message(
            [
                ThinkingBlock(thinking="not counted"),
                ToolUseBlock(id="tu_1", name="read", input={"p": 1}),
            ]
        ),
        message([ToolResultBlock(tool_use_id="tu_1", content=[TextBlock(text="y" * 6), IMAGE])]),
    ]
    chars = 8 + len(tool_json) + 10 + len('{"p":1}') + 6 + 3
    expected = -(-chars // 4) + 1600
    assert (
        estimate_input_tokens(
            system_prompt="s" * 8,
            tools=[tool],
            history=history,
            new_content=[TextBlock(text="new")],
        )
        == expected
    )
    assert estimate_input_tokens(tools=[tool]) == estimate_input_tokens(
        tools=[{"name": "read", "description": "Read a file", "input_schema": {"type": "object"}}]
    )


def test_repeated_and_growing_histories_estimate_as_if_measured_afresh() -> None:
    history = [message([TextBlock(text="x" * (i + 1))]) for i in range(6)]
    call = message([ToolUseBlock(id="tu_1", name="read", input={"path": "a" * 7})])
    for n in (3, 3, 5, 6):  # a first history, the same again, then longer ones
        expected = -(-sum(i + 1 for i in range(n)) // 4)
        assert estimate_input_tokens(history=[*history[:n]]) == expected
    # a different history sharing only a prefix is not mistaken for a longer one
    assert estimate_input_tokens(history=[*history[:2], call]) == -(
        -(1 + 2 + len('{"path":"aaaaaaa"}')) // 4
    )
    assert estimate_input_tokens(history=[message([TextBlock(text="x")])]) == 1  # not identical


def test_tool_dicts_are_measured_on_every_call() -> None:
    tool = {"name": "t", "description": "", "input_schema": {}}
    before = estimate_input_tokens(tools=[tool])
    tool["description"] = "d" * 40
    assert estimate_input_tokens(tools=iter([tool])) == before + 10
