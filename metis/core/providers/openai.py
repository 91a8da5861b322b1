"""OpenAI Chat Completions adapter, also for OpenAI-compatible servers.

Compatible servers (Ollama, llama.cpp, vLLM) differ in small ways — parallel calls all at index
0, missing indexes, names arriving late, object-valued arguments, `stop` after calls, no usage —
so the accumulator repairs those instead of trusting the wire to match OpenAI's exactly.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar, Literal

import openai
from openai.types.chat import ChatCompletion
from pydantic_core import from_json

from metis.core.canonical.content import (
    ContentBlock,
    ImageBlock,
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
    estimate_request_tokens,
    normalize_history,
    openai_wire_id,
    result_text,
)
from metis.core.providers.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from metis.core.providers.sse import ServerEvent, SseBody
from metis.core.providers.streaming import (
    ContentBuilder,
    TextSlot,
    ThinkingSlot,
    ToolSlot,
    arguments_cut_off,
    drive_complete,
    drive_stream,
    estimate_output_tokens,
    parse_tool_input,
)
from metis.core.providers.transport import post_event_stream, post_json, sdk_client_options
from metis.core.providers.wire_body import HistoryEncoder, ToolsEncoder, encode, json_body

log = logging.getLogger(__name__)

COMPLETIONS_PATH = "/chat/completions"
TOOL_ERROR_PREFIX = "[tool error] "
_CONTEXT_RE = re.compile(
    r"(?i)prompt is too long|context (window|length)|maximum context|too many (input )?tokens"
)
_CONTENT_FILTER_CODES = frozenset({"content_filter", "content_policy_violation"})
_QUOTA_CODES = frozenset({"insufficient_quota"})
_estimate_warned: set[str] = set()


# ---------------------------------------------------------------------------------------------
# Request mapping
# ---------------------------------------------------------------------------------------------


def _image_part(block: ImageBlock, supports_images: bool) -> dict[str, Any]:
    if not supports_images:
        return {"type": "text", "text": IMAGE_OMITTED_TEXT}
    source = block.source
    if isinstance(source, UrlSource):
        url = source.url
    else:
        url = f"data:{source.media_type};base64,{source.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _user_message(blocks: list[Any], supports_images: bool) -> dict[str, Any] | None:
    if len(blocks) == 1 and isinstance(blocks[0], TextBlock):
        return {"role": "user", "content": blocks[0].text}
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, TextBlock):
            parts.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageBlock):
            parts.append(_image_part(b, supports_images))
    return {"role": "user", "content": parts} if parts else None


def _assistant_message(blocks: list[Any]) -> dict[str, Any] | None:
    texts = [b.text for b in blocks if isinstance(b, TextBlock)]
    calls = [
        {
            "id": openai_wire_id(b.id),
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input)},
        }
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    if not texts and not calls:
        return None  # thinking-only (dropped for OpenAI) or empty
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_message(block: ToolResultBlock) -> dict[str, Any]:
    text = result_text(block)
    if block.is_error:
        text = TOOL_ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": openai_wire_id(block.tool_use_id), "content": text}


def history_messages(messages: Sequence[Message], *, supports_images: bool) -> list[dict[str, Any]]:
    """Canonical history → Chat Completions messages (the system message is not history)."""
    wire: list[dict[str, Any]] = []
    for turn in normalize_history(messages):
        if turn.role == "user":
            message = _user_message(turn.blocks, supports_images)
            if message is not None:
                wire.append(message)
        elif turn.role == "assistant":
            message = _assistant_message(turn.blocks)
            if message is not None:
                wire.append(message)
        else:
            wire.extend(_tool_message(b) for b in turn.blocks)
    return wire


def build_body(
    req: LLMRequest,
    options: dict[str, Any],
    history: HistoryEncoder,
    *,
    stream: bool,
    tools_encoder: ToolsEncoder | None = None,
) -> bytes:
    """The Chat Completions request body, the history's final part and the tools encoded once
    (the tools by `tools_encoder`, when given)."""
    caps = req.capabilities
    supports_images = caps.supports_images
    done, rest = history.split(
        req.messages,
        supports_images,
        lambda part: history_messages(part, supports_images=supports_images),
    )
    system = "\n\n".join(s for s in (req.system, req.system_volatile) if s)
    head = [encode({"role": "system", "content": system})] if system else []
    fields: dict[str, Any] = {"model": req.wire_model}
    fields[options.get("max_tokens_field", "max_completion_tokens")] = req.max_output_tokens
    encoded: dict[str, bytes] = {}
    if req.tools and caps.supports_tools:
        encoded["tools"] = (
            tools_encoder.encode(req.tools, None, wire_tools)
            if tools_encoder is not None
            else encode(wire_tools(req.tools))
        )
        if not caps.supports_parallel_tool_calls:
            fields["parallel_tool_calls"] = False
    if req.temperature is not None:
        fields["temperature"] = req.temperature
    if req.stop_sequences:
        fields["stop"] = list(req.stop_sequences)
    if stream:
        fields["stream"] = True
        if options.get("stream_include_usage", True):
            fields["stream_options"] = {"include_usage": True}
    return json_body(fields, [*head, *done, *map(encode, rest)], encoded)


def wire_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """The `tools` array: each tool as a `function`."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.input_schema,
            },
        }
        for t in tools
    ]


# ---------------------------------------------------------------------------------------------
# Stop reasons and usage
# ---------------------------------------------------------------------------------------------


def map_finish_reason(raw: str | None, *, produced_calls: bool, refused: bool) -> StopReason:
    """The canonical stop reason of an OpenAI-style `finish_reason`; `stop` with tool calls is
    `tool_use` (some servers say so), and an unknown value is logged and read as `end_turn`."""
    if refused or raw == "content_filter":
        return "refusal"
    if raw == "stop":
        return "tool_use" if produced_calls else "end_turn"
    if raw == "length":
        return "max_tokens"
    if raw in ("tool_calls", "function_call"):
        return "tool_use"
    log.warning("openai finish reason %r mapped to end_turn", raw)
    return "end_turn"


def usage_from_wire(usage: Mapping[str, Any], provider: str) -> TokenUsage:
    """Cached tokens are inside `prompt_tokens`: subtract them so no bucket is billed twice."""
    prompt = usage.get("prompt_tokens") or 0
    details = usage.get("prompt_tokens_details")
    cached = (details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
    input_tokens = prompt - cached
    if input_tokens < 0:
        log.warning(
            "provider %s reported %d cached of %d prompt tokens; input clamped to 0",
            provider,
            cached,
            prompt,
        )
        input_tokens = 0
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=usage.get("completion_tokens") or 0,
        cache_read_tokens=cached,
        cache_write_tokens=0,
    )


def estimated_usage(
    req: LLMRequest, output_chars: int, provider: str, *, cut_short: bool = False
) -> TokenUsage:
    """Routing-formula input and chars/4 output, flagged `estimated` so the cost is labelled.
    The warning is for a provider that never sends usage, not for a stream `cut_short` before
    its usage chunk (a cancel), which any provider's can be."""
    if not cut_short and provider not in _estimate_warned:
        _estimate_warned.add(provider)
        log.warning("provider %s sent no usage; token counts are estimated", provider)
    return TokenUsage(
        input_tokens=estimate_request_tokens(req),
        output_tokens=estimate_output_tokens(output_chars),
        estimated=True,
    )


# ---------------------------------------------------------------------------------------------
# Stream translation
# ---------------------------------------------------------------------------------------------


class _Call:
    """A tool call being accumulated; its `tool.use_start` waits until the name is known."""

    __slots__ = ("pending", "slot", "wire_id")

    def __init__(self, wire_id: str | None) -> None:
        self.wire_id = wire_id
        self.pending: list[str] = []
        self.slot: ToolSlot | None = None


_CHUNK_EVENTS = frozenset({None, "message", "error"})


class OpenAITranslator:
    """Chat completion chunks → canonical events."""

    __slots__ = (
        "_by_id",
        "_by_index",
        "_calls",
        "_req",
        "_text",
        "_thinking",
        "builder",
        "done",
        "finish_raw",
        "provider",
        "refused",
        "wire_usage",
    )

    def __init__(self, req: LLMRequest, builder: ContentBuilder, provider: str) -> None:
        self._req = req
        self.provider = provider
        self.builder = builder
        self.done = False
        self._text: TextSlot | None = None
        self._thinking: ThinkingSlot | None = None
        self._calls: list[_Call] = []
        self._by_index: dict[int, _Call] = {}
        self._by_id: dict[str, _Call] = {}
        self.finish_raw: str | None = None
        self.refused = False
        self.wire_usage: dict[str, Any] | None = None

    def feed(self, event: ServerEvent, out: list[StreamEvent]) -> None:
        """One `data:` chunk; the SDK's rules: `[DONE]` ends the body, a chunk carrying an
        `error` fails the stream. Chat Completions sends nothing but unnamed chunks, so a named
        event other than `message` (the format's default name) or `error` is something a
        compatible server added (a keep-alive, progress): skipped, as an SSE consumer skips an
        event it has no listener for, rather than failing a good stream."""
        if event.event not in _CHUNK_EVENTS:
            log.debug("provider %s: skipping a %r stream event", self.provider, event.event)
            return
        data = event.data
        if data.startswith(b"[DONE]"):
            self.end_of_body()
            self.done = True
            return
        try:
            chunk = from_json(data)
            if chunk.get("error"):
                raise StreamErrorEvent(chunk["error"])
            self._chunk(chunk, out)
        except (ValueError, LookupError, TypeError, AttributeError) as exc:
            raise ProviderError(
                "server_error",
                f"malformed openai stream chunk ({type(exc).__name__})",
                provider=self.provider,
                model=self._req.model,
            ) from None

    def _chunk(self, chunk: dict[str, Any], out: list[StreamEvent]) -> None:
        usage = chunk.get("usage")
        if usage is not None:
            self.wire_usage = usage
        choices = chunk.get("choices")
        if not choices:
            return
        choice = choices[0]
        delta = choice.get("delta")
        if delta:
            content = delta.get("content")
            if content:
                self._emit_text(content, out)
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self._emit_thinking(reasoning, out)
            refusal = delta.get("refusal")
            if refusal:
                self.refused = True
                self._emit_text(refusal, out)
            calls = delta.get("tool_calls")
            if calls and self.finish_raw is None:
                for fragment in calls:
                    self._tool_fragment(fragment, out)
        finish = choice.get("finish_reason")
        if finish and self.finish_raw is None:
            self.finish_raw = finish
            self._close_calls(out)

    def _emit_text(self, text: str, out: list[StreamEvent]) -> None:
        slot = self._text
        if slot is None:
            slot = self._text = TextSlot()
            self._thinking = None
        item = self.builder.text(slot, text)
        if item is not None:
            out.append(item)

    def _emit_thinking(self, text: str, out: list[StreamEvent]) -> None:
        slot = self._thinking
        if slot is None:
            slot = self._thinking = ThinkingSlot()
            self._text = None
        item = self.builder.thinking(slot, text)
        if item is not None:
            out.append(item)

    def _find_call(self, index: int | None, wire_id: str | None) -> _Call:
        if index is not None:
            call = self._by_index.get(index)
            if call is not None and not (wire_id and call.wire_id and wire_id != call.wire_id):
                return self._adopt_id(call, wire_id)
        elif wire_id and wire_id in self._by_id:
            return self._by_id[wire_id]
        elif not wire_id and self._calls:
            return self._calls[-1]
        call = _Call(wire_id)
        self._calls.append(call)
        if index is not None:
            self._by_index[index] = call
        if wire_id:
            self._by_id[wire_id] = call
        return call

    def _adopt_id(self, call: _Call, wire_id: str | None) -> _Call:
        if wire_id and not call.wire_id:
            call.wire_id = wire_id
            self._by_id[wire_id] = call
            if call.slot is not None:
                self.builder.tool_ids.record(call.slot.tool_use_id, wire_id)
        return call

    def _tool_fragment(self, fragment: dict[str, Any], out: list[StreamEvent]) -> None:
        call = self._find_call(fragment.get("index"), fragment.get("id") or None)
        function = fragment.get("function") or {}
        name = function.get("name")
        args = function.get("arguments")
        if args is not None and not isinstance(args, str):
            args = json.dumps(args)
        if call.slot is None:
            if args:
                call.pending.append(args)
            if not name:
                return
            call.slot, start = self.builder.tool_start(name, call.wire_id)
            out.append(start)
            self._text = None
            self._thinking = None
            for piece in call.pending:
                item = self.builder.tool_delta(call.slot, piece)
                if item is not None:
                    out.append(item)
            call.pending.clear()
            return
        if args:
            item = self.builder.tool_delta(call.slot, args)
            if item is not None:
                out.append(item)

    def _close_calls(self, out: list[StreamEvent]) -> None:
        for call in self._calls:
            if call.slot is None:
                log.warning(
                    "provider %s: dropping a tool call that never got a name (id %s)",
                    self.provider,
                    call.wire_id,
                )
        slots = sorted((c.slot for c in self._calls if c.slot is not None), key=lambda s: s.index)
        for slot in slots:
            end = self.builder.tool_end(slot)
            if end is not None:
                out.append(end)

    def end_of_body(self) -> None:
        if self.finish_raw is None:
            raise ProviderError(
                "network",
                "openai stream ended before a finish reason",
                provider=self.provider,
                model=self._req.model,
            )

    def stop(self) -> tuple[StopReason, str | None]:
        if self.finish_raw is None and not self.refused:
            return "end_turn", None
        stop = map_finish_reason(
            self.finish_raw, produced_calls=self.builder.tool_count > 0, refused=self.refused
        )
        return stop, self.finish_raw

    def usage(self, *, partial: bool) -> TokenUsage:
        if self.wire_usage is not None:
            return usage_from_wire(self.wire_usage, self.provider)
        # A stream cut short before its usage chunk is billed all the same (the prompt and the
        # output generated so far): estimated, as a stream that never sends usage is.
        chars = self.builder.emitted_chars
        return estimated_usage(self._req, chars, self.provider, cut_short=partial)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def _status_class(status: int, etype: str | None, code: str | None, message: str) -> ErrorClass:
    if status == 429 and (code in _QUOTA_CODES or etype in _QUOTA_CODES):
        return "auth"
    if status == 400:
        if code == "context_length_exceeded" or _CONTEXT_RE.search(message):
            return "context_overflow"
        if code in _CONTENT_FILTER_CODES or etype in _CONTENT_FILTER_CODES:
            return "content_filter"
        return "invalid_request"
    return status_class_common(status)


def _stream_error_class(etype: str | None, code: str | None, message: str) -> ErrorClass:
    """An error chunk inside a 200 stream carries no status: class it by its code/type."""
    keys = {k for k in (etype, code) if k}
    if keys & _QUOTA_CODES or keys & {"invalid_api_key", "authentication_error"}:
        return "auth"
    if keys & {"rate_limit_exceeded", "rate_limit_error", "requests", "tokens"}:
        return "rate_limit"
    if "context_length_exceeded" in keys:
        return "context_overflow"
    if keys & _CONTENT_FILTER_CODES:
        return "content_filter"
    if "invalid_request_error" in keys:
        return "context_overflow" if _CONTEXT_RE.search(message) else "invalid_request"
    return "server_error"


def _route_hint(exc: openai.APIStatusError, code: str | None, message: str) -> str:
    """What to check when the server has no such route (a 404 that is not about the model): most
    often a local server's base_url written without its `/v1`, whose answer alone ("404 page not
    found") does not say so."""
    if exc.status_code != 404 or code == "model_not_found" or "model" in message.lower():
        return ""
    url = exc.request.url.copy_with(query=None)
    return (
        f"; the server has no {url}: check the provider's base_url in models.yaml "
        "(OpenAI-compatible servers usually serve under /v1)"
    )


def classify(
    exc: BaseException, *, endpoint: Endpoint, model: str, secret: str | None = None
) -> ProviderError:
    """An SDK or transport exception → `ProviderError` (of `endpoint`'s provider)."""
    provider = endpoint.provider
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, openai.APIStatusError):
        etype, code, api_message = error_fields(exc.body)
        status = exc.status_code
        error_class = _status_class(status, etype, code, api_message or "")
        retry_after = (
            parse_retry_after(headers_of(exc))
            if error_class in ("rate_limit", "server_error", "network")
            else None
        )
        text = f"{provider} HTTP {status} ({code or etype or 'unknown'})"
        if api_message:
            text += f": {api_message}"
        text += _route_hint(exc, code, api_message or "")
        return ProviderError(
            error_class,
            safe_text(text, secret),
            provider=provider,
            model=model,
            http_status=status,
            provider_error=code or etype,
            provider_said=safe_text(api_message, secret) if api_message else None,
            retry_after_s=retry_after,
        )
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return network_error(exc, endpoint=endpoint, model=model)
    if isinstance(exc, openai.APIResponseValidationError) or is_malformed_error(exc):
        return ProviderError(
            "server_error",
            f"malformed openai response ({type(exc).__name__})",
            provider=provider,
            model=model,
        )
    if isinstance(exc, StreamErrorEvent):  # an error chunk inside the stream
        etype, code, api_message = error_fields(exc.body)
        text = f"{provider} stream error ({code or etype or 'unknown'})"
        if api_message:
            text += f": {api_message}"
        return ProviderError(
            _stream_error_class(etype, code, api_message or ""),
            safe_text(text, secret),
            provider=provider,
            model=model,
            provider_error=code or etype,
            provider_said=safe_text(api_message, secret) if api_message else None,
        )
    if is_transport_error(exc):
        return network_error(exc, endpoint=endpoint, model=model)
    return internal_error(exc, provider=provider, model=model)


# ---------------------------------------------------------------------------------------------
# Non-streaming parse
# ---------------------------------------------------------------------------------------------


def parse_completion(
    req: LLMRequest, completion: Any, provider: str
) -> tuple[list[ContentBlock], StopReason, str | None, TokenUsage]:
    """A non-streaming chat completion as canonical blocks, the canonical and raw stop reasons and the usage (estimated
    when the server sent none); tool ids are minted by metis and mapped to the wire's."""
    choices = completion.choices or []
    if not choices:
        raise ProviderError(
            "server_error", "openai response has no choices", provider=provider, model=req.model
        )
    choice = choices[0]
    message = choice.message
    content: list[ContentBlock] = []
    chars = 0
    extra = message.model_extra or {}
    reasoning = extra.get("reasoning_content") or extra.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        content.append(ThinkingBlock(thinking=reasoning, signature=None))
        chars += len(reasoning)
    refusal = getattr(message, "refusal", None)
    text = (message.content or "") + (refusal or "")
    if text:
        content.append(TextBlock(text=text))
        chars += len(text)
    last_cut_off = False
    for call in message.tool_calls or []:
        function = call.function
        if function is None or not function.name:
            continue
        args = function.arguments
        if args is not None and not isinstance(args, str):
            args = json.dumps(args)
        chars += len(args or "")
        tool_use_id = new_tool_use_id()
        req.tool_ids.record(tool_use_id, call.id or None)
        last_cut_off = arguments_cut_off(args or "")
        value = parse_tool_input(args or "", context=function.name)
        content.append(ToolUseBlock(id=tool_use_id, name=function.name, input=value))
    raw = choice.finish_reason
    stop = map_finish_reason(
        raw, produced_calls=any(isinstance(b, ToolUseBlock) for b in content), refused=bool(refusal)
    )
    cut = content[-1] if last_cut_off else None
    if stop == "max_tokens" and isinstance(cut, ToolUseBlock):
        # as in a stream (`ContentBuilder.settle`): the call the limit cut was never made
        content.pop()
        log.warning("tool call %s (%s) was cut off by the output limit; dropped", cut.name, cut.id)
    usage = (
        usage_from_wire(completion.usage.model_dump(), provider)
        if completion.usage is not None
        else estimated_usage(req, chars, provider)
    )
    return content, stop, raw, usage


# ---------------------------------------------------------------------------------------------
# The adapter
# ---------------------------------------------------------------------------------------------


class OpenAIAdapter:
    """One provider entry, one `AsyncOpenAI` client with SDK retries off."""

    kind: ClassVar[Literal["openai"]] = "openai"

    def __init__(self, provider: ProviderConfig, *, policy: RetryPolicy = DEFAULT_RETRY_POLICY):
        self.provider_name = provider.name
        self.policy = policy
        self.options = dict(provider.options)
        self._history = HistoryEncoder()
        self._tools = ToolsEncoder()
        self._secret = provider.api_key
        self.unusable_key = provider.unusable_key()
        self._client = openai.AsyncOpenAI(**sdk_client_options(openai, provider))
        self._endpoint = Endpoint.of(provider, self._client.base_url)

    # CallSpec -------------------------------------------------------------------------------

    def _body(self, req: LLMRequest, *, stream: bool) -> bytes:
        return build_body(
            req, self.options, self._history, stream=stream, tools_encoder=self._tools
        )

    async def open_stream(self, req: LLMRequest) -> SseBody:
        body = self._body(req, stream=True)
        return await post_event_stream(self._client, COMPLETIONS_PATH, body, req.request_id)

    def translator(self, req: LLMRequest, builder: ContentBuilder) -> OpenAITranslator:
        return OpenAITranslator(req, builder, self.provider_name)

    def classify(self, exc: BaseException, req: LLMRequest) -> ProviderError:
        return classify(exc, endpoint=self._endpoint, model=req.model, secret=self._secret)

    async def _create(self, req: LLMRequest) -> ChatCompletion:
        body = self._body(req, stream=False)
        completion: ChatCompletion = await post_json(
            self._client, COMPLETIONS_PATH, body, ChatCompletion, req.request_id
        )
        return completion

    def _parse(
        self, req: LLMRequest, completion: Any
    ) -> tuple[list[ContentBlock], StopReason, str | None, TokenUsage]:
        return parse_completion(req, completion, self.provider_name)

    # ProviderAdapter ------------------------------------------------------------------------

    def stream(self, req: LLMRequest) -> AsyncIterator[StreamEvent]:
        return drive_stream(self, req)

    async def complete(self, req: LLMRequest) -> LLMResult:
        return await drive_complete(self, req, self._create, self._parse)

    async def aclose(self) -> None:
        await self._client.close()
