"""Wire-independent machinery of a streamed call: cancel racing, block accounting, the retry driver.

Both HTTP adapters only translate wire events into calls on `ContentBuilder`; everything that
must behave identically across providers (stream invariants, retries, cancellation) lives here
once.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from time import perf_counter
from typing import Any, Literal, Protocol, TypeVar

from pydantic_core import from_json

from metis.core.cancel_event import CancelEvent
from metis.core.canonical.content import (
    ContentBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)
from metis.core.canonical.ids import new_tool_use_id
from metis.core.canonical.usage import TokenUsage
from metis.core.providers.base import (
    LLMRequest,
    LLMResult,
    MessageComplete,
    MessageStart,
    StopReason,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolIdMap,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
)
from metis.core.providers.errors import ProviderError
from metis.core.providers.retry import RetryPolicy
from metis.core.tools.schema import unparsed_input

log = logging.getLogger(__name__)
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Cancel racing
# ---------------------------------------------------------------------------------------------


class CancelRequested(Exception):
    """The request's cancel event fired while (or before) the adapter was waiting on the wire."""


_END = object()


class CancelGuard:
    """Interrupts the awaiting task as soon as `cancel` is set, the way `asyncio.timeout` does.

    A callback on the cancel event (no task per call, none per read) keeps the per-delta cost at
    a flag write; the task is only ever interrupted while it is parked inside `run`/`next`, so a
    cancel can never land in the consumer's own code between two yields.
    """

    __slots__ = ("_armed", "_event", "_fired", "_listening")

    def __init__(self, cancel: CancelEvent) -> None:
        self._event = cancel
        self._armed: asyncio.Task[Any] | None = None
        self._fired = False
        self._listening = False

    def _listen(self) -> None:
        if not self._listening:
            self._listening = True
            self._event.add_callback(self._on_cancel)

    def _on_cancel(self) -> None:
        if self._armed is None or self._fired:
            return  # not parked: the next `run`/`next` sees the event set
        self._fired = True
        self._armed.cancel()

    def _settle(self, task: asyncio.Task[Any]) -> bool:
        """True when the CancelledError being handled is ours alone (then it is absorbed)."""
        if not self._fired:
            return False
        self._fired = False
        return task.uncancel() == 0

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable`, raising `CancelRequested` instead if the call's cancel is set
        meanwhile (or already was)."""
        if self._event.is_set():
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise CancelRequested
        self._listen()
        task = asyncio.current_task()
        assert task is not None
        self._armed = task
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self._settle(task):
                raise CancelRequested from None
            raise
        finally:
            self._armed = None

    async def next(self, iterator: AsyncIterator[T]) -> T | object:
        """The iterator's next item, or `_END`; the hot path of every streamed delta."""
        if self._event.is_set():
            raise CancelRequested
        if not self._listening:
            self._listen()
        task = asyncio.current_task()
        self._armed = task
        try:
            return await iterator.__anext__()
        except StopAsyncIteration:
            return _END
        except asyncio.CancelledError:
            if task is not None and self._settle(task):
                raise CancelRequested from None
            raise
        finally:
            self._armed = None

    def close(self) -> None:
        """Stop listening (the call is over)."""
        if self._listening:
            self._event.remove_callback(self._on_cancel)
            self._listening = False


# ---------------------------------------------------------------------------------------------
# Block accounting
# ---------------------------------------------------------------------------------------------


def parse_tool_input(text: str, *, context: str = "", warn: bool = True) -> dict[str, Any]:
    """The accumulated argument JSON as an object; `{}` when empty, and `unparsed_input` (why, in
    words) when unparseable or not an object.

    The dispatcher's schema check then reports why to the model, so a model's broken JSON never
    breaks the stream. pydantic_core's parser also refuses what `json` would accept but
    nothing downstream can hold: lone surrogate escapes (not storable as UTF-8) and nesting
    deep enough to exhaust the recursion limit.
    """
    if not text.strip():
        return {}
    try:
        value = from_json(text)
    except ValueError as exc:
        reason = f"arguments were not valid JSON ({exc}, {len(text)} chars)"
    else:
        if isinstance(value, dict):
            return value
        reason = f"arguments were not a JSON object (a JSON {_json_kind(value)})"
    if warn:
        log.warning("tool input of %s: %s", context, reason)
    return unparsed_input(reason)


def arguments_cut_off(text: str) -> bool:
    """The arguments stop mid-JSON: what a call looks like when the output limit cuts it."""
    if not text.strip():
        return False
    try:
        from_json(text)
    except ValueError:
        return True
    return False


def _json_kind(value: Any) -> str:
    """The JSON name of a parsed value's type, for the model to read."""
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"


class TextSlot:
    """A text block being streamed: its index once it carries content, and its pieces."""

    __slots__ = ("index", "parts")

    def __init__(self) -> None:
        self.index: int | None = None
        self.parts: list[str] = []


class ThinkingSlot:
    """A thinking block being streamed: its index, its pieces and its signature."""

    __slots__ = ("index", "parts", "signature")

    def __init__(self) -> None:
        self.index: int | None = None
        self.parts: list[str] = []
        self.signature: str | None = None


class RedactedSlot:
    """A redacted thinking block, which arrives whole."""

    __slots__ = ("data", "index")

    def __init__(self, data: str, index: int) -> None:
        self.data = data
        self.index = index


class ToolSlot:
    """A tool call being streamed: its metis id and the wire's id, its input pieces, and the parsed
    input once its `tool.use_end` was made (`ended`)."""

    __slots__ = ("ended", "final_input", "index", "name", "parts", "tool_use_id", "wire_id")

    def __init__(self, index: int, tool_use_id: str, name: str, wire_id: str | None) -> None:
        self.index = index
        self.tool_use_id = tool_use_id
        self.name = name
        self.wire_id = wire_id
        self.parts: list[str] = []
        self.ended = False
        self.final_input: dict[str, Any] | None = None

    @property
    def cut_off(self) -> bool:
        return arguments_cut_off("".join(self.parts))


Slot = TextSlot | ThinkingSlot | RedactedSlot | ToolSlot


class ContentBuilder:
    """Allocates block indexes, mints tool ids and keeps `final_content` in step with the events.

    A block gets its index when it first carries content, so indexes always equal positions in
    `final_content` and a block with no content never exists.
    """

    __slots__ = ("blocks", "emitted_chars", "message_id", "started", "tool_ids")

    def __init__(self, message_id: str, tool_ids: ToolIdMap) -> None:
        self.message_id = message_id
        self.tool_ids = tool_ids
        self.blocks: list[Slot] = []
        self.started = False
        self.emitted_chars = 0

    def text(self, slot: TextSlot, chunk: str) -> TextDelta | None:
        """The delta for a piece of text, giving the block its index on its first non-empty piece;
        None for an empty piece."""
        if not chunk:
            return None
        if slot.index is None:
            slot.index = len(self.blocks)
            self.blocks.append(slot)
        slot.parts.append(chunk)
        self.emitted_chars += len(chunk)
        self.started = True
        return TextDelta(message_id=self.message_id, content_block_index=slot.index, text=chunk)

    def thinking(self, slot: ThinkingSlot, chunk: str) -> ThinkingDelta | None:
        """The delta for a piece of thinking, indexed like `text`; None for an empty piece."""
        if not chunk:
            return None
        if slot.index is None:
            slot.index = len(self.blocks)
            self.blocks.append(slot)
        slot.parts.append(chunk)
        self.emitted_chars += len(chunk)
        self.started = True
        return ThinkingDelta(message_id=self.message_id, content_block_index=slot.index, text=chunk)

    def thinking_end(self, slot: ThinkingSlot, signature: str | None) -> ThinkingDelta | None:
        """The block's last delta (empty text, the signature); nothing for an unsigned block."""
        if signature:
            slot.signature = signature
        if not slot.signature:
            return None
        if slot.index is None:
            slot.index = len(self.blocks)
            self.blocks.append(slot)
        self.started = True
        return ThinkingDelta(
            message_id=self.message_id,
            content_block_index=slot.index,
            text="",
            signature=slot.signature,
        )

    def redacted(self, data: str) -> None:
        """Add a redacted thinking block (no delta: it is not shown while streaming)."""
        self.blocks.append(RedactedSlot(data, len(self.blocks)))

    def tool_start(self, name: str, wire_id: str | None) -> tuple[ToolSlot, ToolUseStart]:
        """Open a tool call under a fresh metis id mapped to the wire's id."""
        tool_use_id = new_tool_use_id()
        self.tool_ids.record(tool_use_id, wire_id)
        slot = ToolSlot(len(self.blocks), tool_use_id, name, wire_id)
        self.blocks.append(slot)
        self.started = True
        return slot, ToolUseStart(
            message_id=self.message_id,
            content_block_index=slot.index,
            tool_use_id=tool_use_id,
            tool_name=name,
        )

    def tool_delta(self, slot: ToolSlot, fragment: str) -> ToolUseInputDelta | None:
        if not fragment:
            return None
        slot.parts.append(fragment)
        self.emitted_chars += len(fragment)
        return ToolUseInputDelta(
            message_id=self.message_id,
            content_block_index=slot.index,
            tool_use_id=slot.tool_use_id,
            partial_json=fragment,
        )

    def tool_end(self, slot: ToolSlot) -> ToolUseEnd | None:
        """The wire closed a tool call: its end, with the parsed input. None for a call whose
        arguments stop mid-JSON: cut off by the output limit or broken by the model, which only
        the stop reason, still to come, tells apart; `settle` ends it then."""
        if slot.cut_off:
            return None
        return self._end(slot, self._parsed(slot))

    @staticmethod
    def _parsed(slot: ToolSlot) -> dict[str, Any]:
        return parse_tool_input("".join(slot.parts), context=f"{slot.name} ({slot.tool_use_id})")

    def _end(
        self, slot: ToolSlot, final_input: dict[str, Any], *, dropped: bool = False
    ) -> ToolUseEnd:
        slot.ended = True
        slot.final_input = final_input
        return ToolUseEnd(
            message_id=self.message_id,
            content_block_index=slot.index,
            tool_use_id=slot.tool_use_id,
            final_input=slot.final_input,
            dropped=dropped,
        )

    def settle(self, stop: StopReason) -> list[ToolUseEnd]:
        """The ends still owed once the stream is over: of the calls it left open or whose
        arguments did not parse (their deltas must still end).

        After a `max_tokens` stop the last block, when such a call, was cut off by the limit:
        it was never made, so it leaves the message (not stored, run or answered) and its end
        says `dropped`, for clients to say so. Being last keeps every other block's index its
        position. A stream cut short (cancelled, failed) keeps no call, and its cut arguments
        are no fault of the model's: `{}`. Any other such call keeps its arguments' fault as its
        input, for the schema check to report to the model.
        """
        last = self.blocks[-1] if self.blocks else None
        ends: list[ToolUseEnd] = []
        for slot in self.blocks:
            if not isinstance(slot, ToolSlot) or slot.ended:
                continue
            if stop == "max_tokens" and slot is last and slot.cut_off:
                log.warning(
                    "tool call %s (%s) was cut off by the output limit; dropped",
                    slot.name,
                    slot.tool_use_id,
                )
                ends.append(self._end(slot, {}, dropped=True))
            elif stop in ("cancelled", "error") and slot.cut_off:
                ends.append(self._end(slot, {}))
            else:
                ends.append(self._end(slot, self._parsed(slot)))
        if ends and ends[-1].dropped:
            self.blocks.pop()
        return ends

    @property
    def tool_count(self) -> int:
        return sum(1 for b in self.blocks if isinstance(b, ToolSlot))

    def final_content(self) -> list[ContentBlock]:
        """The blocks of `message.complete`, in index order; what the deltas said, exactly."""
        content: list[ContentBlock] = []
        for b in self.blocks:
            if isinstance(b, TextSlot):
                content.append(TextBlock(text="".join(b.parts)))
            elif isinstance(b, ThinkingSlot):
                content.append(ThinkingBlock(thinking="".join(b.parts), signature=b.signature))
            elif isinstance(b, RedactedSlot):
                content.append(RedactedThinkingBlock(data=b.data))
            else:
                assert b.final_input is not None, "settle ends every call before the content"
                content.append(ToolUseBlock(id=b.tool_use_id, name=b.name, input=b.final_input))
        return content


def estimate_output_tokens(chars: int) -> int:
    """About four characters a token: the estimate used when a provider sends no usage."""
    return math.ceil(chars / 4)


# ---------------------------------------------------------------------------------------------
# The stream driver
# ---------------------------------------------------------------------------------------------


class Translator(Protocol):
    """One attempt's wire→canonical state machine, fed the decoded server events in order."""

    builder: ContentBuilder
    done: bool  # a terminal wire event was seen: stop reading

    def feed(self, event: Any, out: list[StreamEvent]) -> None:
        """Translate one decoded wire event, appending the canonical events it produces to `out`."""

    def end_of_body(self) -> None:
        """Called when the body ends; raises ProviderError(network) without a terminal event."""
        ...

    def stop(self) -> tuple[StopReason, str | None]:
        """The canonical stop reason and the wire's raw one."""

    def usage(self, *, partial: bool) -> TokenUsage:
        """`partial`: the stream was cut short; then only what the provider itself reported
        counts (0 for the rest), since a failed or cancelled call bills nothing else.
        A finished stream may estimate what the provider never sent."""
        ...


class WireStream(Protocol):
    """The body of one call: each item is a batch (list) of wire events, in order."""

    def __aiter__(self) -> AsyncIterator[list[Any]]: ...

    async def close(self) -> None: ...


class CallSpec(Protocol):
    """What an HTTP adapter supplies to the shared driver for one request."""

    provider_name: str
    policy: RetryPolicy
    unusable_key: str | None
    """Why the provider's key can never be sent (`ProviderConfig.unusable_key`), or None."""

    async def open_stream(self, req: LLMRequest) -> WireStream:
        """Send the streamed request and return its body; failures raise the SDK's or HTTP stack's
        exceptions, for `classify`."""

    def translator(self, req: LLMRequest, builder: ContentBuilder) -> Translator:
        """A fresh translator for one attempt."""

    def classify(self, exc: BaseException, req: LLMRequest) -> ProviderError:
        """Map any exception of an attempt to the closed provider-error taxonomy."""


def _ms(since: float) -> int:
    return int((perf_counter() - since) * 1000)


def cancelled_error(req: LLMRequest, provider: str, attempts: int) -> ProviderError:
    """The error a call ends with when its turn was cancelled."""
    return ProviderError(
        "cancelled", "request cancelled", provider=provider, model=req.model, attempts=attempts
    )


async def _close_quietly(handle: WireStream) -> None:
    try:
        await handle.close()
    except Exception:  # closing a broken response must not mask the real outcome
        log.debug("closing a provider response failed", exc_info=True)


async def _before_retry(
    spec: CallSpec, req: LLMRequest, guard: CancelGuard, attempt: int, err: ProviderError
) -> None:
    """Report the failed attempt, then wait out the back-off or raise `err` / `cancelled`."""
    delay = spec.policy.delay_before_retry(attempt, err)
    await req.hooks.attempt_failed(attempt, err, delay is not None)
    if delay is None:
        raise err from None
    log.warning(
        "provider %s model %s: attempt %d failed (%s, status %s); retrying in %.2fs",
        spec.provider_name,
        req.model,
        attempt,
        err.error_class,
        err.http_status,
        delay,
    )
    try:
        await guard.run(spec.policy.sleep(delay))
    except CancelRequested:
        raise cancelled_error(req, spec.provider_name, attempt) from None


def _refuse_an_unusable_key(spec: CallSpec, req: LLMRequest) -> None:
    """Fail the attempt before any request when the key cannot be sent: as `auth`, which is not
    retried and counts toward the provider's availability, as a key the provider refused does."""
    if spec.unusable_key is not None:
        raise ProviderError("auth", spec.unusable_key, provider=spec.provider_name, model=req.model)


def _as_provider_error(spec: CallSpec, req: LLMRequest, exc: BaseException) -> ProviderError:
    return exc if isinstance(exc, ProviderError) else spec.classify(exc, req)


def _interrupted(
    req: LLMRequest,
    builder: ContentBuilder,
    tr: Translator,
    stop_reason: Literal["cancelled", "error"],
    t0: float,
    first_token_ms: int | None,
    attempt: int,
) -> list[StreamEvent]:
    """The closing events of a stream cut short after `message.start`:
    a `tool.use_end` per open call, then `message.complete` with the partial content."""
    closing: list[StreamEvent] = list(builder.settle(stop_reason))
    _, raw = tr.stop()
    closing.append(
        MessageComplete(
            message_id=req.message_id,
            stop_reason=stop_reason,
            final_content=builder.final_content(),
            usage=tr.usage(partial=True),
            latency_ms=_ms(t0),
            first_token_ms=first_token_ms,
            attempts=attempt,
            provider_stop_reason=raw,
        )
    )
    return closing


async def drive_stream(spec: CallSpec, req: LLMRequest) -> AsyncIterator[StreamEvent]:
    """Run attempts until one yields content, then stream it."""
    guard = CancelGuard(req.cancel)
    attempt = 0
    try:
        while True:
            attempt += 1
            await req.hooks.attempt_started(attempt)
            t0 = perf_counter()
            builder = ContentBuilder(req.message_id, req.tool_ids)
            tr = spec.translator(req, builder)
            started = False
            first_token_ms: int | None = None
            handle: WireStream | None = None
            out: list[StreamEvent] = []
            try:
                _refuse_an_unusable_key(spec, req)
                handle = await guard.run(spec.open_stream(req))
                iterator = handle.__aiter__()
                cancelled, feed = req.cancel.is_set, tr.feed  # looked up once, used per event
                while not tr.done:
                    batch = await guard.next(iterator)
                    if batch is _END:
                        tr.end_of_body()
                        break
                    # One network chunk's events, each fed and delivered before the next: a
                    # cancel or a failing event then lands between two events exactly as it
                    # would with one event per read, and the content built so far is always
                    # what was delivered.
                    for event in batch:  # type: ignore[attr-defined]
                        if cancelled():
                            raise CancelRequested
                        feed(event, out)
                        if started:
                            if out:
                                for item in out:
                                    yield item
                                out.clear()
                        elif builder.started or tr.done:
                            started = True
                            first_token_ms = _ms(t0)
                            yield MessageStart(message_id=req.message_id, model=req.model)
                            for item in out:
                                yield item
                            out.clear()
                        if tr.done:
                            break
                if not started:
                    started = True
                    first_token_ms = _ms(t0)
                    yield MessageStart(message_id=req.message_id, model=req.model)
                    for item in out:
                        yield item
                stop, raw = tr.stop()
                for end in builder.settle(stop):
                    yield end
                yield MessageComplete(
                    message_id=req.message_id,
                    stop_reason=stop,
                    final_content=builder.final_content(),
                    usage=tr.usage(partial=False),
                    latency_ms=_ms(t0),
                    first_token_ms=first_token_ms,
                    attempts=attempt,
                    provider_stop_reason=raw,
                )
                return
            except CancelRequested:
                if not started:
                    err = cancelled_error(req, spec.provider_name, attempt)
                    await req.hooks.attempt_failed(attempt, err, False)
                    raise err from None
                for item in _interrupted(
                    req, builder, tr, "cancelled", t0, first_token_ms, attempt
                ):
                    yield item
                return
            except Exception as exc:
                err = _as_provider_error(spec, req, exc)
                err.attempts = attempt
                if not started:
                    await _before_retry(spec, req, guard, attempt, err)
                    continue
                err.after_first_token = True
                for item in _interrupted(req, builder, tr, "error", t0, first_token_ms, attempt):
                    yield item
                log.warning(
                    "provider %s model %s: stream failed after the first token (%s)",
                    spec.provider_name,
                    req.model,
                    err.error_class,
                )
                await req.hooks.attempt_failed(attempt, err, False)
                raise err from None
            finally:
                if handle is not None:
                    await _close_quietly(handle)
    finally:
        guard.close()


async def drive_complete(
    spec: CallSpec,
    req: LLMRequest,
    call: Callable[[LLMRequest], Awaitable[Any]],
    parse: Callable[
        [LLMRequest, Any], tuple[list[ContentBlock], StopReason, str | None, TokenUsage]
    ],
) -> LLMResult:
    """The non-streaming twin of `drive_stream`: same retries, hooks and cancel handling."""
    guard = CancelGuard(req.cancel)
    attempt = 0
    try:
        while True:
            attempt += 1
            await req.hooks.attempt_started(attempt)
            t0 = perf_counter()
            try:
                _refuse_an_unusable_key(spec, req)
                response = await guard.run(call(req))
                content, stop, raw, usage = parse(req, response)
                latency = _ms(t0)
                return LLMResult(
                    final_content=content,
                    stop_reason=stop,
                    usage=usage,
                    latency_ms=latency,
                    first_token_ms=latency,
                    attempts=attempt,
                    provider_stop_reason=raw,
                )
            except CancelRequested:
                err = cancelled_error(req, spec.provider_name, attempt)
                await req.hooks.attempt_failed(attempt, err, False)
                raise err from None
            except Exception as exc:
                err = _as_provider_error(spec, req, exc)
                err.attempts = attempt
                await _before_retry(spec, req, guard, attempt, err)
    finally:
        guard.close()
