"""The deterministic scripted model `local:scripted`.

It lets the daemon, the demo and the tests run a whole agent loop with no key and no network.
The planner is pure and shared with the fake provider server, so "what the offline model says"
and "what the fake server answers by default" can never drift apart.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, ClassVar, Literal, Protocol

from metis.core.canonical.content import (
    ContentBlock,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from metis.core.canonical.ids import new_tool_use_id
from metis.core.canonical.tools import ToolDefinition
from metis.core.canonical.usage import TokenUsage
from metis.core.models.types import ProviderConfig
from metis.core.providers.base import (
    LLMRequest,
    LLMResult,
    MessageComplete,
    MessageStart,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
)
from metis.core.providers.errors import ProviderError
from metis.core.providers.streaming import CancelGuard, CancelRequested

NEUTRAL_STRING = "conformance"
# The value of every required string `path`: what the demo's file tools read and write in the
# user's workspace, named so that a stray file says where it came from.
DEMO_FILE = "metis-demo.txt"
THINKING_SIGNATURE = "scripted"
SNIPPET_LIMIT = 200
THINKING_QUOTE_LIMIT = 80
_WS_RE = re.compile(r"\s+")


# ---------------------------------------------------------------------------------------------
# The planner (pure)
# ---------------------------------------------------------------------------------------------


class ViewMessage(Protocol):
    """A message as the planner reads it: a stored `Message` or the fake server's `SimpleMessage`."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> Sequence[Any]: ...


@dataclass(frozen=True, slots=True)
class SimpleMessage:
    """A role + canonical blocks pair, for callers (the fake server) with no stored `Message`."""

    role: str
    content: Sequence[Any]


@dataclass(frozen=True, slots=True)
class ScriptedView:
    """What the planner reads. `all_tools_both` makes every tool count as builtin *and*
    application: the wire cannot tell them apart, so the fake server sets it."""

    messages: Sequence[ViewMessage]
    tools: Sequence[ToolDefinition] = ()
    all_tools_both: bool = False


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One tool call the planner decided on."""

    name: str
    input: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ScriptedPlan:
    """What the scripted model answers to a request: text, optional thinking, tool calls and the
    stop reason."""

    text: str
    thinking: str | None = None
    thinking_signature: str | None = None
    tool_calls: tuple[PlannedCall, ...] = ()
    stop_reason: Literal["end_turn", "tool_use"] = "end_turn"
    steps: tuple[str, ...] = field(default_factory=tuple)  # which planner rule fired, for tests


def neutral_value(schema: Any) -> Any:
    """The planner's stand-in value for one JSON schema."""
    if not isinstance(schema, dict):
        return NEUTRAL_STRING
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "string":
        return NEUTRAL_STRING
    if kind in ("integer", "number"):
        minimum = schema.get("minimum")
        value: int | float = 0
        if isinstance(minimum, int | float) and not isinstance(minimum, bool) and minimum > 0:
            value = math.ceil(minimum) if kind == "integer" else minimum
        return value
    if kind == "boolean":
        return False
    if kind == "array":
        count = schema.get("minItems", 0)
        count = count if isinstance(count, int) and count > 0 else 0
        return [neutral_value(schema.get("items", {})) for _ in range(count)]
    if kind == "object":
        return fill_object(schema)
    if kind == "null":
        return None
    return NEUTRAL_STRING


def fill_object(schema: dict[str, Any]) -> dict[str, Any]:
    """Required properties only, each filled with its neutral value, recursively."""
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    if not isinstance(required, list):
        return {}
    return {
        name: _demo_value(name, properties.get(name, {}))
        for name in required
        if isinstance(name, str)
    }


def _demo_value(name: str, schema: Any) -> Any:
    value = neutral_value(schema)
    return DEMO_FILE if name == "path" and value == NEUTRAL_STRING else value


def _snippet(block: ToolResultBlock) -> str:
    parts = [
        inner.text if isinstance(inner, TextBlock) else "[image]"
        for inner in block.content
        if isinstance(inner, TextBlock | ImageBlock)
    ]
    text = _WS_RE.sub(" ", " ".join(parts)).strip()
    if len(text) > SNIPPET_LIMIT:
        text = text[:SNIPPET_LIMIT] + "…"
    return text


def _results_text(messages: Sequence[ViewMessage]) -> str:
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    names: dict[str, str] = {}
    for m in messages:
        if m.role == "assistant":
            for b in m.content:
                if isinstance(b, ToolUseBlock):
                    names[b.id] = b.name
    lines = ["Tool results received:"]
    for m in messages[last_assistant + 1 :]:
        if m.role != "tool":
            continue
        for b in m.content:
            if isinstance(b, ToolResultBlock):
                name = names.get(b.tool_use_id, "unknown_tool")
                status = "error" if b.is_error else "ok"
                lines.append(f"- {name} ({status}): {_snippet(b)}")
    return "\n".join(lines)


def _echo(text: str, images: int) -> str:
    echo = f'You said: "{text}"'
    if images >= 1:
        echo += f" (with {images} image(s))"
    return echo


def _pick_tools(step: str, view: ScriptedView) -> list[ToolDefinition]:
    tools = list(view.tools)
    if step == "all":
        return tools
    builtin = [t for t in tools if view.all_tools_both or t.origin == "builtin"]
    application = [t for t in tools if view.all_tools_both or t.origin == "application"]
    if step == "server":
        return builtin[:1]
    return (application or builtin)[:1]


def plan_scripted_reply(view: ScriptedView) -> ScriptedPlan:
    """The scripted model's answer to a history (the first applicable step wins)."""
    messages = view.messages
    if messages and messages[-1].role == "tool":
        return ScriptedPlan(text=_results_text(messages), steps=("results",))
    last_user = next((m for m in reversed(messages) if m.role == "user"), None)
    blocks = list(last_user.content) if last_user is not None else []
    text = "\n".join(b.text for b in blocks if isinstance(b, TextBlock))
    images = sum(1 for b in blocks if isinstance(b, ImageBlock))
    lowered = text.casefold()
    echo = _echo(text, images)
    step = None
    if "use all tools" in lowered:
        step = "all"
    elif "use server tool" in lowered:
        step = "server"
    elif "use tool" in lowered:
        step = "client"
    if step is not None:
        chosen = _pick_tools(step, view)
        if not chosen:
            return ScriptedPlan(text=echo, steps=(f"tool:{step}", "no_tool"))
        calls = tuple(PlannedCall(t.name, fill_object(t.input_schema)) for t in chosen)
        return ScriptedPlan(
            text=f"Calling {', '.join(c.name for c in calls)}.",
            tool_calls=calls,
            stop_reason="tool_use",
            steps=(f"tool:{step}",),
        )
    if "think" in lowered:
        thinking = f'The user asked: "{text[:THINKING_QUOTE_LIMIT]}". I will answer by quoting it.'
        return ScriptedPlan(
            text=echo,
            thinking=thinking,
            thinking_signature=THINKING_SIGNATURE,
            steps=("think",),
        )
    return ScriptedPlan(text=echo, steps=("echo",))


# ---------------------------------------------------------------------------------------------
# Whitespace usage
# ---------------------------------------------------------------------------------------------


def tool_input_json(value: dict[str, Any]) -> str:
    """A tool input as compact sorted JSON, the same bytes for the scripted model and the fake
    server."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def whitespace_tokens(parts: Sequence[str]) -> int:
    """The scripted model's token count: whitespace-separated words, deterministic and cheap."""
    return len("\n".join(parts).split())


def input_token_parts(
    system: str,
    volatile: str | None,
    messages: Sequence[ViewMessage],
    tools: Sequence[ToolDefinition],
) -> list[str]:
    """The texts of a request that count as input tokens (system, history, tools), shared with the
    fake server so both report the same usage."""
    parts: list[str] = [system, volatile or ""]
    for m in messages:
        for b in m.content:
            if isinstance(b, TextBlock):
                parts.append(b.text)
            elif isinstance(b, ThinkingBlock):
                parts.append(b.thinking)
            elif isinstance(b, ToolUseBlock):
                parts.append(b.name)
                parts.append(tool_input_json(b.input))
            elif isinstance(b, ToolResultBlock):
                parts.extend(i.text for i in b.content if isinstance(i, TextBlock))
    for t in tools:
        parts.extend((t.name, t.description, tool_input_json(t.input_schema)))
    return parts


def output_token_parts(plan: ScriptedPlan) -> list[str]:
    """The texts of a plan that count as output tokens."""
    parts: list[str] = []
    if plan.thinking:
        parts.append(plan.thinking)
    parts.append(plan.text)
    for c in plan.tool_calls:
        parts.extend((c.name, tool_input_json(c.input)))
    return parts


def scripted_usage(req: LLMRequest, plan: ScriptedPlan) -> TokenUsage:
    """The usage the scripted model reports for a request and its plan."""
    return TokenUsage(
        input_tokens=whitespace_tokens(
            input_token_parts(req.system, req.system_volatile, req.messages, req.tools)
        ),
        output_tokens=whitespace_tokens(output_token_parts(plan)),
    )


def chunks(text: str, size: int) -> list[str]:
    """`text` cut into pieces of `size` characters, the deltas a stream is made of."""
    return [text[i : i + size] for i in range(0, len(text), size)] if text else []


# ---------------------------------------------------------------------------------------------
# The adapter
# ---------------------------------------------------------------------------------------------


def view_of(req: LLMRequest) -> ScriptedView:
    """What the planner reads of a request."""
    return ScriptedView(messages=list(req.messages), tools=list(req.tools))


class ScriptedAdapter:
    """Streams the planner's answer with the real adapter event contract; never fails."""

    kind: ClassVar[Literal["scripted"]] = "scripted"

    def __init__(self, provider: ProviderConfig | None = None) -> None:
        options = dict(provider.options) if provider is not None else {}
        self.provider_name = provider.name if provider is not None else "local"
        self.chunk_chars = max(1, int(options.get("chunk_chars", 16)))
        self.delta_delay_s = max(0.0, float(options.get("delta_delay_ms", 0))) / 1000.0

    def stream(self, req: LLMRequest) -> AsyncIterator[StreamEvent]:
        return self._stream(req)

    def _plan_events(self, req: LLMRequest, plan: ScriptedPlan) -> list[tuple[Any, ...]]:
        """The reply as (kind, ...) steps; built up front so cancel can cut it anywhere."""
        steps: list[tuple[Any, ...]] = []
        if plan.thinking:
            pieces = chunks(plan.thinking, self.chunk_chars)
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                steps.append(("thinking", piece, plan.thinking_signature if last else None))
        steps.extend(("text", piece) for piece in chunks(plan.text, self.chunk_chars))
        for call in plan.tool_calls:
            steps.append(("tool_start", call.name))
            steps.extend(
                ("tool_delta", piece)
                for piece in chunks(tool_input_json(call.input), self.chunk_chars)
            )
            steps.append(("tool_end", call.input))
        return steps

    async def _stream(self, req: LLMRequest) -> AsyncIterator[StreamEvent]:
        t0 = perf_counter()
        guard = CancelGuard(req.cancel)
        await req.hooks.attempt_started(1)
        if req.cancel.is_set():
            err = ProviderError(
                "cancelled", "request cancelled", provider=self.provider_name, model=req.model
            )
            await req.hooks.attempt_failed(1, err, False)
            raise err
        plan = plan_scripted_reply(view_of(req))
        mid = req.message_id
        content: list[ContentBlock] = []
        thinking_parts: list[str] = []
        text_parts: list[str] = []
        open_call: tuple[int, str, str, list[str]] | None = None
        emitted: list[str] = []

        def flush_blocks() -> None:
            nonlocal thinking_parts, text_parts
            if thinking_parts:
                content.append(
                    ThinkingBlock(
                        thinking="".join(thinking_parts), signature=plan.thinking_signature
                    )
                )
                thinking_parts = []
            if text_parts:
                content.append(TextBlock(text="".join(text_parts)))
                text_parts = []

        cancelled = False
        try:
            yield MessageStart(message_id=mid, model=req.model)
            for step in self._plan_events(req, plan):
                if req.cancel.is_set():
                    cancelled = True
                    break
                if self.delta_delay_s:
                    try:
                        await guard.run(asyncio.sleep(self.delta_delay_s))
                    except CancelRequested:
                        cancelled = True
                        break
                else:
                    # Yield to the event loop as a provider stream does between reads, or a
                    # long reply would reach every live client's queue in one step (overflow).
                    await asyncio.sleep(0)
                kind = step[0]
                if kind == "thinking":
                    index = len(content)
                    thinking_parts.append(step[1])
                    emitted.append(step[1])
                    yield ThinkingDelta(
                        message_id=mid, content_block_index=index, text=step[1], signature=step[2]
                    )
                elif kind == "text":
                    if thinking_parts:
                        flush_blocks()
                    index = len(content)
                    text_parts.append(step[1])
                    emitted.append(step[1])
                    yield TextDelta(message_id=mid, content_block_index=index, text=step[1])
                elif kind == "tool_start":
                    flush_blocks()
                    tool_use_id = new_tool_use_id()
                    req.tool_ids.record(tool_use_id, None)
                    open_call = (len(content), tool_use_id, step[1], [])
                    emitted.append(step[1])
                    yield ToolUseStart(
                        message_id=mid,
                        content_block_index=open_call[0],
                        tool_use_id=tool_use_id,
                        tool_name=step[1],
                    )
                elif kind == "tool_delta" and open_call is not None:
                    open_call[3].append(step[1])
                    emitted.append(step[1])
                    yield ToolUseInputDelta(
                        message_id=mid,
                        content_block_index=open_call[0],
                        tool_use_id=open_call[1],
                        partial_json=step[1],
                    )
                elif kind == "tool_end" and open_call is not None:
                    index, tool_use_id, name, _ = open_call
                    content.append(ToolUseBlock(id=tool_use_id, name=name, input=step[1]))
                    open_call = None
                    yield ToolUseEnd(
                        message_id=mid,
                        content_block_index=index,
                        tool_use_id=tool_use_id,
                        final_input=step[1],
                    )
            flush_blocks()
            if req.cancel.is_set():
                cancelled = True
            if open_call is not None:
                index, tool_use_id, name, parts = open_call
                value = _parse_partial("".join(parts))
                content.append(ToolUseBlock(id=tool_use_id, name=name, input=value))
                yield ToolUseEnd(
                    message_id=mid,
                    content_block_index=index,
                    tool_use_id=tool_use_id,
                    final_input=value,
                )
            usage = scripted_usage(req, plan)
            if cancelled:
                usage = usage.model_copy(update={"output_tokens": whitespace_tokens(emitted)})
            latency = int((perf_counter() - t0) * 1000)
            yield MessageComplete(
                message_id=mid,
                stop_reason="cancelled" if cancelled else plan.stop_reason,
                final_content=content,
                usage=usage,
                latency_ms=latency,
                first_token_ms=0,
                attempts=1,
                provider_stop_reason=None,
            )
        finally:
            guard.close()

    async def complete(self, req: LLMRequest) -> LLMResult:
        await req.hooks.attempt_started(1)
        if req.cancel.is_set():
            err = ProviderError(
                "cancelled", "request cancelled", provider=self.provider_name, model=req.model
            )
            await req.hooks.attempt_failed(1, err, False)
            raise err
        plan = plan_scripted_reply(view_of(req))
        content: list[ContentBlock] = []
        if plan.thinking:
            content.append(ThinkingBlock(thinking=plan.thinking, signature=plan.thinking_signature))
        if plan.text:
            content.append(TextBlock(text=plan.text))
        for call in plan.tool_calls:
            tool_use_id = new_tool_use_id()
            req.tool_ids.record(tool_use_id, None)
            content.append(ToolUseBlock(id=tool_use_id, name=call.name, input=call.input))
        return LLMResult(
            final_content=content,
            stop_reason=plan.stop_reason,
            usage=scripted_usage(req, plan),
            latency_ms=0,
            first_token_ms=0,
            attempts=1,
        )

    async def aclose(self) -> None:
        return None


def _parse_partial(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
