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

from metis.core.canonical import (
    Message,
    MessageMetadata,
    TextBlock,
    ToolResultBlock,
    decimal_str,
    new_ulid,
    now_us,
)
from metis.core.events.bus import EventBus
from metis.core.events.costs import QUARTET, CostAccumulator, Totals
from metis.core.store.db import Database
from metis.core.store.events import EventStore
from metis.core.store.messages import insert_message

log = logging.getLogger(__name__)

INTERRUPTED_TEXT = "Tool call interrupted: metis stopped before the tool finished"


async def seed_from_store(db: Database, bus: EventBus, costs: CostAccumulator) -> None:
    """Continue every stream's seq and every session's spend where the store left them."""
    bus.seed(await EventStore(db).max_seqs())
    for row in await db.fetchall(
        "SELECT id, cost_so_far_usd, input_tokens, cache_read_tokens, cache_write_tokens, "
        "output_tokens FROM sessions"
    ):
        costs.seed_session(row["id"], {k: row[k] for k in QUARTET}, Decimal(row["cost_so_far_usd"]))


async def report_gaps(db: Database, bus: EventBus) -> int:
    gaps = await EventStore(db).find_gaps()
    for stream, first, last in gaps:
        log.warning("stream %s is missing seq %d..%d", stream, first, last)
        bus.emit(
            stream,
            "bus.gap_detected",
            {"missing_from_seq": first, "missing_to_seq": last, "detected_by": "startup_scan"},
            actor="system",
        )
    return len(gaps)


async def fail_orphaned_turns(db: Database, bus: EventBus, costs: CostAccumulator) -> list[str]:
    """Mark every `running` turn failed and close what it left open; returns the turn ids."""
    turns = await db.fetchall("SELECT * FROM turns WHERE status='running' ORDER BY id")
    await _apply_pending_swaps(db)
    for turn in turns:
        await _close_interrupted_tools(db, turn["session_id"], turn["id"])
        started = await db.fetchone(
            "SELECT id FROM events WHERE turn_id=? AND type='turn.started'", (turn["id"],)
        )
        totals = Totals(
            {k: int(turn[k]) for k in QUARTET},
            Decimal(turn["cost_usd"]),
            int(turn["llm_call_count"]),
            int(turn["tool_call_count"]),
        )
        await _recover_unprojected_spend(db, costs, turn["session_id"], turn["id"], totals)
        costs.seed_turn(turn["id"], totals)
        wall_ms = max(0, (now_us() - int(turn["started_at_us"])) // 1000)
        bus.emit(
            turn["session_id"],
            "turn.failed",
            {
                **costs.end_turn(turn["id"]).turn_payload(wall_ms),
                "reason": "daemon_restart",
                "error_class": None,
                "message": "metis stopped while this turn was running",
            },
            actor="system",
            turn_id=turn["id"],
            parent_event_id=started["id"] if started else None,
        )
        log.warning(
            "turn %s of %s was interrupted by a restart; marked failed",
            turn["id"],
            turn["session_id"],
        )
    return [t["id"] for t in turns]


async def _recover_unprojected_spend(
    db: Database, costs: CostAccumulator, session_id: str, turn_id: str, totals: Totals
) -> None:
    """Spend the crash kept out of the totals: events reach the store up to 50 ms after they
    are emitted, but each reply is committed with its usage first. Where the turn's stored
    replies add up to more than its projected totals, the difference is added to the turn and
    its session (spend counts whatever the outcome, daemon_restart included)."""
    stored = Totals()
    for row in await db.fetchall(
        "SELECT metadata_json FROM messages WHERE turn_id=? AND role='assistant'", (turn_id,)
    ):
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            usage = json.loads(row["metadata_json"]).get("usage") or {}
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
    async with db.write() as conn:
        for table, column, row_id in (
            ("turns", "cost_usd", turn_id),
            ("sessions", "cost_so_far_usd", session_id),
        ):
            async with conn.execute(
                f"SELECT {column} FROM {table} WHERE id=?", (row_id,)
            ) as cursor:
                current = await cursor.fetchone()
            if current is None:
                continue
            await conn.execute(
                f"UPDATE {table} SET {column}=?, "
                + ", ".join(f"{k}={k}+?" for k in QUARTET)
                + " WHERE id=?",
                (
                    decimal_str(Decimal(current[0]) + missing.cost),
                    *(missing.tokens[k] for k in QUARTET),
                    row_id,
                ),
            )


async def _close_interrupted_tools(db: Database, session_id: str, turn_id: str) -> None:
    """Store an error result for every tool use of the turn (or resumed by it) left without one."""
    rows = await db.fetchall(
        "SELECT id FROM tool_calls WHERE result_message_id IS NULL AND session_id=? AND "
        "(turn_id=? OR id IN (SELECT tool_use_id FROM confirmations WHERE resolved_in_turn_id=?)) "
        "ORDER BY id",
        (session_id, turn_id, turn_id),
    )
    stamp = now_us()
    async with db.write() as conn:
        for row in rows:
            message = Message(
                id=new_ulid(),
                session_id=session_id,
                turn_id=turn_id,
                role="tool",
                content=[
                    ToolResultBlock(
                        tool_use_id=row["id"],
                        content=[TextBlock(text=INTERRUPTED_TEXT)],
                        is_error=True,
                    )
                ],
                created_at_us=stamp,
                metadata=MessageMetadata(tool_use_id=row["id"]),
            )
            await insert_message(conn, message)
            await conn.execute(
                "UPDATE tool_calls SET status='failed', error_class='internal_error', is_error=1, "
                "result_message_id=?, ended_at_us=? WHERE id=?",
                (message.id, stamp, row["id"]),
            )
        await conn.execute(
            "UPDATE confirmations SET status='expired', resolved_at_us=? "
            "WHERE turn_id=? AND policy='wait' AND status='pending'",
            (stamp, turn_id),
        )


async def _apply_pending_swaps(db: Database) -> None:
    """Every queued model swap, not only those behind a `running` turn: a crash between a
    turn's final flush and its release leaves the turn `completed` with its swap queued, and
    at start-up no turn holds a slot to wait for (the next turn sees it)."""
    async with db.write() as conn:
        await conn.execute(
            "UPDATE sessions SET active_model=pending_model, pending_model_set=0, pending_model=NULL, "
            "updated_at_us=? WHERE pending_model_set=1",
            (now_us(),),
        )
