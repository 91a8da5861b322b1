"""Wire rendering of the fake provider: scripted replies, request decoding, SSE frames and bodies.

Kept apart from the server (`fake_provider.py`) so the byte-level shapes both SDKs must parse are
readable in one place, independent of aiohttp plumbing.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_json

from metis.core.canonical.content import (
    Base64Source,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UrlSource,
)
from metis.core.canonical.tools import ToolDefinition
from metis.core.providers.scripted import (
    ScriptedView,
    SimpleMessage,
    chunks,
    input_token_parts,
    plan_scripted_reply,
    tool_input_json,
    whitespace_tokens,
)

Api = Literal["anthropic", "openai"]
Failure = Literal["drop", "malformed", "error_event", "hang"]
FAKE_SIGNATURE = "fake-signature"
OPENAI_TOOL_ERROR_PREFIX = "[tool error] "


# ---------------------------------------------------------------------------------------------
# Script model
# ---------------------------------------------------------------------------------------------


class FakeToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class FakeUsage(BaseModel):
    """Canonical bucket meanings; a missing count takes the default."""

    model_config = ConfigDict(extra="forbid")

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class FakeReply(BaseModel):
    """One scripted answer. JSON-serialisable so out-of-process users can POST it.

    Beyond the plain reply fields, a few extra knobs reproduce compatible-server quirks and odd wire
    shapes: `refusal`, `redacted_thinking`, `name_late`, `arguments_as_object`, and the escape
    hatches `raw_sse` (exact frames) / `raw_json` (exact JSON body).
    """

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    thinking: str | None = None
    tool_calls: list[FakeToolCall] = Field(default_factory=list)
    stop_reason: str | None = None
    usage: FakeUsage | None = None
    status: int = 200
    error_type: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    retry_after: float | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    chunk_chars: int = Field(default=8, ge=1)
    delay_ms: float = 0
    first_byte_delay_ms: float = 0
    # The whole event stream in one socket write, as a fast provider or proxy may deliver it:
    # the client then parses every delta from one buffer without waiting on the network.
    single_write: bool = False
    fail_after_events: int | None = None
    failure: Failure | None = None
    same_index_parallel: bool = False
    omit_tool_index: bool = False
    omit_usage: bool = False
    match_model: str | None = None
    repeat: int = Field(default=1, ge=1)
    # extensions
    refusal: str | None = None
    redacted_thinking: str | None = None
    name_late: bool = False
    arguments_as_object: bool = False
    raw_sse: list[str] | None = None
    raw_json: dict[str, Any] | None = None

    @classmethod
    def say(cls, text: str, **kw: Any) -> FakeReply:
        return cls(text=text, **kw)

    @classmethod
    def call(cls, name: str, input: dict[str, Any] | None = None, **kw: Any) -> FakeReply:
        calls = [FakeToolCall(name=name, input=input or {})]
        calls.extend(FakeToolCall.model_validate(c) for c in kw.pop("more_calls", []))
        return cls(tool_calls=calls, **kw)

    @classmethod
    def fail(
        cls,
        status: int,
        error_type: str | None = None,
        *,
        code: str | None = None,
        message: str | None = None,
        retry_after: float | None = None,
        **kw: Any,
    ) -> FakeReply:
        return cls(
            status=status,
            error_type=error_type,
            error_code=code,
            error_message=message,
            retry_after=retry_after,
            **kw,
        )

    @classmethod
    def drop_after(cls, n: int, **kw: Any) -> FakeReply:
        return cls(fail_after_events=n, failure="drop", **kw)

    @classmethod
    def malformed_after(cls, n: int, **kw: Any) -> FakeReply:
        return cls(fail_after_events=n, failure="malformed", **kw)

    @classmethod
    def error_event_after(cls, n: int, **kw: Any) -> FakeReply:
        return cls(fail_after_events=n, failure="error_event", **kw)

    @classmethod
    def hang_after(cls, n: int, **kw: Any) -> FakeReply:
        return cls(fail_after_events=n, failure="hang", **kw)

    @classmethod
    def slow(cls, ms: float, **kw: Any) -> FakeReply:
        return cls(delay_ms=ms, **kw)


# ---------------------------------------------------------------------------------------------
# Wire request → planner view
# ---------------------------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _image_from_url(url: str) -> ImageBlock:
    if url.startswith("data:") and ";base64," in url:
        media, _, data = url[5:].partition(";base64,")
        return ImageBlock(source=Base64Source(media_type=media, data=data))
    return ImageBlock(source=UrlSource(url=url))


def _anthropic_block(raw: dict[str, Any]) -> Any:
    kind = raw.get("type")
    if kind == "text":
        return TextBlock(text=str(raw.get("text", "")))
    if kind == "image":
        source = raw.get("source") or {}
        if source.get("type") == "url":
            return ImageBlock(source=UrlSource(url=str(source.get("url", ""))))
        return ImageBlock(
            source=Base64Source(
                media_type=str(source.get("media_type", "")), data=str(source.get("data", ""))
            )
        )
    if kind == "thinking":
        return ThinkingBlock(thinking=str(raw.get("thinking", "")), signature=raw.get("signature"))
    if kind == "redacted_thinking":
        return RedactedThinkingBlock(data=str(raw.get("data", "")))
    if kind == "tool_use":
        value = raw.get("input")
        return ToolUseBlock(
            id=str(raw.get("id", "")),
            name=str(raw.get("name", "")),
            input=value if isinstance(value, dict) else {},
        )
    if kind == "tool_result":
        content = raw.get("content")
        inner: list[Any] = []
        if isinstance(content, str):
            inner.append(TextBlock(text=content))
        elif isinstance(content, list):
            for part in content:
                block = _anthropic_block(part) if isinstance(part, dict) else None
                if isinstance(block, TextBlock | ImageBlock):
                    inner.append(block)
        return ToolResultBlock(
            tool_use_id=str(raw.get("tool_use_id", "")),
            content=inner,
            is_error=bool(raw.get("is_error", False)),
        )
    return None


def anthropic_view(body: dict[str, Any]) -> tuple[str, list[SimpleMessage], list[ToolDefinition]]:
    """Decode an Anthropic request into (system text, canonical-ish messages, tools)."""
    system = _text_of(body.get("system"))
    messages: list[SimpleMessage] = []
    for raw in body.get("messages") or []:
        role = raw.get("role")
        content = raw.get("content")
        blocks = (
            [TextBlock(text=content)]
            if isinstance(content, str)
            else [b for b in (_anthropic_block(c) for c in content or []) if b is not None]
        )
        if role == "assistant":
            messages.append(SimpleMessage("assistant", blocks))
            continue
        results = [b for b in blocks if isinstance(b, ToolResultBlock)]
        rest = [b for b in blocks if not isinstance(b, ToolResultBlock)]
        messages.extend(SimpleMessage("tool", [r]) for r in results)
        if rest:
            messages.append(SimpleMessage("user", rest))
    tools = [
        ToolDefinition(
            name=str(t.get("name", "")),
            description=str(t.get("description", "") or ""),
            input_schema=t.get("input_schema") or {},
        )
        for t in body.get("tools") or []
        if isinstance(t, dict) and t.get("name")
    ]
    return system, messages, tools


def _openai_parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [TextBlock(text=content)]
    blocks: list[Any] = []
    for part in content or []:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            blocks.append(TextBlock(text=str(part.get("text", ""))))
        elif part.get("type") == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            blocks.append(_image_from_url(str(url)))
    return blocks


def openai_view(body: dict[str, Any]) -> tuple[str, list[SimpleMessage], list[ToolDefinition]]:
    """Decode an OpenAI request into (system text, canonical-ish messages, tools)."""
    system_parts: list[str] = []
    messages: list[SimpleMessage] = []
    for raw in body.get("messages") or []:
        role = raw.get("role")
        if role in ("system", "developer"):
            system_parts.append(_text_of(raw.get("content")))
        elif role == "user":
            messages.append(SimpleMessage("user", _openai_parts(raw.get("content"))))
        elif role == "assistant":
            blocks = _openai_parts(raw.get("content")) if raw.get("content") else []
            for call in raw.get("tool_calls") or []:
                function = call.get("function") or {}
                try:
                    value = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    value = {}
                blocks.append(
                    ToolUseBlock(
                        id=str(call.get("id", "")),
                        name=str(function.get("name", "")),
                        input=value if isinstance(value, dict) else {},
                    )
                )
            messages.append(SimpleMessage("assistant", blocks))
        elif role == "tool":
            text = _text_of(raw.get("content"))
            is_error = text.startswith(OPENAI_TOOL_ERROR_PREFIX)
            if is_error:
                text = text[len(OPENAI_TOOL_ERROR_PREFIX) :]
            result = ToolResultBlock(
                tool_use_id=str(raw.get("tool_call_id", "")),
                content=[TextBlock(text=text)],
                is_error=is_error,
            )
            messages.append(SimpleMessage("tool", [result]))
    tools = []
    for t in body.get("tools") or []:
        function = t.get("function") if isinstance(t, dict) else None
        if isinstance(function, dict) and function.get("name"):
            tools.append(
                ToolDefinition(
                    name=str(function["name"]),
                    description=str(function.get("description", "") or ""),
                    input_schema=function.get("parameters") or {},
                )
            )
    return "\n\n".join(p for p in system_parts if p), messages, tools


# ---------------------------------------------------------------------------------------------
# Reply content
# ---------------------------------------------------------------------------------------------


@dataclass
class _Content:
    text: str
    thinking: str | None
    signature: str
    redacted: str | None
    refusal: str | None
    calls: list[tuple[str, dict[str, Any]]]
    planned_tool_use: bool
    input_tokens: int
    output_tokens: int
    cache_read: int
    cache_write: int


def resolve_content(api: Api, body: dict[str, Any], reply: FakeReply) -> _Content:
    """What the reply says and its usage. The request is only read (at a cost that grows with
    the history) when the reply leaves something to derive from it: the scripted text, or the
    input token count."""
    view = functools.cache(lambda: (anthropic_view if api == "anthropic" else openai_view)(body))
    text = reply.text
    thinking = reply.thinking
    signature = FAKE_SIGNATURE
    calls = [(c.name, c.input) for c in reply.tool_calls]
    if text is None and not calls and reply.refusal is None:
        _system, messages, tools = view()
        plan = plan_scripted_reply(ScriptedView(messages, tools, all_tools_both=True))
        text = plan.text
        calls = [(c.name, c.input) for c in plan.tool_calls]
        if thinking is None and plan.thinking:
            thinking = plan.thinking
            signature = plan.thinking_signature or FAKE_SIGNATURE
    text = text or ""
    out_parts = [p for p in (thinking, text, reply.refusal) if p]
    for name, value in calls:
        out_parts.extend((name, tool_input_json(value)))
    usage = reply.usage or FakeUsage()
    input_tokens = usage.input_tokens
    if input_tokens is None:
        system, messages, tools = view()
        input_tokens = whitespace_tokens(input_token_parts(system, None, messages, tools))
    output_tokens = usage.output_tokens
    if output_tokens is None:
        output_tokens = whitespace_tokens(out_parts)
    return _Content(
        text=text,
        thinking=thinking,
        signature=signature,
        redacted=reply.redacted_thinking,
        refusal=reply.refusal,
        calls=calls,
        planned_tool_use=bool(calls),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read=usage.cache_read_tokens,
        cache_write=usage.cache_write_tokens,
    )


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# Anthropic wire
# ---------------------------------------------------------------------------------------------

_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def anthropic_error_body(status: int, etype: str | None, message: str | None) -> dict[str, Any]:
    default = _ANTHROPIC_ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return {
        "type": "error",
        "error": {"type": etype or default, "message": message or f"fake {status} error"},
    }


def _anthropic_stop(reply: FakeReply, content: _Content) -> str:
    if reply.stop_reason:
        return reply.stop_reason
    if content.refusal is not None:
        return "refusal"
    return "tool_use" if content.calls else "end_turn"


def _anthropic_usage(content: _Content, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": content.input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": content.cache_read,
        "cache_creation_input_tokens": content.cache_write,
    }


def anthropic_message(n: int, model: str, reply: FakeReply, content: _Content) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    if content.thinking:
        blocks.append(
            {"type": "thinking", "thinking": content.thinking, "signature": content.signature}
        )
    if content.redacted:
        blocks.append({"type": "redacted_thinking", "data": content.redacted})
    text = content.text + (content.refusal or "")
    if text:
        blocks.append({"type": "text", "text": text})
    for k, (name, value) in enumerate(content.calls):
        blocks.append(
            {"type": "tool_use", "id": f"toolu_fake_{n}_{k}", "name": name, "input": value}
        )
    return {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": _anthropic_stop(reply, content),
        "stop_sequence": None,
        "usage": _anthropic_usage(content, content.output_tokens),
    }


def sse_frame(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {to_json(data).decode()}\n\n"


def anthropic_frames(n: int, model: str, reply: FakeReply, content: _Content) -> list[str]:
    size = reply.chunk_chars
    start_message: dict[str, Any] = {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _anthropic_usage(content, 1),
    }
    frames = [
        sse_frame("message_start", {"type": "message_start", "message": start_message}),
        sse_frame("ping", {"type": "ping"}),
    ]
    index = 0

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        nonlocal index
        frames.append(
            sse_frame(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        for delta in deltas:
            frames.append(
                sse_frame(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        frames.append(
            sse_frame("content_block_stop", {"type": "content_block_stop", "index": index})
        )
        index += 1

    if content.thinking:
        deltas = [{"type": "thinking_delta", "thinking": c} for c in chunks(content.thinking, size)]
        deltas.append({"type": "signature_delta", "signature": content.signature})
        block({"type": "thinking", "thinking": "", "signature": ""}, deltas)
    if content.redacted:
        block({"type": "redacted_thinking", "data": content.redacted}, [])
    text = content.text + (content.refusal or "")
    if text:
        block(
            {"type": "text", "text": ""},
            [{"type": "text_delta", "text": c} for c in chunks(text, size)],
        )
    for k, (name, value) in enumerate(content.calls):
        block(
            {"type": "tool_use", "id": f"toolu_fake_{n}_{k}", "name": name, "input": {}},
            [{"type": "input_json_delta", "partial_json": c} for c in chunks(dumps(value), size)],
        )
    frames.append(
        sse_frame(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _anthropic_stop(reply, content), "stop_sequence": None},
                "usage": {"output_tokens": content.output_tokens},
            },
        )
    )
    frames.append(sse_frame("message_stop", {"type": "message_stop"}))
    return frames


# ---------------------------------------------------------------------------------------------
# OpenAI wire
# ---------------------------------------------------------------------------------------------

_OPENAI_ERROR_DEFAULTS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def openai_error_body(
    status: int, etype: str | None, code: str | None, message: str | None
) -> dict[str, Any]:
    default_type, default_code = _OPENAI_ERROR_DEFAULTS.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None)
    )
    return {
        "error": {
            "message": message or f"fake {status} error",
            "type": etype or default_type,
            "param": None,
            "code": code if code is not None else default_code,
        }
    }


def _openai_finish(reply: FakeReply, content: _Content) -> str:
    if reply.stop_reason:
        return reply.stop_reason
    return "tool_calls" if content.calls else "stop"


def _openai_usage(content: _Content) -> dict[str, Any]:
    prompt = content.input_tokens + content.cache_read
    return {
        "prompt_tokens": prompt,
        "completion_tokens": content.output_tokens,
        "total_tokens": prompt + content.output_tokens,
        "prompt_tokens_details": {"cached_tokens": content.cache_read},
    }


def openai_completion(n: int, model: str, reply: FakeReply, content: _Content) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content.text or None,
        "refusal": content.refusal,
    }
    if content.thinking:
        message["reasoning_content"] = content.thinking
    if content.calls:
        message["tool_calls"] = [
            {
                "id": f"call_fake_{n}_{k}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": value if reply.arguments_as_object else dumps(value),
                },
            }
            for k, (name, value) in enumerate(content.calls)
        ]
    body: dict[str, Any] = {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _openai_finish(reply, content),
                "logprobs": None,
            }
        ],
    }
    if not reply.omit_usage:
        body["usage"] = _openai_usage(content)
    return body


def openai_frames(
    n: int, model: str, reply: FakeReply, content: _Content, include_usage: bool
) -> list[str]:
    size = reply.chunk_chars
    base = {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        data = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {dumps(data)}\n\n"

    frames = [chunk({"role": "assistant", "content": ""})]
    if content.thinking:
        frames.extend(chunk({"reasoning_content": c}) for c in chunks(content.thinking, size))
    frames.extend(chunk({"content": c}) for c in chunks(content.text, size))
    if content.refusal:
        frames.extend(chunk({"refusal": c}) for c in chunks(content.refusal, size))
    for k, (name, value) in enumerate(content.calls):
        index = 0 if reply.same_index_parallel else k
        ident: dict[str, Any] = {} if reply.omit_tool_index else {"index": index}
        head: dict[str, Any] = {**ident, "id": f"call_fake_{n}_{k}", "type": "function"}
        if reply.arguments_as_object:
            head["function"] = {"name": name, "arguments": value}
            frames.append(chunk({"tool_calls": [head]}))
            continue
        pieces = chunks(dumps(value), size)
        if reply.name_late:
            head["function"] = {"arguments": pieces.pop(0) if pieces else ""}
            frames.append(chunk({"tool_calls": [head]}))
            frames.append(chunk({"tool_calls": [{**ident, "function": {"name": name}}]}))
        else:
            head["function"] = {"name": name, "arguments": ""}
            frames.append(chunk({"tool_calls": [head]}))
        frames.extend(
            chunk({"tool_calls": [{**ident, "function": {"arguments": p}}]}) for p in pieces
        )
    frames.append(chunk({}, _openai_finish(reply, content)))
    if include_usage and not reply.omit_usage:
        frames.append(
            f"data: {dumps({**base, 'choices': [], 'usage': _openai_usage(content)})}\n\n"
        )
    frames.append("data: [DONE]\n\n")
    return frames
