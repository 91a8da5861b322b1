"""TurnRunner: the agent loop of one turn (docs/architecture.md, "The path of one turn", step 2).

call the model (streaming every delta through the session's ordered channel) → commit the
assistant message → `llm.call_completed` → dispatch tool calls → loop, until the model ends its
turn, a cancel lands, a provider error ends it, or the loop limit is hit. Every path ends with
exactly one terminal turn event, after every layer has emitted its own closing events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from metis.config import LimitsSettings
from metis.core.canonical.content import TextBlock, ThinkingBlock, ToolUseBlock, interrupted_form
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message, MessageMetadata
from metis.core.canonical.redaction import redact
from metis.core.canonical.times import now_us
from metis.core.canonical.tools import ToolDefinition
from metis.core.canonical.usage import Usage, compute_cost
from metis.core.confirmations import ConfirmationBroker
from metis.core.events.bus import EventBus
from metis.core.events.costs import CostAccumulator, Totals
from metis.core.events.hub import SessionHub
from metis.core.models.registry import ModelRegistry
from metis.core.models.types import ModelEntry
from metis.core.providers.base import LLMRequest, MessageComplete, StreamEvent
from metis.core.providers.errors import ProviderError
from metis.core.routing.availability import (
    Availability,
    key_refused_message,
    retry_after_message,
    unsendable_key,
)
from metis.core.routing.context import prompt_size
from metis.core.routing.engine import RouteDecision
from metis.core.sessions.cache import CachedSession
from metis.core.sessions.history import Flush, HistoryWriter
from metis.core.sessions.instructions import ProjectInstructions, SessionInstructions
from metis.core.store.events import EventStore
from metis.core.store.messages import NewToolCall
from metis.core.tools.dispatcher import (
    ConfirmationPolicy,
    Dispatcher,
    TurnTools,
    input_fingerprint,
)
from metis.core.tools.policy import SurfaceToolPolicy
from metis.core.tools.sandbox import Sandboxes
from metis.core.turns.context import (
    DROPPED_NOTE,
    SYSTEM_PROMPT,
    assemble,
    compact,
    count_observed,
    overflow_observed,
    scaled_budget,
    workspace_facts,
)
from metis.core.turns.control import request_cancel
from metis.core.turns.prefix_cache import PrefixCache
from metis.core.turns.resume import Resolution, close_unanswered, run_resolution
from metis.core.turns.slots import TurnSlot

log = logging.getLogger(__name__)

FAILOVER_CLASSES = frozenset({"rate_limit", "server_error", "network", "auth"})
LLM_STOP_REASONS = frozenset({"end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"})


@dataclass
class TurnRun:
    """Everything one running turn holds; created by TurnService before the 202."""

    session_id: str
    turn_id: str
    slot: TurnSlot
    session: CachedSession
    workspace: str
    decision: RouteDecision
    turn_started_event_id: str
    route_event_id: str
    confirmation_policy: ConfirmationPolicy = "wait"
    surface_policy: SurfaceToolPolicy | None = None
    application_tools: dict[str, ToolDefinition] = field(default_factory=dict)
    started_monotonic: float = field(default_factory=time.monotonic)
    resolution: Resolution | None = None  # a tool_resolution turn (metis/core/turns/resume.py)


_seeded_texts: PrefixCache[tuple[str, ...]] = PrefixCache()
"""The seeded texts of recent histories: every call looks for them, and a history only grows."""


def with_seeded_instructions(prompt: str, history: Sequence[Message]) -> str:
    """System messages imported into a session (AAP seed history) extend the daemon's prompt.

    Context assembly never sends `system` messages as messages, so without this a client's
    seeded instructions would never reach the model.
    """

    def more(texts: tuple[str, ...] | None, rest: Sequence[Message]) -> tuple[str, ...]:
        found = [
            "".join(b.text for b in m.content if isinstance(b, TextBlock))
            for m in rest
            if m.role == "system"
        ]
        return (*(texts or ()), *(text for text in found if text))

    seeded = _seeded_texts.extend(history, more)
    return "\n\n".join([prompt, *seeded]) if seeded else prompt


def with_project_instructions(prompt: str, instructions: ProjectInstructions | None) -> str:
    """The workspace's AGENTS.md / CLAUDE.md (metis/core/sessions/instructions.py) after the prompt."""
    return f"{prompt}\n\n{instructions.prompt_section()}" if instructions is not None else prompt


def system_text(
    history: Sequence[Message], instructions: ProjectInstructions | None, workspace: str
) -> tuple[str, str]:
    """(stable, volatile): the system text a model call is sent. Routing sizes a turn by it
    too, so that a long instruction file counts before a model is chosen, not only after."""
    stable = with_project_instructions(
        with_seeded_instructions(SYSTEM_PROMPT, history), instructions
    )
    return stable, workspace_facts(workspace)


@dataclass(frozen=True, slots=True)
class CallContext:
    """What one model call is sent besides its tools, fitted to the model's window."""

    stable: str  # the system prompt's part that stays the same from call to call (cacheable)
    volatile: str  # the part that changes: date and workspace listing
    messages: list[Message]  # the history, assembled and compacted
    estimate: int  # input tokens of the whole request
    max_output_tokens: int
    left_out: int = 0  # the history's earliest messages not sent
    omitted: int = 0  # sent messages whose tool results became the placeholder


def call_context(
    history: Sequence[Message],
    instructions: ProjectInstructions | None,
    workspace: str,
    entry: ModelEntry,
    limits: LimitsSettings,
    offered: Sequence[ToolDefinition],
    scale: float = 1.0,
) -> CallContext:
    """The next model call's context. The runner sends it; the context view (AAP's compacted
    history) shows it, so both read it here rather than each composing the prompt and budget.
    `scale`: the tokens the model's provider counts per estimated one (`count_observed`)."""
    caps = entry.capabilities
    max_out = min(caps.max_output_tokens, limits.max_output_tokens_per_call)
    stable, volatile = system_text(history, instructions, workspace)
    assembled = assemble(history)
    budget = scaled_budget(caps.max_context_tokens - max_out, scale)
    prompt = prompt_size(system_prompt=f"{stable}\n{volatile}", tools=offered)
    messages, estimate = compact(assembled, budget, prompt)
    if len(messages) < len(assembled):  # earlier exchanges left out: the model is told
        volatile = f"{volatile}\n{DROPPED_NOTE}"
        prompt = prompt_size(system_prompt=f"{stable}\n{volatile}", tools=offered)
        messages, estimate = compact(assembled, budget, prompt)
    if messages is assembled:  # compaction hands back the list itself when all of it fits
        return CallContext(stable, volatile, messages, estimate, max_out)
    left_out = len(assembled) - len(messages)
    # the rest is sent as it is, but for the messages whose tool results it blanked
    sent = zip(messages, assembled[left_out:], strict=True)
    omitted = sum(message is not original for message, original in sent)
    return CallContext(stable, volatile, messages, estimate, max_out, left_out, omitted)


def failure_message(registry: ModelRegistry, error: ProviderError) -> str:
    """The turn's failure text: a refused key says which provider and variable, then what the
    provider answered (already scrubbed of the key by the adapter); a provider that said when to
    come back (`retry-after`), when."""
    retry_after = retry_after_message(error.error_class, error.retry_after_s)
    if retry_after is not None:
        return f"{error.message} ({retry_after})"
    if error.error_class != "auth" or unsendable_key(registry, error.provider) is not None:
        return error.message  # a key that could not be sent: the provider said nothing
    explained = key_refused_message(
        registry, error.provider, error.http_status, error.provider_error
    )
    # the provider's own words only: its status and code are in the sentence already
    said = error.provider_said
    return f"{explained} (provider said: {said})" if said else explained


class _Hooks:
    """Turns the adapter's per-attempt callbacks into llm.call_started / llm.call_failed."""

    def __init__(
        self,
        runner: TurnRunner,
        request_id: str,
        message_id: str,
        entry: ModelEntry,
        fitted: CallContext,
        failover_from: str | None,
    ) -> None:
        self.runner, self.request_id, self.message_id = runner, request_id, message_id
        self.entry, self.fitted = entry, fitted
        self.failover_from = failover_from  # said by the first attempt only
        self.attempt = 0
        self.started_at = 0.0

    async def attempt_started(self, attempt: int) -> None:
        self.attempt, self.started_at = attempt, time.monotonic()
        self.runner.emit_llm(
            "llm.call_started",
            {
                "request_id": self.request_id,
                "attempt": attempt,
                "message_id": self.message_id,
                "model": self.entry.id,
                "provider": self.entry.provider,
                "estimated_input_tokens": self.fitted.estimate,
                "max_output_tokens": self.fitted.max_output_tokens,
                "failover_from": self.failover_from if attempt == 1 else None,
                "messages_left_out": self.fitted.left_out,
                "tool_results_omitted": self.fitted.omitted,
            },
        )

    async def attempt_failed(self, attempt: int, error: ProviderError, will_retry: bool) -> None:
        """Called for every failed attempt, a mid-stream failure included (after its
        `message.complete{error}`): the partial message is committed before the event."""
        usage = None
        partial = self.runner.partial_error
        if error.after_first_token and partial is not None:
            await self.runner.commit_assistant(self.entry, partial, "error")
            usage = self.runner.price(self.entry, partial)
        self.runner.emit_call_failed(self, error, will_retry=will_retry, usage=usage)


class TurnRunner:
    """One turn's loop over the collaborators it calls: the model (registry, availability,
    limits), the tools (dispatcher, sandboxes, broker), the session's history and live
    channel (history writer, bus, hub), its spend (costs) and its project instructions."""

    def __init__(
        self,
        run: TurnRun,
        *,
        limits: LimitsSettings,
        registry: ModelRegistry,
        availability: Availability,
        bus: EventBus,
        hub: SessionHub,
        costs: CostAccumulator,
        history: HistoryWriter,
        dispatcher: Dispatcher,
        sandboxes: Sandboxes,
        broker: ConfirmationBroker,
        instructions: SessionInstructions,
        events: EventStore,
        flush: Flush,
    ) -> None:
        self.run = run
        self._limits = limits
        self._registry = registry
        self._availability = availability
        self._bus = bus
        self._hub = hub
        self._costs = costs
        self._history = history
        self._dispatcher = dispatcher
        self._sandboxes = sandboxes
        self._broker = broker
        self._instructions = instructions
        self._events = events
        self._flush = flush
        self.last_llm_event_id: str = run.route_event_id
        self._locked = False  # a token streamed or a tool ran: no more failover
        self.partial_error: MessageComplete | None = None
        self._priced: tuple[MessageComplete, Usage] | None = None  # see price()
        self.instructions: ProjectInstructions | None = None  # read when the loop starts
        self._ended_totals: Totals | None = None  # set by `_end`, for `_not_ended`

    # -- event helpers ------------------------------------------------------------------------

    def emit(self, event_type: str, payload: Any, *, actor: str, parent: str | None) -> str | None:
        """Emit an event of this turn; returns its id (None if the bus dropped it) for use as a
        parent."""
        event = self._bus.emit(
            self.run.session_id,
            event_type,
            payload,
            actor=actor,
            turn_id=self.run.turn_id,
            parent_event_id=parent,
        )
        return event.id if event else None

    def emit_llm(self, event_type: str, payload: dict[str, Any]) -> None:
        """Emit an `llm.*` event chained to the previous one of the turn."""
        event_id = self.emit(event_type, payload, actor="agent", parent=self.last_llm_event_id)
        if event_id:
            self.last_llm_event_id = event_id

    def emit_call_failed(
        self, hooks: _Hooks, error: ProviderError, *, will_retry: bool, usage: Usage | None = None
    ) -> None:
        """`llm.call_failed` for an attempt, with its redacted message and whatever usage it had
        produced."""
        usage = usage or Usage(pricing_version=self._registry.pricing_version)
        self.emit_llm(
            "llm.call_failed",
            {
                "request_id": hooks.request_id,
                "attempt": max(hooks.attempt, 1),
                "message_id": hooks.message_id,
                "model": hooks.entry.id,
                "provider": hooks.entry.provider,
                "error_class": error.error_class,
                "message": redact(error.message, limit=2000),
                "provider_status": error.http_status,
                "retryable": error.retryable,
                "will_retry": will_retry,
                "retry_in_s": round(error.retry_in_s, 1)
                if will_retry and error.retry_in_s is not None
                else None,
                "latency_ms": int((time.monotonic() - hooks.started_at) * 1000)
                if hooks.started_at
                else 0,
                **usage_fields(usage),
            },
        )

    # -- the loop -----------------------------------------------------------------------------

    async def __call__(self) -> str:
        """Run the turn to its terminal event; returns its outcome (completed, cancelled,
        failed). Releasing the slot is the caller's (TurnService), once this returns."""
        limit = self._limits.turn_timeout_s
        timer = (
            asyncio.get_running_loop().call_later(limit, self._time_out)
            if limit is not None
            else None
        )
        try:
            await self._loop()
        except Exception:
            log.exception(
                "turn %s of %s failed unexpectedly", self.run.turn_id, self.run.session_id
            )
            if not self.run.slot.terminal_emitted:
                self._end(
                    "turn.failed",
                    {"reason": "internal_error", "error_class": None, "message": "internal error"},
                )
        finally:
            if timer is not None:
                timer.cancel()
        return self.run.slot.outcome or "failed"

    def _time_out(self) -> None:
        """The configured turn time limit: the same cancel path as a user's, reason `timeout`."""
        if request_cancel(self.run.slot, "timeout"):
            log.warning("turn %s reached its time limit; cancelling", self.run.turn_id)

    def _cancelled(self) -> bool:
        return self.run.slot.cancel_event.is_set()

    async def _loop(self) -> None:
        model = self.run.decision.chosen_model
        assert model is not None
        fallbacks = list(self.run.decision.fallbacks)
        failover_from: str | None = None  # the model the next call takes over from
        refitted = False  # a call refused as too long was fitted again (once per turn)
        calls = 0
        dispatcher = self._dispatcher
        offered = dispatcher.offered(
            self.run.surface_policy, list(self.run.application_tools.values())
        )
        limit = self._limits.max_llm_calls_per_turn
        self.instructions = await self._instructions.for_turn(
            self.run.session_id, self.run.turn_id, self.run.workspace, self.run.route_event_id
        )
        if self.run.resolution is not None:  # suspend/resume: answers first, then the loop
            await run_resolution(
                self.run,
                bus=self._bus,
                dispatcher=dispatcher,
                broker=self._broker,
                sandboxes=self._sandboxes,
                events=self._events,
                flush=self._flush,
            )
            # a granted call that ran (`tool.called`) locks the model
            self._locked = self._costs.turn(self.run.turn_id).tool_call_count > 0
        while True:
            if self._cancelled():
                return self._end_cancelled()
            if calls >= limit:
                return self._end(
                    "turn.failed",
                    {
                        "reason": "loop_limit",
                        "error_class": None,
                        "message": f"the turn made {limit} model calls; stopped",
                    },
                )
            calls += 1
            entry = self._registry.get(model)
            assert entry is not None, "routing chooses configured models only"
            outcome = await self._call(entry, offered, failover_from)
            failover_from = None
            if isinstance(outcome, ProviderError):
                if outcome.error_class == "cancelled" or self._cancelled():
                    return self._end_cancelled()
                if outcome.error_class == "context_overflow" and not refitted:
                    # fitted again to the count the refusal implies (`overflow_observed`)
                    refitted = True
                    calls -= 1
                    continue
                self._availability.record_failure(
                    model,
                    outcome.error_class,
                    http_status=outcome.http_status,
                    provider_error=outcome.provider_error,
                    retry_after_s=outcome.retry_after_s,
                )
                next_model = self._failover(outcome, fallbacks)
                if next_model is not None:
                    log.warning(
                        "first call on %s failed (%s); failing over to %s",
                        model,
                        outcome.error_class,
                        next_model,
                    )
                    failover_from, model = model, next_model
                    await self._events.set_turn_model(self.run.turn_id, model)
                    calls -= 1
                    continue
                return self._end(
                    "turn.failed",
                    {
                        "reason": "provider_error",
                        "error_class": outcome.error_class,
                        "message": redact(failure_message(self._registry, outcome), limit=2000),
                    },
                )
            message, complete = outcome
            self._locked = True
            if complete.stop_reason == "cancelled":
                return self._end_cancelled()
            if self.run.slot.terminal_emitted:
                return  # the call announced `turn.completed` with its message (`_call`)
            tool_uses = [b for b in message.content if isinstance(b, ToolUseBlock)]
            if complete.stop_reason != "tool_use":  # its tool uses are answered, never run
                await close_unanswered(
                    self._broker,
                    dispatcher,
                    self.run.session_id,
                    self.run.turn_id,
                    tool_uses,
                    self.last_llm_event_id,
                )
                return self._end("turn.completed", completed_fields(complete))
            turn_tools = TurnTools(
                session_id=self.run.session_id,
                turn_id=self.run.turn_id,
                workspace=self.run.workspace,
                sandbox=self._sandboxes.for_workspace(self.run.workspace),
                confirmation_policy=self.run.confirmation_policy,
                cancel=self.run.slot.cancel_event,
                surface_policy=self.run.surface_policy,
                application_tools=self.run.application_tools,
            )
            batch = await dispatcher.run_batch(
                turn_tools, tool_uses, message_id=message.id, parent_event_id=self.last_llm_event_id
            )
            if self._cancelled():
                if batch.suspended_ids:  # suspend/resume: nothing stays pending after a cancel
                    parked = [b for b in tool_uses if b.id in set(batch.suspended_ids)]
                    await close_unanswered(
                        self._broker, dispatcher, self.run.session_id, self.run.turn_id, parked
                    )
                return self._end_cancelled()
            if batch.suspended_ids:
                return self._end(
                    "turn.completed",
                    {"stop_reason": "tool_use", "pending_tool_use_ids": batch.suspended_ids},
                )

    def _failover(self, error: ProviderError, fallbacks: list[str]) -> str | None:
        """First call only, before any token, for provider-side failures."""
        if self._locked or error.after_first_token or error.error_class not in FAILOVER_CLASSES:
            return None
        while fallbacks:
            candidate = fallbacks.pop(0)
            if (
                self._registry.is_configured(candidate)
                and self._availability.unavailable_scope(candidate) is None
            ):
                return candidate
        return None

    async def _call(
        self, entry: ModelEntry, offered: list[ToolDefinition], failover_from: str | None
    ) -> tuple[Message, MessageComplete] | ProviderError:
        """One logical LLM call (taking over from `failover_from`'s failed one, if named); returns
        the committed assistant message or the error."""
        caps = entry.capabilities
        scales = self.run.session.token_scales
        fitted = call_context(
            self.run.session.history,
            self.instructions,
            self.run.workspace,
            entry,
            self._limits,
            offered,
            scales.get(entry.id, 1.0),
        )
        self.run.session.last_context = fitted.messages
        message_id, request_id = new_ulid(), new_ulid()
        hooks = _Hooks(
            self,
            request_id,
            message_id,
            entry,
            fitted,
            failover_from,
        )
        request = LLMRequest(
            request_id=request_id,
            message_id=message_id,
            model=entry.id,
            wire_model=entry.wire_name,
            capabilities=caps,
            system=fitted.stable,
            system_volatile=fitted.volatile,
            messages=fitted.messages,
            tools=offered if caps.supports_tools else (),
            max_output_tokens=fitted.max_output_tokens,
            tool_ids=self.run.session.tool_ids,
            hooks=hooks,
            cancel=self.run.slot.cancel_event,
        )
        complete: MessageComplete | None = None
        self.partial_error = None
        try:
            # adapters' streams are async generators (they can be closed early)
            events = cast(
                AsyncGenerator[StreamEvent, None],
                self._registry.adapter_for(entry.id).stream(request),
            )
            async with contextlib.aclosing(events) as stream:
                # looked up once, not at every streamed delta
                hub, emit_transient = self._hub, self._bus.emit_transient
                session_id, turn_id = self.run.session_id, self.run.turn_id
                async for event in stream:
                    if hub.pressed:  # a live client's queue is filling: let it catch up
                        await hub.make_room(session_id)
                    if isinstance(event, MessageComplete):
                        complete = event
                        if event.stop_reason == "error":
                            self.partial_error = event
                        self._emit_complete(event, entry)
                    else:
                        self._locked = True
                        emit_transient(
                            session_id,
                            event.type,
                            event.payload(),
                            turn_id=turn_id,
                            parent_event_id=self.last_llm_event_id,
                            typed=True,
                        )
        except ProviderError as error:
            if error.error_class == "context_overflow":
                overflow_observed(scales, entry.id, fitted.estimate, caps.max_context_tokens)
            return error  # the hooks emitted llm.call_failed (after committing any partial)
        assert complete is not None, "adapters end every stream with message.complete"
        budget = caps.max_context_tokens - fitted.max_output_tokens
        count_observed(scales, entry.id, fitted.estimate, budget, complete.usage)
        if complete.stop_reason == "cancelled":
            message = await self.commit_assistant(entry, complete, "cancelled")
            cancelled = ProviderError(
                "cancelled", "cancelled", provider=entry.provider, model=entry.id
            )
            self.emit_call_failed(
                hooks, cancelled, will_retry=False, usage=self.price(entry, complete)
            )
            return message, complete
        # A call that ends the turn (no tool use to run or to close) announces the turn's end
        # with its message: one transaction instead of a commit now and a flush at the release.
        ends_turn = complete.stop_reason != "tool_use" and not any(
            isinstance(b, ToolUseBlock) for b in complete.final_content
        )

        def announce() -> None:
            usage = self.price(entry, complete)
            self.emit_llm(
                "llm.call_completed",
                {
                    "request_id": request_id,
                    "attempt": max(complete.attempts, 1),
                    "message_id": message_id,
                    "model": entry.id,
                    "provider": entry.provider,
                    "stop_reason": llm_stop_reason(complete),
                    **usage_fields(usage),
                    "latency_ms": complete.latency_ms,
                    "first_token_ms": complete.first_token_ms,
                    "tool_use_count": sum(
                        isinstance(b, ToolUseBlock) for b in complete.final_content
                    ),
                    "thinking_block_count": sum(
                        isinstance(b, ThinkingBlock) for b in complete.final_content
                    ),
                },
            )
            if ends_turn:
                self._end("turn.completed", completed_fields(complete))

        try:
            message = await self.commit_assistant(entry, complete, "complete", announce)
        except Exception:
            # Refused: its terminal event, if announced, was never shown. (A cancelled task
            # does not stop the shielded commit, so a cancel undoes nothing.)
            self._not_ended()
            raise
        self._availability.record_success(entry.id)
        return message, complete

    def price(self, entry: ModelEntry, complete: MessageComplete) -> Usage:
        """The call's priced usage; computed once per `message.complete` (the stream event, the
        stored message and `llm.call_*` all report it)."""
        if self._priced is not None and self._priced[0] is complete:
            return self._priced[1]
        tokens = complete.usage
        usage = Usage(
            input_tokens=tokens.input_tokens,
            cache_read_tokens=tokens.cache_read_tokens,
            cache_write_tokens=tokens.cache_write_tokens,
            output_tokens=tokens.output_tokens,
            cost_usd=compute_cost(tokens, entry.pricing),
            pricing_version=self._registry.pricing_version,
            latency_ms=complete.latency_ms,
            estimated=tokens.estimated,
        )
        self._priced = (complete, usage)
        return usage

    def _emit_complete(self, event: MessageComplete, entry: ModelEntry) -> None:
        if (
            event.stop_reason not in ("tool_use", "cancelled", "error")
            and self.run.slot.status == "in_flight"
        ):
            self.run.slot.status = "completing"  # from here a cancel loses
        self._bus.emit_transient(
            self.run.session_id,
            "message.complete",
            {
                "message_id": event.message_id,
                "stop_reason": event.stop_reason,
                "final_content": [b.model_dump(mode="json") for b in event.final_content],
                "usage": self.price(entry, event).wire(),
                "latency_ms": event.latency_ms,
            },
            turn_id=self.run.turn_id,
            parent_event_id=self.last_llm_event_id,
        )

    async def commit_assistant(
        self,
        entry: ModelEntry,
        complete: MessageComplete,
        status: str,
        announce: Callable[[], object] | None = None,
    ) -> Message:
        """Commit the assistant message (and its tool_calls rows) before the event naming it,
        or with the events `announce` emits, in the same transaction."""
        content = (
            list(complete.final_content)
            if status == "complete"
            else interrupted_form(list(complete.final_content))
        )
        if status == "complete" and not content:
            content = [TextBlock(text="")]
        usage = self.price(entry, complete)
        message = Message(
            id=complete.message_id,
            session_id=self.run.session_id,
            turn_id=self.run.turn_id,
            role="assistant",
            content=content,
            created_at_us=now_us(),
            metadata=MessageMetadata(
                status=status,  # type: ignore[arg-type]
                model=entry.id,
                provider=entry.provider,
                routing=self.run.decision.routing_metadata(),
                usage=usage.wire(),
                stop_reason=complete.stop_reason if status == "complete" else None,
            ),
        )
        tool_calls: list[NewToolCall] = []
        for block in content:
            if isinstance(block, ToolUseBlock):
                definition = self.run.application_tools.get(block.name)
                registered = (
                    self._dispatcher.registry.get(block.name) if definition is None else None
                )
                side_effects = definition or (registered.definition if registered else None)
                sha, _ = input_fingerprint(block.input)
                tool_calls.append(
                    NewToolCall(
                        id=block.id,
                        session_id=self.run.session_id,
                        turn_id=self.run.turn_id,
                        message_id=message.id,
                        provider_tool_use_id=self.run.session.tool_ids.provider_id(block.id),
                        name=block.name,
                        side_effects=side_effects.side_effects if side_effects else None,
                        origin="application" if definition is not None else "builtin",
                        input_sha256=sha,
                        created_at_us=message.created_at_us,
                    )
                )
        await self._history.commit(self.run.session_id, [message], tool_calls, announce=announce)
        return message

    # -- endings ------------------------------------------------------------------------------

    def _end_cancelled(self) -> None:
        reason = self.run.slot.cancel_reason or "user_cancel"
        actor = "user" if reason == "user_cancel" else "system"
        self._end("turn.cancelled", {"reason": reason}, actor=actor)

    def _end(self, event_type: str, fields: dict[str, Any], *, actor: str | None = None) -> None:
        if self.run.slot.terminal_emitted:
            return
        wall_ms = int((time.monotonic() - self.run.started_monotonic) * 1000)
        self._ended_totals = self._costs.end_turn(self.run.turn_id)
        default_actor = "agent" if event_type == "turn.completed" else "system"
        self.run.slot.outcome = event_type.removeprefix("turn.")
        self.emit(
            event_type,
            {**self._ended_totals.turn_payload(wall_ms), **fields},
            actor=actor or default_actor,
            parent=self.run.turn_started_event_id,
        )

    def _not_ended(self) -> None:
        """Undo `_end` whose event went with a transaction that failed (never stored, never
        shown): the turn is still running, so the failure path can still end it, with the
        turn's totals."""
        if self._ended_totals is not None:
            self._costs.seed_turn(self.run.turn_id, self._ended_totals)
            self._ended_totals = None
            self.run.slot.outcome = None


def llm_stop_reason(complete: MessageComplete) -> str:
    """The stop reason an `llm.call_completed` or `turn.completed` reports."""
    stop = complete.stop_reason
    return stop if stop in LLM_STOP_REASONS else "end_turn"


def completed_fields(complete: MessageComplete) -> dict[str, Any]:
    """`turn.completed`'s own fields for a turn its last call ended."""
    return {"stop_reason": llm_stop_reason(complete), "pending_tool_use_ids": []}


def usage_fields(usage: Usage) -> dict[str, Any]:
    """The usage part of an `llm.call_completed` or `llm.call_failed` payload."""
    return {
        "input_tokens": usage.input_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "output_tokens": usage.output_tokens,
        "cost_usd": usage.cost_usd,
        "pricing_version": usage.pricing_version,
        "usage_estimated": usage.estimated,
    }
