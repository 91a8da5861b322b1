"""Helpers for the provider tests: message builders, recording hooks, a fake sleep, invariants.

A plain module (not conftest) so test files can import it by name.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from metis.core.canonical.content import Base64Source, ImageBlock, TextBlock, ToolResultBlock
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message, MessageMetadata
from metis.core.canonical.tools import ToolDefinition
from metis.core.models.types import Capabilities
from metis.core.providers import LLMRequest, ProviderError
from metis.core.providers.base import (
    MessageComplete,
    MessageStart,
    TextDelta,
    ThinkingDelta,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
)
from metis.core.tools.schema import UNPARSED_ARGUMENTS

KEYS = {"anthropic": "ak-test-secret-0001", "openai": "ok-test-secret-0001"}
APIS = ("anthropic", "openai")
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


def caps(**kw: Any) -> Capabilities:
    base: dict[str, Any] = {"max_context_tokens": 200_000, "max_output_tokens": 8192}
    base.update(kw)
    return Capabilities(**base)


def msg(role: str, *blocks: Any, provider: str | None = None, **meta: Any) -> Message:
    return Message(
        id=new_ulid(),
        session_id="sess_test",
        turn_id=None,
        role=role,  # type: ignore[arg-type]
        content=list(blocks),
        created_at_us=0,
        metadata=MessageMetadata(provider=provider, **meta),
    )


def user(text: str, *extra: Any) -> Message:
    return msg("user", TextBlock(text=text), *extra)


def tool_msg(tool_use_id: str, text: str, *, is_error: bool = False) -> Message:
    block = ToolResultBlock(
        tool_use_id=tool_use_id, content=[TextBlock(text=text)], is_error=is_error
    )
    return msg("tool", block, tool_use_id=tool_use_id)


def png() -> ImageBlock:
    return ImageBlock(source=Base64Source(media_type="image/png", data=PNG_B64))


READ_FILE = ToolDefinition(
    name="read_file",
    description="Read a file",
    input_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
)
LIST_DIR = ToolDefinition(
    name="list_dir",
    description="List a directory",
    input_schema={"type": "object", "properties": {"path": {"type": "string"}}},
    origin="application",
)


def request(kind: str, *messages: Message, **kw: Any) -> LLMRequest:
    kw.setdefault("capabilities", caps())
    return LLMRequest(
        request_id=new_ulid(),
        message_id=new_ulid(),
        model=f"{kind}:fake-model",
        wire_model="fake-model",
        messages=list(messages) or [user("hello there")],
        **kw,
    )


class RecordingHooks:
    """Attempt hooks that remember every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def attempt_started(self, attempt: int) -> None:
        self.calls.append(("started", attempt))

    async def attempt_failed(self, attempt: int, error: ProviderError, will_retry: bool) -> None:
        self.calls.append(("failed", attempt, error.error_class, will_retry))


class FakeSleep:
    """Records requested delays; returns at once unless `block` is set (cancel-during-backoff)."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.block = False

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.block:
            await asyncio.Event().wait()


async def collect(stream: AsyncIterator[Any]) -> tuple[list[Any], ProviderError | None]:
    events: list[Any] = []
    try:
        async for event in stream:
            events.append(event)
    except ProviderError as exc:
        return events, exc
    return events, None


def check_invariants(events: list[Any]) -> MessageComplete:
    """The canonical stream invariants on one stream; returns the closing event."""
    assert events, "no events"
    assert isinstance(events[0], MessageStart)
    assert sum(isinstance(e, MessageStart) for e in events) == 1
    assert isinstance(events[-1], MessageComplete)
    assert sum(isinstance(e, MessageComplete) for e in events) == 1
    complete = events[-1]
    content = complete.final_content
    texts: dict[int, str] = {}
    thinking: dict[int, str] = {}
    tools: dict[int, dict[str, Any]] = {}
    seen_indexes: list[int] = []
    for e in events[1:-1]:
        assert e.message_id == events[0].message_id == complete.message_id
        idx = e.content_block_index
        if idx not in seen_indexes:
            assert idx == len(seen_indexes) or any(
                getattr(content[i], "type", None) == "redacted_thinking"
                for i in range(len(seen_indexes), idx)
            ), f"index {idx} allocated out of order"
            seen_indexes.append(idx)
        if isinstance(e, TextDelta):
            assert e.text
            texts[idx] = texts.get(idx, "") + e.text
        elif isinstance(e, ThinkingDelta):
            thinking[idx] = thinking.get(idx, "") + e.text
        elif isinstance(e, ToolUseStart):
            assert e.tool_use_id.startswith("tu_")
            assert idx not in tools
            tools[idx] = {"id": e.tool_use_id, "name": e.tool_name, "json": "", "ended": False}
        elif isinstance(e, ToolUseInputDelta):
            assert not tools[idx]["ended"] and tools[idx]["id"] == e.tool_use_id
            tools[idx]["json"] += e.partial_json
        elif isinstance(e, ToolUseEnd):
            assert not tools[idx]["ended"]
            tools[idx]["ended"] = True
            tools[idx]["final"] = e.final_input
            tools[idx]["dropped"] = e.dropped
    for idx, text in texts.items():
        assert content[idx].type == "text" and content[idx].text == text
    for idx, text in thinking.items():
        assert content[idx].type == "thinking" and content[idx].thinking == text
    for idx, tool in tools.items():
        assert tool["ended"], "tool call never closed"
        if tool["dropped"]:  # cut off by the output limit: the last block, gone from the message
            assert complete.stop_reason == "max_tokens" and idx == len(content)
            assert tool["final"] == {}
            continue
        block = content[idx]
        assert block.type == "tool_use" and block.id == tool["id"] and block.name == tool["name"]
        assert block.input == tool["final"]
        if complete.stop_reason not in ("cancelled", "error") and tool["json"]:
            try:
                parsed = json.loads(tool["json"])
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                assert parsed == tool["final"]
            else:  # why, for the schema check to tell the model
                assert list(tool["final"]) == [UNPARSED_ARGUMENTS]
    return complete
