"""CostAccumulator: live per-turn and per-session totals, updated in the publishing step.

Reads (session GETs, terminal turn payloads) need totals that include events the trace writer
has not flushed yet; this inline subscriber keeps them in memory from the same events the
writer persists, so both always agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from metis.core.events.envelope import AnyEvent, Event

QUARTET = ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")


@dataclass
class Totals:
    """Running tokens, cost and call counts of one turn or session."""

    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QUARTET, 0))
    cost: Decimal = Decimal(0)
    llm_call_count: int = 0
    tool_call_count: int = 0

    def add_usage(self, payload: dict[str, Any]) -> None:
        for key in QUARTET:
            self.tokens[key] += int(payload.get(key, 0))
        self.cost += Decimal(payload.get("cost_usd", "0"))

    def turn_payload(self, wall_time_ms: int) -> dict[str, Any]:
        """The **T** block of a terminal turn event."""
        return {
            "llm_call_count": self.llm_call_count,
            "tool_call_count": self.tool_call_count,
            **self.tokens,
            "total_cost_usd": self.cost,
            "wall_time_ms": wall_time_ms,
        }


class CostAccumulator:
    """Live per-turn and per-session totals, fed inline from the bus so reads include events not yet
    flushed."""

    def __init__(self) -> None:
        self.sessions: dict[str, Totals] = {}
        self.turns: dict[str, Totals] = {}

    def seed_session(self, session_id: str, tokens: dict[str, int], cost: Decimal) -> None:
        """Start a session's totals from its stored spend (start-up recovery)."""
        self.sessions[session_id] = Totals(dict(tokens), cost)

    def seed_turn(self, turn_id: str, totals: Totals) -> None:
        """Start an interrupted turn's totals from its stored counters, so its `turn.failed` carries
        them (start-up recovery)."""
        self.turns[turn_id] = totals

    def session(self, session_id: str) -> Totals:
        return self.sessions.setdefault(session_id, Totals())

    def turn(self, turn_id: str) -> Totals:
        return self.turns.setdefault(turn_id, Totals())

    def end_turn(self, turn_id: str) -> Totals:
        """Forget a finished turn, returning its final totals."""
        return self.turns.pop(turn_id, Totals())

    def forget_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    def __call__(self, event: AnyEvent) -> None:
        """The inline bus subscriber: usage and call counts are added in the step that emits them."""
        if not isinstance(event, Event):
            return
        kind = event.type
        if kind in ("llm.call_completed", "llm.call_failed"):
            self.session(event.session_id).add_usage(event.payload)
            if event.turn_id:
                self.turn(event.turn_id).add_usage(event.payload)
        elif kind == "llm.call_started" and event.turn_id:
            self.turn(event.turn_id).llm_call_count += 1
        elif kind == "tool.called" and event.turn_id:
            self.turn(event.turn_id).tool_call_count += 1
