"""Turn slots: which turn holds each session, and in which state (in-memory, per process).

The slot is claimed and released in synchronous steps (no await between check and set), which
is what makes "exactly one 202 among concurrent submits" hold.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from metis.core.cancel_event import CancelEvent

SlotStatus = Literal["in_flight", "cancelling", "completing"]


@dataclass(eq=False)
class TurnSlot:
    """The one turn a session runs: its cancel state, its outcome once the terminal event is out,
    and `released` once its events are flushed."""

    session_id: str
    turn_id: str
    status: SlotStatus = "in_flight"
    cancel_event: CancelEvent = field(default_factory=CancelEvent)
    cancel_reason: str | None = None
    released: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: str | None = None  # completed | cancelled | failed, once the terminal event is out

    @property
    def terminal_emitted(self) -> bool:
        return self.outcome is not None


class TurnSlots:
    """The slot of every session with a turn; claim and release are synchronous so exactly one
    concurrent submit wins."""

    def __init__(self) -> None:
        self._by_session: dict[str, TurnSlot] = {}

    def get(self, session_id: str) -> TurnSlot | None:
        """The slot of the session, held until the turn's events are flushed (see `current` for what
        clients see)."""
        return self._by_session.get(session_id)

    def current(self, session_id: str) -> TurnSlot | None:
        """The turn a client should see as running: none once its terminal event is out.

        The slot itself is held a little longer (until the trace flush); state shown to
        clients changes in the same step as the event that changes it.
        """
        slot = self._by_session.get(session_id)
        return None if slot is None or slot.terminal_emitted else slot

    def claim(self, session_id: str, turn_id: str) -> TurnSlot | None:
        """Register `turn_id` as the session's turn; None if another turn holds the slot."""
        if session_id in self._by_session:
            return None
        slot = TurnSlot(session_id, turn_id)
        self._by_session[session_id] = slot
        return slot

    def release(self, slot: TurnSlot) -> None:
        """Free the session for its next turn (only if this slot still holds it) and wake those
        waiting on `released`."""
        if self._by_session.get(slot.session_id) is slot:
            del self._by_session[slot.session_id]
        slot.released.set()

    def __len__(self) -> int:
        return len(self._by_session)

    def all(self) -> list[TurnSlot]:
        return list(self._by_session.values())
