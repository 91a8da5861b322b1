"""TurnService: accept a turn (validate → claim the slot → route → commit → start), cancel it,
and release it at its end.

`submit` is a pipeline of named steps over one `TurnRequest`; what differs between surfaces
(AAP's suspended tool calls and its own rows) is the request's `strategy`, not flags. The
in-flight check and the registration of the turn happen in one synchronous step with no await
between them, so of any number of concurrent submits exactly one is accepted. The service owns
every turn task: it starts the runner, takes its outcome, then flushes and frees the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from metis.config import LimitsSettings
from metis.core.canonical.content import ImageBlock, parse_user_content, text_of
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.jsontext import canonical_json
from metis.core.canonical.messages import Message
from metis.core.canonical.times import now_us
from metis.core.canonical.tools import ToolDefinition
from metis.core.confirmations import ConfirmationBroker
from metis.core.eager import start_eagerly
from metis.core.errors import (
    SessionAlreadyEnded,
    SessionNotFound,
    SurfaceMismatch,
    TurnAlreadyCompleted,
    TurnInFlight,
    TurnNotFound,
)
from metis.core.events.bus import EventBus
from metis.core.events.costs import CostAccumulator
from metis.core.events.envelope import Event
from metis.core.models.registry import ModelRegistry
from metis.core.routing.alias import OverrideResolution, resolve_override
from metis.core.routing.context import TurnContext, estimate_input_tokens
from metis.core.routing.engine import RoutingEngine
from metis.core.routing.manager import PolicyManager
from metis.core.sessions.cache import CachedSession, SessionCache
from metis.core.sessions.history import Flush, HistoryWriter
from metis.core.sessions.instructions import SessionInstructions
from metis.core.store.sessions import NewTurn, SessionRow, TurnRow
from metis.core.store.store import Store
from metis.core.store.tx import Transaction
from metis.core.tools.dispatcher import ConfirmationPolicy, Dispatcher
from metis.core.tools.policy import SurfaceToolPolicy
from metis.core.turns.control import CancelReason, TurnControl, request_cancel
from metis.core.turns.resume import (
    Answer,
    Resolution,
    ResolutionPlan,
    accept,
    acceptance_rows,
    check_answer_ids,
)
from metis.core.turns.runner import TurnRun, TurnRunner, system_text

log = logging.getLogger(__name__)

__all__ = ["CancelReason", "InteractiveTurn", "TurnAccepted", "TurnRequest", "TurnService"]


@dataclass(frozen=True)
class TurnAccepted:
    """What a submit answers (the 202): the new turn's id, when it was submitted, the stored user
    message and the chosen model."""

    turn_id: str
    session_id: str
    submitted_at_us: int
    user_message_id: str | None
    model: str


class TurnStrategy(Protocol):
    """How a surface's turns differ: their confirmation policy, how the model override is
    read, which pending tool calls they resolve, and the surface's rows in the acceptance
    transaction. `InteractiveTurn` is metis's; `resume.SuspendingTurn` is AAP's."""

    @property
    def confirmation_policy(self) -> ConfirmationPolicy: ...

    @property
    def override_strict(self) -> bool: ...

    def override(
        self, blocks: list[Any], registry: ModelRegistry, field: str | None
    ) -> OverrideResolution: ...

    async def plan(
        self, store: Store, session_id: str, *, max_image_bytes: int
    ) -> ResolutionPlan | None: ...

    def writes(self, tx: Transaction, inputs: list[Message]) -> None: ...


@dataclass(frozen=True)
class InteractiveTurn:
    """metis's turns: confirmations wait for an answer within the turn; a leading `@alias`
    in the text picks the model (a strict override: unavailable is an error)."""

    confirmation_policy: ConfirmationPolicy = "wait"
    override_strict: bool = True

    def override(
        self, blocks: list[Any], registry: ModelRegistry, field: str | None
    ) -> OverrideResolution:
        """A leading `@alias` in the text picks the model."""
        return resolve_override(blocks, registry, field=field)

    async def plan(
        self, store: Store, session_id: str, *, max_image_bytes: int
    ) -> ResolutionPlan | None:
        """metis turns resolve no pending calls (confirmations wait within the turn)."""
        return None

    def writes(self, tx: Transaction, inputs: list[Message]) -> None:
        """metis adds no rows of its own."""
        return None


@dataclass(frozen=True)
class TurnRequest:
    """One turn as a surface asks for it."""

    session_id: str
    content: Any = None  # the user's content (JSON); None for a resolution
    per_message_override: str | None = None
    surface: str = "metis"
    surface_policy: SurfaceToolPolicy | None = None
    application_tools: tuple[ToolDefinition, ...] = ()
    strategy: TurnStrategy = field(default_factory=InteractiveTurn)


class SessionGate(Protocol):
    """What submitting a turn asks of the session lifecycle (SessionService)."""

    async def require_active(self, session_id: str) -> SessionRow: ...

    def is_ending(self, session_id: str) -> bool: ...

    async def refusal(self, session_id: str) -> SessionAlreadyEnded | SessionNotFound: ...


@dataclass(frozen=True)
class _Input:
    """The request's input once parsed: content blocks (none for a resolution), the model
    override, and the matched answers of a resolution."""

    blocks: list[Any]
    override: str | None
    plan: ResolutionPlan | None


@dataclass(frozen=True)
class _Facts:
    """What routing is told about the turn, read before the synchronous step."""

    session: CachedSession
    offered: int
    estimate: int
    floor: int
    has_tool_calls: bool
    cost: Decimal


class TurnService:
    """Accepts, runs (through `runner_for`, a `TurnRunner` per turn) and releases turns."""

    def __init__(
        self,
        *,
        sessions: SessionGate,
        control: TurnControl,
        policy: PolicyManager,
        engine: RoutingEngine,
        limits: LimitsSettings,
        store: Store,
        registry: ModelRegistry,
        session_cache: SessionCache,
        history: HistoryWriter,
        dispatcher: Dispatcher,
        costs: CostAccumulator,
        bus: EventBus,
        broker: ConfirmationBroker,
        flush: Flush,
        instructions: SessionInstructions,
        runner_for: Callable[[TurnRun], TurnRunner],
    ) -> None:
        self._sessions = sessions
        self._control = control
        self._slots = control.slots
        self._policy = policy
        self._engine = engine
        self._limits = limits
        self._store = store
        self._registry = registry
        self._session_cache = session_cache
        self._history = history
        self._dispatcher = dispatcher
        self._costs = costs
        self._bus = bus
        self._broker = broker
        self._flush = flush
        self._instructions = instructions
        self._runner_for = runner_for
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()

    # -- submission ---------------------------------------------------------------------------

    async def submit(self, request: TurnRequest) -> TurnAccepted:
        """Accept a turn: every check before the slot is claimed, then claim, route, commit,
        announce and start — each a step below."""
        row = await self._session_of(request)
        turn_input = await self._parse(request)
        facts = await self._facts(request, row, turn_input)
        await self._wait_for_release(request.session_id)
        try:
            run = self._claim_and_route(request, row, turn_input, facts)  # no await inside
        except _Refused:
            raise await self._sessions.refusal(request.session_id) from None
        # The 202 acknowledges the turn: its rows and its turn.started commit together before
        # it, as a 201 or a 200 acknowledges its event, so a crash after it never leaves a turn
        # without a start. The runner starts after, so the turn is still at its first step
        # when submit returns. Started eagerly: it usually commits without waiting.
        accepting = start_eagerly(self._accept(request, run, turn_input))
        try:
            turn = await asyncio.shield(accepting)
        except asyncio.CancelledError:
            # The caller is gone, the acceptance is not: once committed, the turn runs (it
            # holds the slot), as if the caller had stayed.
            accepting.add_done_callback(functools.partial(self._accepted_meanwhile, run))
            raise
        except BaseException:
            self._slots.release(run.slot)
            raise
        self._start(run)
        return TurnAccepted(
            run.turn_id, request.session_id, turn.started_at_us, turn.user_message_id, turn.model
        )

    def _accepted_meanwhile(self, run: TurnRun, accepting: asyncio.Future[NewTurn]) -> None:
        """The end of an acceptance whose caller was cancelled: start the committed turn, or
        free the slot of a refused one."""
        if accepting.cancelled() or accepting.exception() is not None:
            self._slots.release(run.slot)
        else:
            self._start(run)

    async def _session_of(self, request: TurnRequest) -> SessionRow:
        """An active session of the requesting surface."""
        row = await self._sessions.require_active(request.session_id)
        if row.surface != request.surface:
            raise SurfaceMismatch(
                f"session {request.session_id} belongs to the {row.surface} surface", row.surface
            )
        return row

    async def _parse(self, request: TurnRequest) -> _Input:
        """The pending tool calls decide the turn's kind (a resolution answers them), then
        the content and the model override."""
        limit = self._limits.max_image_bytes
        if request.strategy.confirmation_policy == "suspend":
            await self._wait_for_release(request.session_id)  # a suspended turn's rows flushed
        plan = await request.strategy.plan(self._store, request.session_id, max_image_bytes=limit)
        blocks = parse_user_content(request.content, max_image_bytes=limit) if plan is None else []
        resolved = request.strategy.override(blocks, self._registry, request.per_message_override)
        return _Input(resolved.content, resolved.override, plan)

    async def _facts(self, request: TurnRequest, row: SessionRow, turn_input: _Input) -> _Facts:
        await self._policy.ensure_current()
        session = await self._session_cache.get(request.session_id)
        offered = self._dispatcher.offered(
            request.surface_policy,
            request.application_tools,
            confirmation_policy=request.strategy.confirmation_policy,
        )
        blocks = turn_input.blocks
        # sized as the runner will send it: project instructions and seeded ones included
        instructions = await self._instructions.reader.read(row.workspace_path)
        stable, volatile = system_text(session.history, instructions, row.workspace_path)
        prompt = f"{stable}\n{volatile}"
        return _Facts(
            session=session,
            offered=len(offered),
            estimate=estimate_input_tokens(
                system_prompt=prompt, tools=offered, history=session.history, new_content=blocks
            ),
            floor=estimate_input_tokens(system_prompt=prompt, tools=offered, new_content=blocks),
            has_tool_calls=session.has_tool_calls(),
            cost=self._costs.session(request.session_id).cost,
        )

    def _claim_and_route(
        self, request: TurnRequest, row: SessionRow, turn_input: _Input, facts: _Facts
    ) -> TurnRun:
        """One synchronous step: claim the slot, mint the turn id, decide the route. A failed
        decision is announced (`route.decided` without a turn) and the slot released."""
        session_id = request.session_id
        if self._sessions.is_ending(session_id):  # ended or purged while this submit awaited
            raise _Refused(session_id)
        current = self._slots.get(session_id)
        if current is not None:
            raise TurnInFlight(session_id, current.turn_id)
        turn_id = new_ulid()
        slot = self._slots.claim(session_id, turn_id)
        assert slot is not None
        blocks = turn_input.blocks
        ctx = TurnContext(
            session_id=session_id,
            turn_id=turn_id,
            turn_index=row.turn_count + 1,
            workspace_path=row.workspace_path,
            message_text=text_of(blocks),
            image_count=sum(isinstance(b, ImageBlock) for b in blocks),
            tools_offered=facts.offered,
            has_tool_calls_in_history=facts.has_tool_calls,
            tool_use_in_progress=turn_input.plan is not None,  # the results arrive in this turn
            session_cost_usd=facts.cost,
            per_message_override=turn_input.override,
            override_strict=request.strategy.override_strict,
            sticky_model=row.active_model,
            estimated_input_tokens=facts.estimate,
            compactable_tokens=facts.estimate - facts.floor,
        )
        decision = self._engine.decide(ctx)
        if not decision.ok:
            self._bus.emit(session_id, "route.decided", decision.event_payload(), actor="system")
            self._slots.release(slot)
            raise decision.routing_failed()
        return TurnRun(
            session_id=session_id,
            turn_id=turn_id,
            slot=slot,
            session=facts.session,
            workspace=row.workspace_path,
            decision=decision,
            turn_started_event_id="",
            route_event_id="",
            confirmation_policy=request.strategy.confirmation_policy,
            surface_policy=request.surface_policy,
            application_tools={t.name: t for t in request.application_tools},
        )

    async def _accept(self, request: TurnRequest, run: TurnRun, turn_input: _Input) -> NewTurn:
        """The acceptance transaction: the turn row with its inputs (a user message, or the
        answers of a resolution), settled calls and the surface's rows, and the events
        announcing the turn (`_announce`), all or nothing. A refused acceptance (a call
        answered meanwhile, the store failing) raises, and its events are never shown."""
        assert run.decision.chosen_model is not None
        stamp = now_us()
        resolution: Resolution | None = None
        user_message_id: str | None = None
        if turn_input.plan is not None:  # a resolution stores the answers instead
            resolution = accept(turn_input.plan, run.session_id, run.turn_id)
            inputs = resolution.messages
        else:
            user_message_id = new_ulid()
            inputs = [
                Message(
                    id=user_message_id,
                    session_id=run.session_id,
                    turn_id=run.turn_id,
                    role="user",
                    content=turn_input.blocks,
                    created_at_us=stamp,
                )
            ]
        turn = NewTurn(
            id=run.turn_id,
            session_id=run.session_id,
            trigger="tool_resolution" if resolution is not None else "user_message",
            user_message_id=user_message_id,
            resumes_turn_id=resolution.resumes_turn_id if resolution is not None else None,
            model=run.decision.chosen_model,
            confirmation_policy=request.strategy.confirmation_policy,
            surface=request.surface,
            started_at_us=stamp,
        )
        writes = request.strategy.writes
        resuming = self._session_cache.needs_resume_event(run.session_id)
        try:
            await self._history.commit_with(
                run.session_id,
                inputs,
                lambda tx: acceptance_rows(tx, turn, inputs, resolution, writes),
                announce=lambda: self._announce(request, run, turn_input, turn, resuming),
            )
        except BaseException:
            if resuming:
                self._session_cache.resume_not_announced(run.session_id)
            raise
        run.resolution = resolution
        return turn

    def _announce(
        self,
        request: TurnRequest,
        run: TurnRun,
        turn_input: _Input,
        turn: NewTurn,
        resuming: bool,
    ) -> None:
        """`session.resumed` (first turn after a restart), `turn.started`, `route.decided`."""
        bus, session_id = self._bus, run.session_id
        if resuming:
            bus.emit(
                session_id,
                "session.resumed",
                {"last_seq": bus.last_seq(session_id)},
                actor="system",
            )
        plan = turn_input.plan
        content_json = (
            plan.fingerprint()
            if plan is not None
            else canonical_json([b.model_dump(mode="json") for b in turn_input.blocks]).encode()
        )
        started: Event | None = bus.emit(
            session_id,
            "turn.started",
            {
                "trigger": turn.trigger,
                "user_message_id": turn.user_message_id,
                "resumes_turn_id": turn.resumes_turn_id,
                "model": turn.model,
                "per_message_override": turn_input.override,
                "content_sha256": hashlib.sha256(content_json).hexdigest(),
                "content_bytes": len(content_json),
                "has_images": any(isinstance(b, ImageBlock) for b in turn_input.blocks),
                "estimated_input_tokens": run.decision.estimated_input_tokens,
                "confirmation_policy": turn.confirmation_policy,
            },
            actor="user",
            turn_id=run.turn_id,
        )
        routed = bus.emit(
            session_id,
            "route.decided",
            run.decision.event_payload(),
            actor="system",
            turn_id=run.turn_id,
            parent_event_id=started.id if started else None,
        )
        run.turn_started_event_id = started.id if started else ""
        run.route_event_id = routed.id if routed else ""

    def _start(self, run: TurnRun) -> None:
        self._tasks[run.turn_id] = asyncio.get_running_loop().create_task(
            self._run(run), name=f"turn:{run.turn_id}"
        )

    async def _run(self, run: TurnRun) -> None:
        """The turn task: the runner to its terminal event, then the release (this service
        alone frees slots)."""
        try:
            await self._runner_for(run)()
        finally:
            await self._release(run)

    async def _wait_for_release(self, session_id: str) -> None:
        """A turn that already emitted its terminal event only awaits its flush: wait for it."""
        slot = self._slots.get(session_id)
        if slot is not None and slot.terminal_emitted:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.released.wait(), self._limits.turn_release_wait_s)

    async def _release(self, run: TurnRun) -> None:
        """End of a turn: flush its events, apply a queued model swap, free the slot."""
        try:
            await self._flush()
            await self._store.sessions.apply_pending_and_release(
                run.session_id, now_us(), lambda: self._slots.release(run.slot)
            )
        except Exception:
            log.exception("releasing turn %s failed", run.turn_id)
            self._slots.release(run.slot)
        finally:
            self._tasks.pop(run.turn_id, None)

    # -- AAP's checks before content ----------------------------------------------------------

    async def check_answers(self, session_id: str, answers: Sequence[Answer] | None) -> None:
        """The answers judged against the pending calls by id and kind, before the surface
        parses their content. While a turn holds the slot its calls are not settled (their
        rows are flushed at release): that judgement is left to `submit`, which waits."""
        if self._slots.get(session_id) is not None:
            return
        await check_answer_ids(self._store, session_id, answers)

    # -- reads --------------------------------------------------------------------------------

    def current_turn_id(self, session_id: str) -> str | None:
        """The turn holding the session's slot (until its events are flushed), if any."""
        slot = self._slots.get(session_id)
        return slot.turn_id if slot is not None else None

    async def require_turn(self, session_id: str, turn_id: str) -> TurnRow:
        """The turn `turn_id` of this session, or `TurnNotFound` (unknown, or another
        session's): the one ownership check for cancels and confirmation answers."""
        turn = await self._store.sessions.turn(turn_id) if len(turn_id) == 26 else None
        if turn is None or turn.session_id != session_id:
            raise TurnNotFound(turn_id)
        return turn

    async def settled(self, session_id: str, turn_id: str, timeout_s: float) -> bool:
        """Wait until `turn_id` has released its slot (its events flushed): False on timeout."""
        slot = self._slots.get(session_id)
        if slot is None or slot.turn_id != turn_id:
            return True
        try:
            await asyncio.wait_for(slot.released.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    # -- cancellation -------------------------------------------------------------------------

    async def cancel(
        self, session_id: str, turn_id: str, reason: CancelReason = "user_cancel"
    ) -> bool:
        """The REST/WebSocket cancel: True if this call moved the turn to `cancelling`."""
        await self._sessions.require_active(session_id)
        turn = await self.require_turn(session_id, turn_id)
        slot = self._slots.get(session_id)
        if slot is None or slot.turn_id != turn_id:
            status = turn.status if turn.status != "running" else "completing"
            raise TurnAlreadyCompleted(turn_id, status)
        if slot.outcome is not None:  # ended; only its flush is pending
            raise TurnAlreadyCompleted(turn_id, slot.outcome)
        if slot.status == "completing":
            raise TurnAlreadyCompleted(turn_id, "completing")
        moved = request_cancel(slot, reason)
        if moved:
            await self._broker.withdraw_turn(turn_id)
        return moved

    request_cancel = staticmethod(request_cancel)

    def cancel_soon(self, session_id: str, turn_id: str | None, reason: CancelReason) -> None:
        """A synchronous cancel request (safe from hub callbacks) for `turn_id` if it still
        holds the session's slot; its open confirmations are withdrawn in the background.
        Repeats are no-ops."""
        slot = self._slots.get(session_id)
        if turn_id is None or slot is None or slot.turn_id != turn_id:
            return
        if request_cancel(slot, reason):
            task = asyncio.get_running_loop().create_task(self._broker.withdraw_turn(turn_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def cancel_and_wait(self, session_id: str, reason: CancelReason) -> None:
        """Cancel the session's turn, if any, and wait until it released its slot."""
        await self._control.cancel_and_wait(session_id, reason)

    async def cancel_all(self, reason: CancelReason) -> None:
        """Shutdown: cancel every running turn and wait for their terminal events."""
        await asyncio.gather(
            *(self.cancel_and_wait(s.session_id, reason) for s in self._slots.all())
        )

    def abort_all(self) -> None:
        """Past the shutdown grace: cancel every turn task without waiting."""
        for task in self._tasks.values():
            task.cancel()

    async def wait_all(self) -> None:
        """Tests and shutdown: wait until every turn task has finished."""
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def active_count(self) -> int:
        return len(self._slots)

    def active_sessions(self) -> set[str]:
        """Sessions with a turn holding their slot (including one whose events are still being
        flushed)."""
        return {s.session_id for s in self._slots.all()}


class _Refused(Exception):
    """Raised from the synchronous step when the session's end began meanwhile; `submit`
    turns it into the session service's refusal (which needs an await)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.session_id = session_id
