"""Anthropic Messages adapter over the official `anthropic` SDK.

Only translation lives here: canonical history → request params, SDK stream events → calls on
the shared `ContentBuilder`, SDK exceptions → the closed taxonomy. Retries, cancellation and
event ordering are the shared driver's (`streaming.py`).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar, Literal

import anthropic
from pydantic_core import from_json

from metis.core.canonical.content import (
    ContentBlock,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UrlSource,
)
from metis.core.canonical.ids import new_tool_use_id
from metis.core.canonical.messages import Message
from metis.core.canonical.tools import ToolDefinition
from metis.core.canonical.usage import TokenUsage
from metis.core.models.types import ProviderConfig
from metis.core.providers.base import LLMRequest, LLMResult, StopReason, StreamEvent
from metis.core.providers.connection import Endpoint, network_error
from metis.core.providers.errors import (
    ErrorClass,
    ProviderError,
    StreamErrorEvent,
    error_fields,
    headers_of,
    internal_error,
    is_malformed_error,
    is_transport_error,
    parse_retry_after,
    safe_text,
    status_class_common,
)
from metis.core.providers.history import (
    IMAGE_OMITTED_TEXT,
    anthropic_wire_id,
    estimate_request_tokens,
    normalize_history,
)
from metis.core.providers.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from metis.core.providers.sse import ServerEvent, SseBody
from metis.core.providers.streaming import (
    ContentBuilder,
    TextSlot,
    ThinkingSlot,
    ToolSlot,
    drive_complete,
    drive_stream,
    estimate_output_tokens,
    parse_tool_input,
)
from metis.core.providers.transport import post_event_stream, post_json, sdk_client_options
from metis.core.providers.wire_body import HistoryEncoder, ToolsEncoder, encode, json_body

log = logging.getLogger(__name__)

MESSAGES_PATH = "/v1/messages"
EPHEMERAL = {"type": "ephemeral"}
_CONTEXT_RE = re.compile(r"(?i)prompt is too long|context (window|length)|too many (input )?tokens")
_CONTENT_FILTER_CODES = frozenset({"content_filter", "content_policy_violation"})
_ETYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "timeout_error": 408,
    "api_error": 500,
    "overloaded_error": 529,
}
# message_delta usage fields that, when present, replace what message_start reported
_DELTA_USAGE_FIELDS = (
    ("output_tokens", "output_tokens"),
    ("input_tokens", "input_tokens"),
    ("cache_read_input_tokens", "cache_read"),
    ("cache_creation_input_tokens", "cache_write"),
)
_STOP_MAP: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "tool_use": "tool_use",
    "model_context_window_exceeded": "max_tokens",
    "refusal": "refusal",
}


def map_stop_reason(raw: str | None) -> StopReason:
    """The canonical stop reason of an Anthropic `stop_reason`; an unknown value is logged and read
    as `end_turn` rather than failing a finished call."""
    stop = _STOP_MAP.get(raw or "")
    if stop is None:
        log.warning("anthropic stop reason %r mapped to end_turn", raw)
        return "end_turn"
    return stop


# ---------------------------------------------------------------------------------------------
# Request mapping
# ---------------------------------------------------------------------------------------------


def _image(block: ImageBlock, supports_images: bool) -> dict[str, Any]:
    if not supports_images:
        return {"type": "text", "text": IMAGE_OMITTED_TEXT}
    source = block.source
    if isinstance(source, UrlSource):
        return {"type": "image", "source": {"type": "url", "url": source.url}}
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": source.media_type, "data": source.data},
    }


def _user_blocks(blocks: list[Any], supports_images: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, TextBlock):
            out.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageBlock):
            out.append(_image(b, supports_images))
    return out


def _result_block(block: ToolResultBlock, supports_images: bool) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": anthropic_wire_id(block.tool_use_id),
    }
    content = [
        {"type": "text", "text": inner.text}
        if isinstance(inner, TextBlock)
        else _image(inner, supports_images)
        for inner in block.content
        if not (isinstance(inner, TextBlock) and not inner.text)
    ]
    if content:
        wire["content"] = content
    if block.is_error:
        wire["is_error"] = True
    return wire


def _assistant_blocks(blocks: list[Any], *, keep_thinking: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, TextBlock):
            out.append({"type": "text", "text": b.text})
        elif isinstance(b, ToolUseBlock):
            out.append(
                {
                    "type": "tool_use",
                    "id": anthropic_wire_id(b.id),
                    "name": b.name,
                    "input": b.input,
                }
            )
        elif isinstance(b, ThinkingBlock):
            if keep_thinking and b.signature:
                out.append({"type": "thinking", "thinking": b.thinking, "signature": b.signature})
            else:
                log.debug("dropping a thinking block from the history")
        elif isinstance(b, RedactedThinkingBlock):
            if keep_thinking:
                out.append({"type": "redacted_thinking", "data": b.data})
            else:
                log.debug("dropping a redacted thinking block from the history")
    return out


def history_messages(
    messages: Sequence[Message], *, supports_images: bool, thinking: bool, provider_name: str
) -> list[dict[str, Any]]:
    """Canonical history → Anthropic messages; results and a following user turn share one message."""
    wire: list[dict[str, Any]] = []
    for turn in normalize_history(messages):
        role: Literal["user", "assistant"]
        if turn.role == "assistant":
            role = "assistant"
            keep = thinking and turn.provider in ("anthropic", provider_name)
            blocks = _assistant_blocks(turn.blocks, keep_thinking=keep)
        elif turn.role == "results":
            role = "user"
            blocks = [_result_block(b, supports_images) for b in turn.blocks]
        else:
            role = "user"
            blocks = _user_blocks(turn.blocks, supports_images)
        if not blocks:
            continue
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    return wire


def build_body(
    req: LLMRequest,
    provider_name: str,
    history: HistoryEncoder,
    *,
    stream: bool,
    tools_encoder: ToolsEncoder | None = None,
) -> bytes:
    """The Messages request body, the history's final part and the tools encoded once (the
    tools by `tools_encoder`, when given)."""
    caps = req.capabilities
    caching = caps.supports_prompt_caching
    supports_images, thinking = caps.supports_images, req.thinking_enabled
    done, rest = history.split(
        req.messages,
        (supports_images, thinking),
        lambda part: history_messages(
            part, supports_images=supports_images, thinking=thinking, provider_name=provider_name
        ),
    )
    if caching and rest:
        for block in reversed(rest[-1]["content"]):
            if block["type"] not in ("thinking", "redacted_thinking"):
                block["cache_control"] = dict(EPHEMERAL)
                break
    fields: dict[str, Any] = {"model": req.wire_model, "max_tokens": req.max_output_tokens}
    system: list[dict[str, Any]] = []
    if req.system:
        system_block: dict[str, Any] = {"type": "text", "text": req.system}
        if caching:
            system_block["cache_control"] = dict(EPHEMERAL)
        system.append(system_block)
    if req.system_volatile:
        system.append({"type": "text", "text": req.system_volatile})
    if system:
        fields["system"] = system
    if req.stop_sequences:
        fields["stop_sequences"] = list(req.stop_sequences)
    if req.temperature is not None and not thinking:
        fields["temperature"] = req.temperature
    encoded: dict[str, bytes] = {}
    if req.tools and caps.supports_tools:
        mapper = functools.partial(wire_tools, caching=caching)
        encoded["tools"] = (
            tools_encoder.encode(req.tools, caching, mapper)
            if tools_encoder is not None
            else encode(mapper(req.tools))
        )
        if not caps.supports_parallel_tool_calls:
            fields["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
    if thinking and req.thinking_budget_tokens:
        budget = max(1024, min(req.thinking_budget_tokens, req.max_output_tokens - 1))
        fields["thinking"] = {"type": "enabled", "budget_tokens": budget}
    if stream:
        fields["stream"] = True
    return json_body(fields, [*done, *map(encode, rest)], encoded)


def wire_tools(tools: Sequence[ToolDefinition], *, caching: bool) -> list[dict[str, Any]]:
    """The `tools` array; with prompt caching the last tool carries the cache mark."""
    wire = [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in tools
    ]
    if caching and wire:
        wire[-1]["cache_control"] = dict(EPHEMERAL)
    return wire


# ---------------------------------------------------------------------------------------------
# Stream translation
# ---------------------------------------------------------------------------------------------


def _malformed(req: LLMRequest, provider: str, what: str) -> ProviderError:
    return ProviderError(
        "server_error", f"malformed anthropic stream: {what}", provider=provider, model=req.model
    )


class AnthropicTranslator:
    """Anthropic SSE events → canonical events ."""

    __slots__ = (
        "_req",
        "_slots",
        "builder",
        "cache_read",
        "cache_write",
        "done",
        "input_tokens",
        "output_tokens",
        "provider",
        "raw_stop",
        "saw_start",
    )

    def __init__(self, req: LLMRequest, builder: ContentBuilder, provider: str) -> None:
        self._req = req
        self.provider = provider
        self.builder = builder
        self.done = False
        self._slots: dict[int, TextSlot | ThinkingSlot | ToolSlot | None] = {}
        self.raw_stop: str | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.cache_read = 0
        self.cache_write = 0
        self.saw_start = False

    def feed(self, event: ServerEvent, out: list[StreamEvent]) -> None:
        """One server event; the SDK's rules: unnamed and `ping` events are skipped, `error`
        fails the stream, anything else is dispatched on its JSON `type`."""
        name = event.event
        if name is None or name == "ping" or not event.data:
            return
        if name == "error":
            raise StreamErrorEvent(event.data.decode("utf-8", "replace"))
        try:
            data = from_json(event.data)
            kind = data["type"]
            if kind == "content_block_delta":
                self._delta(data, out)
            elif kind == "content_block_start":
                self._block_start(data, out)
            elif kind == "content_block_stop":
                self._block_stop(data, out)
            elif kind == "message_start":
                self._message_start(data)
            elif kind == "message_delta":
                self._message_delta(data)
            elif kind == "message_stop":
                self.done = True
        except (ValueError, LookupError, TypeError, AttributeError) as exc:
            raise _malformed(
                self._req, self.provider, f"{name} event ({type(exc).__name__})"
            ) from None

    def _delta(self, event: dict[str, Any], out: list[StreamEvent]) -> None:
        index = event["index"]
        slot = self._slots.get(index)
        delta = event["delta"]
        kind = delta["type"]
        item: StreamEvent | None
        if kind == "text_delta" and type(slot) is TextSlot:
            item = self.builder.text(slot, delta["text"])
        elif kind == "input_json_delta" and type(slot) is ToolSlot:
            item = self.builder.tool_delta(slot, delta["partial_json"])
        elif kind == "thinking_delta" and type(slot) is ThinkingSlot:
            item = self.builder.thinking(slot, delta["thinking"])
        elif kind == "signature_delta" and type(slot) is ThinkingSlot:
            slot.signature = delta.get("signature") or slot.signature
            return
        elif index not in self._slots:
            raise _malformed(self._req, self.provider, f"delta for unknown block {index}")
        else:
            return  # citations and other annotation deltas carry no canonical content
        if item is not None:
            out.append(item)

    def _block_start(self, event: dict[str, Any], out: list[StreamEvent]) -> None:
        block = event["content_block"]
        kind = block["type"]
        index = event["index"]
        if kind == "text":
            text_slot = TextSlot()
            self._slots[index] = text_slot
            item = self.builder.text(text_slot, block.get("text") or "")
            if item is not None:
                out.append(item)
        elif kind == "thinking":
            thinking_slot = ThinkingSlot()
            thinking_slot.signature = block.get("signature") or None
            self._slots[index] = thinking_slot
            thinking_item = self.builder.thinking(thinking_slot, block.get("thinking") or "")
            if thinking_item is not None:
                out.append(thinking_item)
        elif kind == "redacted_thinking":
            self._slots[index] = None
            self.builder.redacted(block["data"])
        elif kind == "tool_use":
            tool_slot, start = self.builder.tool_start(block["name"], block.get("id"))
            self._slots[index] = tool_slot
            out.append(start)
            initial = block.get("input")
            if isinstance(initial, dict) and initial:
                delta = self.builder.tool_delta(tool_slot, json.dumps(initial))
                if delta is not None:
                    out.append(delta)
        else:
            self._slots[index] = None
            log.debug("ignoring anthropic content block of type %s", kind)

    def _block_stop(self, event: dict[str, Any], out: list[StreamEvent]) -> None:
        slot = self._slots.pop(event["index"], None)
        if type(slot) is ThinkingSlot:
            item = self.builder.thinking_end(slot, None)
            if item is not None:
                out.append(item)
        elif type(slot) is ToolSlot:
            end = self.builder.tool_end(slot)
            if end is not None:
                out.append(end)

    def _message_start(self, event: dict[str, Any]) -> None:
        self.saw_start = True
        usage = event["message"].get("usage")
        if usage is not None:
            self.input_tokens = usage.get("input_tokens") or 0
            self.output_tokens = usage.get("output_tokens") or 0
            self.cache_read = usage.get("cache_read_input_tokens") or 0
            self.cache_write = usage.get("cache_creation_input_tokens") or 0

    def _message_delta(self, event: dict[str, Any]) -> None:
        raw = (event.get("delta") or {}).get("stop_reason")
        if raw is not None:
            self.raw_stop = raw
        usage = event.get("usage")
        if usage is None:
            return
        for key, attr in _DELTA_USAGE_FIELDS:
            value = usage.get(key)
            if value is not None:
                setattr(self, attr, value)

    def end_of_body(self) -> None:
        if not self.done:
            raise ProviderError(
                "network",
                "anthropic stream ended without message_stop",
                provider=self.provider,
                model=self._req.model,
            )

    def stop(self) -> tuple[StopReason, str | None]:
        if self.raw_stop is None and not self.done:
            return "end_turn", None  # interrupted before message_delta: nothing to map
        return map_stop_reason(self.raw_stop), self.raw_stop

    def usage(self, *, partial: bool) -> TokenUsage:
        """The counts of `message_start`, updated by `message_delta`. A stream cut short (a
        cancel, a failure) never got its final `message_delta`, yet the provider bills what it
        generated: the output streamed since is estimated (chars / 4) when that is more than the
        count reported so far, and the usage is then flagged `estimated`."""
        input_estimated = not self.saw_start and not partial
        output = self.output_tokens
        if partial:
            output = max(output, estimate_output_tokens(self.builder.emitted_chars))
        return TokenUsage(
            input_tokens=estimate_request_tokens(self._req)
            if input_estimated
            else self.input_tokens,
            output_tokens=output,
            cache_read_tokens=self.cache_read,
            cache_write_tokens=self.cache_write,
            estimated=input_estimated or output != self.output_tokens,
        )


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def _class_for(status: int, etype: str | None, code: str | None, message: str) -> ErrorClass:
    if status == 400:
        if _CONTEXT_RE.search(message):
            return "context_overflow"
        if code in _CONTENT_FILTER_CODES or etype in _CONTENT_FILTER_CODES:
            return "content_filter"
        return "invalid_request"
    return status_class_common(status)


def _status_error(
    status: int,
    body: object,
    headers: Mapping[str, str] | None,
    *,
    provider: str,
    model: str,
    secret: str | None,
) -> ProviderError:
    """An error reply, or (status 2xx) an `event: error` inside a stream, classed by its type."""
    etype, code, api_message = error_fields(body)
    reported: int | None = status
    if 200 <= status < 300:
        reported = None
        status = _ETYPE_STATUS.get(etype or "", 500)
    error_class = _class_for(status, etype, code, api_message or "")
    retry_after = (
        parse_retry_after(headers)
        if error_class in ("rate_limit", "server_error", "network")
        else None
    )
    where = f"HTTP {reported}" if reported is not None else "stream error event"
    text = f"{provider} {where} ({etype or 'unknown'})"
    if api_message:
        text += f": {api_message}"
    return ProviderError(
        error_class,
        safe_text(text, secret),
        provider=provider,
        model=model,
        http_status=reported,
        provider_error=etype or code,
        provider_said=safe_text(api_message, secret) if api_message else None,
        retry_after_s=retry_after,
    )


def classify(
    exc: BaseException, *, endpoint: Endpoint, model: str, secret: str | None = None
) -> ProviderError:
    """An SDK or transport exception → `ProviderError` (of `endpoint`'s provider)."""
    provider = endpoint.provider
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, anthropic.APIStatusError):
        return _status_error(
            exc.status_code,
            exc.body,
            headers_of(exc),
            provider=provider,
            model=model,
            secret=secret,
        )
    if isinstance(exc, StreamErrorEvent):
        return _status_error(200, exc.body, None, provider=provider, model=model, secret=secret)
    if isinstance(exc, anthropic.APIConnectionError):  # includes APITimeoutError
        return network_error(exc, endpoint=endpoint, model=model)
    if isinstance(exc, anthropic.APIResponseValidationError) or is_malformed_error(exc):
        return ProviderError(
            "server_error",
            f"malformed anthropic response ({type(exc).__name__})",
            provider=provider,
            model=model,
        )
    if is_transport_error(exc):
        return network_error(exc, endpoint=endpoint, model=model)
    return internal_error(exc, provider=provider, model=model)


# ---------------------------------------------------------------------------------------------
# Non-streaming parse
# ---------------------------------------------------------------------------------------------


def parse_message(
    req: LLMRequest, message: Any
) -> tuple[list[ContentBlock], StopReason, str | None, TokenUsage]:
    """A non-streaming Anthropic message as canonical blocks, the canonical and raw stop reasons and the usage;
    tool ids are minted by metis and mapped to the wire's."""
    content: list[ContentBlock] = []
    for block in message.content or []:
        kind = block.type
        if kind == "text" and block.text:
            content.append(TextBlock(text=block.text))
        elif kind == "thinking" and (block.thinking or block.signature):
            content.append(ThinkingBlock(thinking=block.thinking, signature=block.signature))
        elif kind == "redacted_thinking":
            content.append(RedactedThinkingBlock(data=block.data))
        elif kind == "tool_use":
            tool_use_id = new_tool_use_id()
            req.tool_ids.record(tool_use_id, block.id)
            value = block.input if isinstance(block.input, dict) else {}
            if not isinstance(block.input, dict):
                value = parse_tool_input(json.dumps(block.input), context=block.name)
            content.append(ToolUseBlock(id=tool_use_id, name=block.name, input=value))
    usage = message.usage
    tokens = TokenUsage(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=getattr(usage, "cache_read_input_tokens", None) or 0,
        cache_write_tokens=getattr(usage, "cache_creation_input_tokens", None) or 0,
    )
    raw = message.stop_reason
    return content, map_stop_reason(raw), raw, tokens


# ---------------------------------------------------------------------------------------------
# The adapter
# ---------------------------------------------------------------------------------------------


class AnthropicAdapter:
    """One provider entry, one `AsyncAnthropic` client with SDK retries off."""

    kind: ClassVar[Literal["anthropic"]] = "anthropic"

    def __init__(self, provider: ProviderConfig, *, policy: RetryPolicy = DEFAULT_RETRY_POLICY):
        self.provider_name = provider.name
        self.policy = policy
        self._secret = provider.api_key
        self.unusable_key = provider.unusable_key()
        self._history = HistoryEncoder()
        self._tools = ToolsEncoder()
        self._client = anthropic.AsyncAnthropic(**sdk_client_options(anthropic, provider))
        self._endpoint = Endpoint.of(provider, self._client.base_url)

    # CallSpec -------------------------------------------------------------------------------

    def _body(self, req: LLMRequest, *, stream: bool) -> bytes:
        return build_body(
            req, self.provider_name, self._history, stream=stream, tools_encoder=self._tools
        )

    async def open_stream(self, req: LLMRequest) -> SseBody:
        body = self._body(req, stream=True)
        return await post_event_stream(self._client, MESSAGES_PATH, body, req.request_id)

    def translator(self, req: LLMRequest, builder: ContentBuilder) -> AnthropicTranslator:
        return AnthropicTranslator(req, builder, self.provider_name)

    def classify(self, exc: BaseException, req: LLMRequest) -> ProviderError:
        return classify(exc, endpoint=self._endpoint, model=req.model, secret=self._secret)

    async def _create(self, req: LLMRequest) -> anthropic.types.Message:
        body = self._body(req, stream=False)
        message: anthropic.types.Message = await post_json(
            self._client, MESSAGES_PATH, body, anthropic.types.Message, req.request_id
        )
        return message

    # ProviderAdapter ------------------------------------------------------------------------

    def stream(self, req: LLMRequest) -> AsyncIterator[StreamEvent]:
        return drive_stream(self, req)

    async def complete(self, req: LLMRequest) -> LLMResult:
        return await drive_complete(self, req, self._create, parse_message)

    async def aclose(self) -> None:
        await self._client.close()
