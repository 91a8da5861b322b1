"""The tool dispatch pipeline: lookup → schema → sandbox → confirmation → slot →
`tool.called` → execute → result, for every tool use of one assistant message.

Execution is concurrent (bounded per session and globally); publication is ordered: the `tool`
messages and terminal events of a batch are committed and emitted in tool_use order. Every tool
use that is not parked (suspend policy, application tools) ends with exactly one stored result.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from metis.core.canonical.content import ToolUseBlock
from metis.core.canonical.jsontext import canonical_json
from metis.core.canonical.messages import Message
from metis.core.canonical.redaction import redact
from metis.core.canonical.times import now_us
from metis.core.canonical.tools import ToolDefinition
from metis.core.confirmations import ConfirmationBroker, ConfirmationRequest
from metis.core.events.bus import EventBus
from metis.core.sessions.history import HistoryWriter
from metis.core.store.store import Store
from metis.core.store.tx import Transaction
from metis.core.tools.executor import ToolExecutor
from metis.core.tools.pathorder import PathOrder, PathTurn
from metis.core.tools.policy import (
    ModeResolution,
    SurfaceToolPolicy,
    configured_mode,
    resolve_mode,
)
from metis.core.tools.precheck import precheck
from metis.core.tools.registry import RegisteredTool, ToolRegistry
from metis.core.tools.results import (
    ToolOutcome,
    cancelled_text,
    confirmation_timeout_text,
    failed,
    input_invalid_text,
    not_enabled_denied_text,
    not_found_text,
    policy_denied_text,
    tool_result_message,
    user_denied_text,
)
from metis.core.tools.sandbox import Sandbox
from metis.core.tools.settings import ToolsSettings
from metis.core.tools.summary import summarize

log = logging.getLogger(__name__)

ConfirmationPolicy = Literal["wait", "suspend"]


@dataclass
class TurnTools:
    """What the dispatcher needs to know about the turn it serves."""

    session_id: str
    turn_id: str
    workspace: str
    sandbox: Sandbox
    confirmation_policy: ConfirmationPolicy
    cancel: asyncio.Event
    surface_policy: SurfaceToolPolicy | None = None
    application_tools: dict[str, ToolDefinition] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_application_policy(self.confirmation_policy, self.application_tools.values())


def check_application_policy(
    policy: ConfirmationPolicy, application: Iterable[ToolDefinition]
) -> None:
    """Application tools always suspend, so a `wait` turn cannot have any.

    Raises ValueError: a surface passing them with `wait` is a programming error, and the
    dispatcher would otherwise park calls that no `wait` client can ever answer.
    """
    names = [t.name for t in application]
    if policy == "wait" and names:
        raise ValueError(
            f"application tools need the suspend confirmation policy: {', '.join(names)}"
        )


@dataclass
class BatchResult:
    """What one assistant message's tool uses came to: the stored result messages in tool_use order,
    and the ids parked for an answer from the client (suspend policy, application tools)."""

    results: list[Message]
    suspended_ids: list[str]


@dataclass(eq=False)
class _Job:
    block: ToolUseBlock
    entry: RegisteredTool | None = None
    definition: ToolDefinition | None = None
    input: dict[str, Any] = field(default_factory=dict)
    gate_event_id: str | None = None
    called_event_id: str | None = None
    parked: bool = False
    path_turn: PathTurn | None = None
    published: asyncio.Event = field(default_factory=asyncio.Event)


def input_fingerprint(value: dict[str, Any]) -> tuple[str, int]:
    """`input_sha256` and `input_bytes` over sorted-key compact JSON."""
    encoded = canonical_json(value).encode(
        "utf-8", "surrogatepass"
    )  # a model may send lone surrogates
    return hashlib.sha256(encoded).hexdigest(), len(encoded)


class Dispatcher:
    """Runs the tool uses of one assistant message through the whole pipeline; the only writer of
    tool events and tool result messages."""

    def __init__(
        self,
        *,
        store: Store,
        bus: EventBus,
        broker: ConfirmationBroker,
        registry: ToolRegistry,
        settings: ToolsSettings,
        history: HistoryWriter,
        executor: ToolExecutor | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.broker = broker
        self.registry = registry
        self.settings = settings
        self.executor = executor or ToolExecutor(settings)
        self.history = history
        self._global = asyncio.Semaphore(settings.max_concurrent_global)
        self._session_slots: dict[str, asyncio.Semaphore] = {}
        self._first_questions: dict[tuple[str, str], asyncio.Lock] = {}  # prompt_once: see _confirm
        self._path_order = PathOrder()
        self._trusted = settings.confirmation.resolved_trusted_workspaces()

    def offered(
        self,
        surface: SurfaceToolPolicy | None,
        application: Sequence[ToolDefinition] = (),
        *,
        confirmation_policy: ConfirmationPolicy | None = None,
    ) -> list[ToolDefinition]:
        """The tools a turn offers the model: its enabled builtins, then its application tools.

        Every turn's tools are assembled here, so the application-tool guards sit here as the core's
        backstop behind the surfaces' own checks: an application tool named like a builtin the
        session enables raises `ToolNameConflict` (the model could not tell them apart), and
        one in a `wait` turn raises ValueError. `confirmation_policy` is None for a caller
        that only sizes a context (AAP's history view), where no turn is being started.
        """
        if confirmation_policy is not None:
            check_application_policy(confirmation_policy, application)
        self.registry.check_application_tools([t.name for t in application], surface)
        return [*self.registry.offered(surface), *application]

    def holds(self, session_id: str) -> bool:
        """Whether any per-session state (slot, first-question lock) is still kept for the session;
        the memory test checks that an ended session leaves none."""
        return session_id in self._session_slots or any(
            key[0] == session_id for key in self._first_questions
        )

    def forget_session(self, session_id: str) -> None:
        """End or purge: the session runs no more tool calls."""
        self._session_slots.pop(session_id, None)
        for key in [k for k in self._first_questions if k[0] == session_id]:
            del self._first_questions[key]
        self._path_order.forget(lambda key: isinstance(key, tuple) and key[0] == session_id)

    # -- the batch ----------------------------------------------------------------------------

    async def run_batch(
        self,
        turn: TurnTools,
        tool_uses: Sequence[ToolUseBlock],
        *,
        message_id: str,
        parent_event_id: str | None,
    ) -> BatchResult:
        """Run the tool uses of one assistant message; results are committed and announced in
        tool_use order whatever order they finish in."""
        jobs = [_Job(block) for block in tool_uses]

        async def process(job: _Job) -> ToolOutcome | InputInvalid | None:
            return await self._process(turn, job, message_id, parent_event_id)

        results = await self._run_ordered(turn, jobs, process, parent_event_id)
        return BatchResult(
            [m for m in results if m is not None], [j.block.id for j in jobs if j.parked]
        )

    async def _run_ordered(
        self,
        turn: TurnTools,
        jobs: list[_Job],
        process: Callable[[_Job], Awaitable[ToolOutcome | InputInvalid | None]],
        parent_event_id: str | None,
    ) -> list[Message | None]:
        """Concurrent execution, publication in tool_use order.

        The writes' path order is fixed here, before any job starts: each write-class
        tool use joins the queue of its resolved path in tool_use order, so the order in which
        confirmations are answered cannot reorder writes to one path.
        """
        results: list[Message | None] = [None] * len(jobs)
        for job in jobs:
            job.path_turn = self._path_order.enqueue(
                (turn.session_id, real) for real in self._write_paths(turn, job.block)
            )

        async def run(index: int) -> None:
            job = jobs[index]
            try:
                outcome = await process(job)
            except asyncio.CancelledError:
                outcome = cancelled_outcome()
            finally:
                # ran, or ended without running: the next write to its path may go
                self._path_order.release(job.path_turn)
            if index > 0:
                await jobs[index - 1].published.wait()
            try:
                if outcome is not None:
                    results[index] = await self._publish(turn, job, outcome, parent_event_id)
            finally:
                job.published.set()

        await asyncio.gather(*(run(i) for i in range(len(jobs))))
        return results

    def _write_paths(self, turn: TurnTools, block: ToolUseBlock) -> tuple[str, ...]:
        """The resolved paths a write-class tool use will lock, or () if it cannot get to run
        (not an enabled builtin, invalid input, refused by the pre-check: steps 1–3 decide the
        same way again in `_process`, and nothing between changes their inputs)."""
        if block.name in turn.application_tools:
            return ()
        entry = self.registry.lookup(block.name, turn.surface_policy)
        if entry is None or entry.definition.side_effects != "write":
            return ()
        validation = entry.validate(block.input)
        if not validation.ok:
            return ()
        check = precheck(entry.definition, validation.value or {}, turn.sandbox)
        if check.failure is not None:
            return ()
        return tuple(path.real for path in check.paths)

    # -- AAP resolution: granted suspended calls ----------------------------------------------

    async def run_granted(
        self,
        turn: TurnTools,
        grants: Sequence[tuple[ToolUseBlock, str | None]],
        *,
        parent_event_id: str | None,
    ) -> list[Message]:
        """Run calls granted in a resolution turn: the tool may have been disabled meanwhile
        and the filesystem may have changed, so lookup and the sandbox pre-check run again
        before steps 5–8. Each pair is (the tool use, its `tool.confirmation_resolved` id)."""
        jobs = [_Job(block, gate_event_id=gate) for block, gate in grants]
        results = await self._run_ordered(
            turn, jobs, partial(self._process_granted, turn), parent_event_id
        )
        return [m for m in results if m is not None]

    async def _process_granted(self, turn: TurnTools, job: _Job) -> ToolOutcome | InputInvalid:
        block = job.block
        if turn.cancel.is_set():
            return cancelled_outcome()
        entry = self.registry.lookup(block.name, turn.surface_policy)
        if entry is None:
            return failed("policy_denied", not_enabled_denied_text(block.name))
        mode, _ = configured_mode(
            block.name,
            entry.definition.side_effects,
            turn.sandbox.root,
            self.settings.confirmation,
            self._trusted,
            entry.configured_mode,
        )
        if mode == "deny":
            return failed("policy_denied", policy_denied_text(block.name))
        job.entry, job.definition = entry, entry.definition
        validation = entry.validate(block.input)
        if not validation.ok:
            text = input_invalid_text(block.name, validation.errors)
            return InputInvalid(tuple(validation.errors), failed("tool_error", text))
        job.input = validation.value or {}
        check = precheck(entry.definition, job.input, turn.sandbox)
        if check.failure is not None:
            return check.failure
        return await self.execute(turn, job)

    async def _process(
        self, turn: TurnTools, job: _Job, message_id: str, parent: str | None
    ) -> ToolOutcome | InputInvalid | None:
        """Steps 1–7 for one tool use; None when it is parked (answered in a later turn)."""
        block = job.block
        job.gate_event_id = parent
        if turn.cancel.is_set():
            return cancelled_outcome()
        # 1. lookup
        application = turn.application_tools.get(block.name)
        if application is not None:
            await self._park_application(turn, job, application, parent)
            return None
        entry = self.registry.lookup(block.name, turn.surface_policy)
        if entry is None:
            names = [*self.registry.offered_names(turn.surface_policy), *turn.application_tools]
            return failed(
                "not_found",
                not_found_text(block.name, names),
                max_bytes=self.settings.max_result_bytes,
            )
        job.entry, job.definition = entry, entry.definition
        # 2. schema
        validation = entry.validate(block.input)
        if not validation.ok:
            text = input_invalid_text(block.name, validation.errors)
            return InputInvalid(tuple(validation.errors), failed("tool_error", text))
        job.input = validation.value or {}
        # 3. sandbox pre-check
        check = precheck(entry.definition, job.input, turn.sandbox)
        if check.failure is not None:
            return check.failure
        # 4. confirmation
        refusal = await self._confirm(turn, job, entry, message_id, parent)
        if refusal is not None or job.parked:
            return refusal
        return await self.execute(turn, job)

    def _resolve_mode(self, turn: TurnTools, job: _Job, entry: RegisteredTool) -> ModeResolution:
        return resolve_mode(
            tool_name=job.block.name,
            side_effects=entry.definition.side_effects,
            workspace=turn.sandbox.root,
            confirmation=self.settings.confirmation,
            trusted_roots=self._trusted,
            surface=turn.surface_policy,
            remembered=self._remembered(turn.session_id, job.block.name),
            always_ask=self.executor.unsandboxed(entry),
            configured=entry.configured_mode,
        )

    async def _confirm(
        self, turn: TurnTools, job: _Job, entry: RegisteredTool, message_id: str, parent: str | None
    ) -> ToolOutcome | None:
        """Step 4: None when the call may run (or is parked: `job.parked`), else its failure.

        `prompt_once` asks the first time only, and the calls of one tool often come in one
        batch: a call that finds its tool's first question still open waits for that answer
        (remembered, so it decides this call too) instead of asking a second time."""
        resolution = self._resolve_mode(turn, job, entry)
        if not (
            resolution.action == "ask"
            and resolution.mode == "prompt_once"
            and turn.confirmation_policy == "wait"
        ):
            return await self._gate(turn, job, entry, resolution, message_id, parent)
        key = (turn.session_id, job.block.name)
        question = self._first_questions.setdefault(key, asyncio.Lock())
        if not await _acquire_unless_cancelled(question, turn.cancel):
            return cancelled_outcome()
        try:
            resolution = self._resolve_mode(turn, job, entry)  # an answer may be remembered now
            return await self._gate(turn, job, entry, resolution, message_id, parent)
        finally:
            question.release()

    async def _gate(
        self,
        turn: TurnTools,
        job: _Job,
        entry: RegisteredTool,
        resolution: ModeResolution,
        message_id: str,
        parent: str | None,
    ) -> ToolOutcome | None:
        """The outcome of the call's effective mode: refused, parked, asked, or let through."""
        block = job.block
        if resolution.action == "policy_denied":
            return failed("policy_denied", policy_denied_text(block.name))
        if resolution.action == "user_denied":
            return failed("user_denied", user_denied_text())
        if resolution.action == "ask":
            summary = summarize(
                entry.definition,
                job.input,
                turn.sandbox,
                unsandboxed=self.executor.unsandboxed(entry),
            )
            request = ConfirmationRequest(
                session_id=turn.session_id,
                turn_id=turn.turn_id,
                tool_use_id=block.id,
                tool_name=block.name,
                side_effects=entry.definition.side_effects,
                input_summary=summary.input_summary,
                projected_modifications=summary.projected_modifications,
                command_summary=summary.command_summary,
                message_id=message_id,
                parent_event_id=parent,
            )
            if turn.confirmation_policy == "suspend":
                await self.broker.park(request)
                job.parked = True
                return None
            answer = await self.broker.ask(
                request, cancel=turn.cancel, remember_any=resolution.mode == "prompt_once"
            )
            job.gate_event_id = answer.resolved_event_id or parent
            if answer.outcome == "withdrawn":
                return cancelled_outcome()
            if answer.outcome == "timeout":
                return failed(
                    "confirmation_timeout", confirmation_timeout_text(self.broker.timeout_s)
                )
            if answer.outcome == "deny":
                return failed("user_denied", user_denied_text(answer.reason))
        return None

    def _remembered(self, session_id: str, tool_name: str) -> dict[str, Any]:
        decision = self.broker.remembered(session_id, tool_name)
        return {tool_name: decision} if decision else {}

    async def execute(self, turn: TurnTools, job: _Job) -> ToolOutcome:
        """Steps 5–7: wait for the path's turn, take the slots, announce `tool.called`, run.

        A write first waits until every earlier write to its path (in tool_use order)
        has finished or dropped out, and only then queues for the session and global slots: a
        write held back by its path holds no slot, so nothing else (reads included) waits
        behind a path. Cancelled while waiting for either: `tool.failed{cancelled}`, no
        `tool.called`.
        """
        entry = job.entry
        assert entry is not None
        if job.path_turn is None and entry.definition.side_effects == "write":
            # not planned by a batch: join the path's queue now, behind whatever is in it
            paths = precheck(entry.definition, job.input, turn.sandbox).paths
            job.path_turn = self._path_order.enqueue((turn.session_id, p.real) for p in paths)
        session_slot = self._session_slots.setdefault(
            turn.session_id, asyncio.Semaphore(self.settings.max_concurrent_per_session)
        )
        acquired: list[asyncio.Semaphore] = []
        try:
            if job.path_turn is not None and not await _wait_unless_cancelled(
                job.path_turn.ready, turn.cancel
            ):
                return cancelled_outcome()
            for gate in (session_slot, self._global):
                if not await _acquire_unless_cancelled(gate, turn.cancel):
                    return cancelled_outcome()
                acquired.append(gate)
            timeout = self.executor.timeout_for(entry, job.input)
            job.called_event_id = self._announce_called(
                turn, job, entry.definition, job.input, timeout, job.gate_event_id
            )
            return await self.executor.run(
                entry,
                job.input,
                sandbox=turn.sandbox,
                tool_use_id=job.block.id,
                cancel_event=turn.cancel,
                session_id=turn.session_id,
                turn_id=turn.turn_id,
                timeout_seconds=timeout,
            )
        finally:
            for gate in reversed(acquired):
                gate.release()
            self._path_order.release(job.path_turn)

    async def _park_application(
        self, turn: TurnTools, job: _Job, definition: ToolDefinition, parent: str | None
    ) -> None:
        """Application tools always suspend: `tool.called{origin: application}` then parked."""
        self._announce_called(turn, job, definition, job.block.input, None, parent)
        job.parked = True
        return None

    def _announce_called(
        self,
        turn: TurnTools,
        job: _Job,
        definition: ToolDefinition,
        tool_input: dict[str, Any],
        timeout: float | None,
        parent: str | None,
    ) -> str | None:
        """`tool.called` (step 6): from here the call has side effects or waits on the client."""
        sha, size = input_fingerprint(tool_input)
        event = self.bus.emit(
            turn.session_id,
            "tool.called",
            {
                "tool_use_id": job.block.id,
                "tool_name": job.block.name,
                "side_effects": definition.side_effects,
                "origin": definition.origin,
                "input_sha256": sha,
                "input_bytes": size,
                "timeout_seconds": timeout,
            },
            actor="agent",
            turn_id=turn.turn_id,
            parent_event_id=parent,
        )
        return event.id if event else None

    # -- publication --------------------------------------------------------------------------

    async def _publish(
        self, turn: TurnTools, job: _Job, outcome: ToolOutcome | InputInvalid, parent: str | None
    ) -> Message:
        """Step 8: commit the `tool` message, then emit the terminal event."""
        stored = outcome.outcome if isinstance(outcome, InputInvalid) else outcome
        message = await self.store_result(turn.session_id, turn.turn_id, job.block.id, stored)
        parent_id = job.called_event_id or job.gate_event_id or parent
        self.emit_outcome(turn.session_id, turn.turn_id, job.block, outcome, message.id, parent_id)
        return message

    async def store_result(
        self, session_id: str, turn_id: str | None, tool_use_id: str, outcome: ToolOutcome
    ) -> Message:
        """Commit a tool use's result message and link it to its call in one transaction; also used
        for answers that arrive by resolution or abandonment."""
        message = tool_result_message(session_id, turn_id, tool_use_id, outcome, now_us())

        def rows(tx: Transaction) -> None:
            tx.messages.insert(message)  # validated here, before the write
            tx.messages.link_result(tool_use_id, message.id)

        await self.history.commit_with(session_id, [message], rows)
        return message

    def emit_outcome(
        self,
        session_id: str,
        turn_id: str | None,
        block: ToolUseBlock,
        outcome: ToolOutcome | InputInvalid,
        result_message_id: str,
        parent_event_id: str | None,
    ) -> None:
        """The terminal event of one tool use (`tool.input_invalid`, `tool.completed` or
        `tool.failed`), pointing at its stored result."""
        if isinstance(outcome, InputInvalid):
            payload: dict[str, Any] = {
                "tool_use_id": block.id,
                "tool_name": block.name,
                "errors": [{"path": e.path, "message": e.message} for e in outcome.errors[:20]],
                "result_message_id": result_message_id,
            }
            self.bus.emit(
                session_id,
                "tool.input_invalid",
                payload,
                actor="system",
                turn_id=turn_id,
                parent_event_id=parent_event_id,
            )
        elif outcome.error_class is None:
            self.bus.emit(
                session_id,
                "tool.completed",
                {
                    "tool_use_id": block.id,
                    "is_error": outcome.is_error,
                    "output_bytes": outcome.output_bytes,
                    "truncated": outcome.truncated,
                    "duration_ms": outcome.duration_ms,
                    "files_modified": list(outcome.files_modified)
                    if outcome.files_modified is not None
                    else None,
                    "exit_code": outcome.exit_code,
                    "result_message_id": result_message_id,
                },
                actor="tool",
                turn_id=turn_id,
                parent_event_id=parent_event_id,
            )
        else:
            self.bus.emit(
                session_id,
                "tool.failed",
                {
                    "tool_use_id": block.id,
                    "tool_name": block.name,
                    "error_class": outcome.error_class,
                    "message": redact(outcome.text, limit=2000),
                    "duration_ms": outcome.duration_ms,
                    "result_message_id": result_message_id,
                },
                actor="tool",
                turn_id=turn_id,
                parent_event_id=parent_event_id,
            )


@dataclass(frozen=True)
class InputInvalid:
    """A schema failure: stored like any error result, announced as `tool.input_invalid`."""

    errors: tuple[Any, ...]
    outcome: ToolOutcome


async def _acquire_unless_cancelled(
    gate: asyncio.Semaphore | asyncio.Lock, cancel: asyncio.Event
) -> bool:
    """Wait for a slot, or give up when the turn is cancelled (`tool.failed{cancelled}`)."""
    if cancel.is_set():
        return False
    acquire = asyncio.ensure_future(gate.acquire())
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({acquire, cancelled}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        # the task itself is being cancelled: never leave a slot taken on nobody's behalf
        if not acquire.cancel() and not acquire.cancelled() and acquire.exception() is None:
            gate.release()
        raise
    finally:
        cancelled.cancel()
    if acquire.done() and not acquire.cancelled():
        if cancel.is_set():
            gate.release()
            return False
        return True
    acquire.cancel()
    return False


async def _wait_unless_cancelled(ready: asyncio.Event, cancel: asyncio.Event) -> bool:
    """Wait for `ready` (a path's turn); False when the turn is cancelled first."""
    if cancel.is_set():
        return False
    if ready.is_set():
        return True
    waits = {asyncio.ensure_future(ready.wait()), asyncio.ensure_future(cancel.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
    return ready.is_set() and not cancel.is_set()


def cancelled_outcome() -> ToolOutcome:
    """The outcome of a tool use cancelled before it produced anything."""
    return failed("cancelled", cancelled_text())
