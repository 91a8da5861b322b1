"""Startup recovery, before the port is bound.

A crash can leave turns `running`, tool uses without results, `wait` confirmations pending and
model swaps queued. Each is repaired here into a state a client can understand: the turn is
`failed` with `turn.failed{daemon_restart}` at the next seq, every interrupted tool use has a
stored error result, and holes in a stream's seq become visible `bus.gap_detected` events.
"""

from __future__ import annotations

import contextlib
import json
import logging
from decimal import Decimal

from metis.core.canonical.times import now_us
from metis.core.events.bus import EventBus
from metis.core.events.costs import QUARTET, CostAccumulator, Totals
from metis.core.store.sessions import Spend
from metis.core.store.store import Store
from metis.core.tools.results import INTERRUPTED, failed, tool_result_message

log = logging.getLogger(__name__)


async def seed_from_store(store: Store, bus: EventBus, costs: CostAccumulator) -> None:
    """Continue every stream's seq and every session's spend where the store left them."""
    bus.seed(await store.events.max_seqs())
    for spend in await store.sessions.spends():
        costs.seed_session(spend.session_id, spend.tokens, spend.cost)


async def report_gaps(store: Store, bus: EventBus) -> int:
    """Announce every hole in the stored seq of a stream as `bus.gap_detected`; returns how many
    there were."""
    gaps = await store.events.find_gaps()
    for stream, first, last in gaps:
        log.warning("stream %s is missing seq %d..%d", stream, first, last)
        bus.emit(
            stream,
            "bus.gap_detected",
            {"missing_from_seq": first, "missing_to_seq": last, "detected_by": "startup_scan"},
            actor="system",
        )
    return len(gaps)


async def fail_orphaned_turns(store: Store, bus: EventBus, costs: CostAccumulator) -> list[str]:
    """Mark every `running` turn failed and close what it left open; returns the turn ids."""
    turns = await store.sessions.running_turns()
    # Every queued model swap, not only those behind a `running` turn: a crash between a
    # turn's final flush and its release leaves the turn `completed` with its swap queued, and
    # at start-up no turn holds a slot to wait for (the next turn sees it).
    await store.sessions.apply_all_pending_swaps(now_us())
    for turn in turns:
        await _close_interrupted_tools(store, turn.session_id, turn.id)
        started = await store.events.first_id_of_type(turn.id, "turn.started")
        totals = Totals(dict(turn.tokens), turn.cost_usd, turn.llm_call_count, turn.tool_call_count)
        await _recover_unprojected_spend(store, costs, turn.session_id, turn.id, totals)
        costs.seed_turn(turn.id, totals)
        wall_ms = max(0, (now_us() - turn.started_at_us) // 1000)
        bus.emit(
            turn.session_id,
            "turn.failed",
            {
                **costs.end_turn(turn.id).turn_payload(wall_ms),
                "reason": "daemon_restart",
                "error_class": None,
                "message": "metis stopped while this turn was running",
            },
            actor="system",
            turn_id=turn.id,
            parent_event_id=started,
        )
        log.warning(
            "turn %s of %s was interrupted by a restart; marked failed", turn.id, turn.session_id
        )
    return [t.id for t in turns]


async def _recover_unprojected_spend(
    store: Store, costs: CostAccumulator, session_id: str, turn_id: str, totals: Totals
) -> None:
    """Spend the crash kept out of the totals: events reach the store up to 50 ms after they
    are emitted, but each reply is committed with its usage first. Where the turn's stored
    replies add up to more than its projected totals, the difference is added to the turn and
    its session (spend counts whatever the outcome, daemon_restart included)."""
    stored = Totals()
    for metadata_json in await store.messages.assistant_metadata_json(turn_id):
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            usage = json.loads(metadata_json).get("usage") or {}
            stored.add_usage({k: usage.get(k, 0) for k in (*QUARTET, "cost_usd")})
    missing = Totals(
        {k: max(0, stored.tokens[k] - totals.tokens[k]) for k in QUARTET},
        max(Decimal(0), stored.cost - totals.cost),
    )
    if not missing.cost and not any(missing.tokens.values()):
        return
    log.warning("turn %s: recovering spend its lost events carried (%s USD)", turn_id, missing.cost)
    payload = {**missing.tokens, "cost_usd": missing.cost}
    totals.add_usage(payload)
    costs.session(session_id).add_usage(payload)
    spend = Spend(dict(missing.tokens), missing.cost)
    async with store.transaction() as tx:
        tx.sessions.add_turn_spend(turn_id, spend)
        tx.sessions.add_session_spend(session_id, spend)


async def _close_interrupted_tools(store: Store, session_id: str, turn_id: str) -> None:
    """Store an error result for every tool use of the turn (or resumed by it) left without one."""
    tool_use_ids = await store.messages.interrupted_tool_calls(session_id, turn_id)
    stamp = now_us()
    outcome = failed("internal_error", INTERRUPTED)
    async with store.transaction() as tx:
        for tool_use_id in tool_use_ids:
            message = tool_result_message(session_id, turn_id, tool_use_id, outcome, stamp)
            tx.messages.insert(message)
            tx.messages.fail_interrupted(tool_use_id, message.id, stamp)
        tx.confirmations.expire_waiting(turn_id, stamp)
