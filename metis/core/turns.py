"""TurnService: accept a turn (validate → claim the slot → route → commit → start), cancel it,
and release it at its end.

The in-flight check and the registration of the turn happen in one synchronous step with no
await between them, so of any number of concurrent submits exactly one is accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from metis.core.agent import TurnRun, TurnRunner
from metis.core.canonical import (
    ImageBlock,
    Message,
    ToolDefinition,
    ToolUseBlock,
    canonical_json,
    new_ulid,
    now_us,
    parse_user_content,
    text_of,
)
from metis.core.context import SYSTEM_PROMPT
from metis.core.errors import SurfaceMismatch, TurnAlreadyCompleted, TurnInFlight, TurnNotFound
from metis.core.resume import (
    Answer,
    Resolution,
    SurfaceWrites,
    accept,
    commit_turn,
    prepare_resolution,
)
from metis.core.routing.alias import OverrideResolution, resolve_override
from metis.core.routing.context import TurnContext, estimate_input_tokens
from metis.core.store.sessions import NewTurn
from metis.core.tools.policy import SurfaceToolPolicy
from metis.core.tools.results import cancelled_text, failed

log = logging.getLogger(__name__)

CancelReason = Literal["user_cancel", "client_disconnect", "timeout", "server_shutdown"]


@dataclass(frozen=True)
class TurnAccepted:
    turn_id: str
    session_id: str
    submitted_at_us: int
    user_message_id: str | None
    model: str


class TurnService:
    def __init__(self, core: Any) -> None:
        self.core = core
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # -- submission ---------------------------------------------------------------------------

    async def submit(
        self,
        session_id: str,
        content: Any,
        per_message_override: str | None = None,
        *,
        surface: str = "metis",
        confirmation_policy: Literal["wait", "suspend"] = "wait",
        surface_policy: SurfaceToolPolicy | None = None,
        application_tools: tuple[ToolDefinition, ...] = (),
        override_strict: bool = True,
        resolution: Sequence[Answer] | None = None,
        alias_prefix: bool = True,
        surface_writes: SurfaceWrites | None = None,
    ) -> TurnAccepted:
        """Accept a turn. The last three parameters serve the AAP façade (suspend policy):
        `resolution` answers the pending calls of a suspended turn instead of sending
        `content`, `alias_prefix=False` stores the user's text verbatim (the
        model choice comes from `per_message_override` only), and `surface_writes` adds the
        surface's own rows to the acceptance transaction."""
        core = self.core
        row = await core.sessions.require_active(session_id)
        if row.surface != surface:
            raise SurfaceMismatch(
                f"session {session_id} belongs to the {row.surface} surface", row.surface
            )
        # ---- suspend/resume (metis/core/resume.py): pending calls decide the turn's kind -----
        plan = None
        if confirmation_policy == "suspend":
            await self._wait_for_release(session_id)  # a just-suspended turn's rows are flushed
            plan = await prepare_resolution(
                core.store,
                session_id,
                resolution,
                max_image_bytes=core.settings.limits.max_image_bytes,
            )
        elif resolution is not None:
            raise ValueError("a resolution needs the suspend confirmation policy")
        limit = core.settings.limits.max_image_bytes
        blocks = parse_user_content(content, max_image_bytes=limit) if plan is None else []
        if alias_prefix:
            resolved = resolve_override(blocks, core.registry, field=per_message_override)
        else:
            field = resolve_override([], core.registry, field=per_message_override).override
            resolved = OverrideResolution(blocks, field)
        # ---- end of suspend/resume additions ---------------------------------------------------
        blocks = resolved.content
        await core.policy.ensure_current()
        live = await core.live.get(session_id)
        application = {t.name: t for t in application_tools}
        offered = core.dispatcher.offered(
            surface_policy, application_tools, confirmation_policy=confirmation_policy
        )
        text = text_of(blocks)
        images = sum(isinstance(b, ImageBlock) for b in blocks)
        history_has_tools = live.has_tool_calls()
        history = [m.content for m in live.history]
        estimate = estimate_input_tokens(
            system_prompt=SYSTEM_PROMPT, tools=offered, history=history, new_content=blocks
        )
        floor = estimate_input_tokens(
            system_prompt=SYSTEM_PROMPT, tools=offered, new_content=blocks
        )
        cost = core.costs.session(session_id).cost
        await self._wait_for_release(session_id)
        # ---- one synchronous step: claim the slot, mint ids, decide -------------------------
        if core.sessions.is_ending(session_id):  # ended or purged while this submit awaited
            raise await core.sessions.refusal(session_id)
        current = core.slots.get(session_id)
        if current is not None:
            raise TurnInFlight(session_id, current.turn_id)
        turn_id, user_message_id = new_ulid(), new_ulid()
        slot = core.slots.claim(session_id, turn_id)
        assert slot is not None
        ctx = TurnContext(
            session_id=session_id,
            turn_id=turn_id,
            turn_index=row.turn_count + 1,
            workspace_path=row.workspace_path,
            message_text=text,
            image_count=images,
            tools_offered=len(offered),
            has_tool_calls_in_history=history_has_tools,
            tool_use_in_progress=plan is not None,  # the results arrive in this turn
            session_cost_usd=cost,
            per_message_override=resolved.override,
            override_strict=override_strict,
            sticky_model=row.active_model,
            estimated_input_tokens=estimate,
            compactable_tokens=estimate - floor,
        )
        decision = core.engine.decide(ctx)
        # ---- end of the synchronous step ------------------------------------------------------
        if not decision.ok:
            core.bus.emit(session_id, "route.decided", decision.event_payload(), actor="system")
            core.slots.release(slot)
            raise decision.routing_failed()
        assert decision.chosen_model is not None
        stamp = now_us()
        user_message = Message(
            id=user_message_id,
            session_id=session_id,
            turn_id=turn_id,
            role="user",
            content=blocks,
            created_at_us=stamp,
        )
        accepted: Resolution | None = None
        if plan is not None:  # a resolution stores the answers instead of a user message
            accepted = accept(plan, session_id, turn_id)
            user_message_id = None
        inputs = accepted.messages if accepted is not None else [user_message]
        new_turn = NewTurn(
            id=turn_id,
            session_id=session_id,
            trigger="tool_resolution" if accepted is not None else "user_message",
            user_message_id=user_message_id,
            resumes_turn_id=accepted.resumes_turn_id if accepted is not None else None,
            model=decision.chosen_model,
            confirmation_policy=confirmation_policy,
            surface=surface,
            started_at_us=stamp,
        )
        try:
            if accepted is None and surface_writes is None:
                await core.session_store.insert_turn(new_turn, inputs)
            else:
                await commit_turn(core.store, new_turn, inputs, accepted, surface_writes)
        except BaseException:
            core.slots.release(slot)
            raise
        core.live.committed(session_id, *inputs)
        if core.live.needs_resume_event(session_id):
            core.bus.emit(
                session_id,
                "session.resumed",
                {"last_seq": core.bus.last_seq(session_id)},
                actor="system",
            )
        content_json = (
            plan.fingerprint()
            if plan is not None
            else canonical_json([b.model_dump(mode="json") for b in blocks]).encode()
        )
        started = core.bus.emit(
            session_id,
            "turn.started",
            {
                "trigger": new_turn.trigger,
                "user_message_id": user_message_id,
                "resumes_turn_id": new_turn.resumes_turn_id,
                "model": decision.chosen_model,
                "per_message_override": resolved.override,
                "content_sha256": hashlib.sha256(content_json).hexdigest(),
                "content_bytes": len(content_json),
                "has_images": images > 0,
                "estimated_input_tokens": decision.estimated_input_tokens,
                "confirmation_policy": confirmation_policy,
            },
            actor="user",
            turn_id=turn_id,
        )
        routed = core.bus.emit(
            session_id,
            "route.decided",
            decision.event_payload(),
            actor="system",
            turn_id=turn_id,
            parent_event_id=started.id if started else None,
        )
        run = TurnRun(
            session_id=session_id,
            turn_id=turn_id,
            slot=slot,
            live=live,
            workspace=row.workspace_path,
            decision=decision,
            turn_started_event_id=started.id if started else "",
            route_event_id=routed.id if routed else "",
            confirmation_policy=confirmation_policy,
            surface_policy=surface_policy,
            application_tools=application,
            resolution=accepted,
        )
        # The 202 acknowledges the turn: its turn.started is stored before it, as a 201 or a
        # 200 acknowledges its event, so a crash after it never leaves a turn without a start.
        # Before the runner starts, so the turn is still at its first step when submit returns;
        # it starts even if this wait is cancelled: the turn is committed and holds the slot.
        try:
            await core.flush()
        finally:
            self._tasks[turn_id] = asyncio.get_running_loop().create_task(
                TurnRunner(core, run)(), name=f"turn:{turn_id}"
            )
        return TurnAccepted(turn_id, session_id, stamp, user_message_id, decision.chosen_model)

    async def _wait_for_release(self, session_id: str) -> None:
        """A turn that already emitted its terminal event only awaits its flush: wait for it."""
        slot = self.core.slots.get(session_id)
        if slot is not None and slot.terminal_emitted:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    slot.released.wait(), self.core.settings.limits.turn_release_wait_s
                )

    async def release(self, run: TurnRun) -> None:
        """End of a turn: flush its events, apply a queued model swap, free the slot."""
        try:
            await self.core.flush()
            await self.core.session_store.apply_pending_and_release(
                run.session_id, now_us(), lambda: self.core.slots.release(run.slot)
            )
        except Exception:
            log.exception("releasing turn %s failed", run.turn_id)
            self.core.slots.release(run.slot)
        finally:
            self._tasks.pop(run.turn_id, None)

    # -- cancellation -------------------------------------------------------------------------

    async def cancel(
        self, session_id: str, turn_id: str, reason: CancelReason = "user_cancel"
    ) -> bool:
        """The REST/WebSocket cancel: True if this call moved the turn to `cancelling`."""
        await self.core.sessions.require_active(session_id)
        turn = await self.core.session_store.turn(turn_id) if len(turn_id) == 26 else None
        if turn is None or turn.session_id != session_id:
            raise TurnNotFound(turn_id)
        slot = self.core.slots.get(session_id)
        if slot is None or slot.turn_id != turn_id:
            status = turn.status if turn.status != "running" else "completing"
            raise TurnAlreadyCompleted(turn_id, status)
        if slot.outcome is not None:  # ended; only its flush is pending
            raise TurnAlreadyCompleted(turn_id, slot.outcome)
        if slot.status == "completing":
            raise TurnAlreadyCompleted(turn_id, "completing")
        moved = self.request_cancel(slot, reason)
        if moved:
            await self.core.broker.withdraw_turn(turn_id)
        return moved

    def request_cancel(self, slot: Any, reason: CancelReason) -> bool:
        """One synchronous step: in_flight → cancelling; repeats are no-ops."""
        if slot.status != "in_flight":
            return False
        slot.status, slot.cancel_reason = "cancelling", reason
        slot.cancel_event.set()
        return True

    async def cancel_and_wait(self, session_id: str, reason: CancelReason) -> None:
        slot = self.core.slots.get(session_id)
        if slot is None:
            return
        if self.request_cancel(slot, reason):
            await self.core.broker.withdraw_turn(slot.turn_id)
        await slot.released.wait()

    async def cancel_all(self, reason: CancelReason) -> None:
        """Shutdown: cancel every running turn and wait for their terminal events."""
        await asyncio.gather(
            *(self.cancel_and_wait(s.session_id, reason) for s in self.core.slots.all())
        )

    async def close_suspended(self, session_id: str) -> None:
        """Session end: close tool calls parked by suspended turns."""
        calls = await self.core.store.messages.suspended_tool_calls(session_id)
        if not calls:
            return
        await self.core.broker.withdraw_suspended(session_id)
        dispatcher = self.core.dispatcher
        for call in calls:
            outcome = failed("cancelled", cancelled_text())
            block = ToolUseBlock(id=call.id, name=call.name, input={})
            message = await dispatcher.store_result(session_id, None, call.id, outcome)
            dispatcher.emit_outcome(session_id, None, block, outcome, message.id, None)

    def abort_all(self) -> None:
        for task in self._tasks.values():
            task.cancel()

    async def wait_all(self) -> None:
        """Tests and shutdown: wait until every turn task has finished."""
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
