"""TurnControl: stopping a session's turn work, shared by the turn and session services.

A session's end (SessionService) and a cancel or shutdown (TurnService) stop turns the same
way; both use this one component, so neither service calls the other.
"""

from __future__ import annotations

from typing import Literal

from metis.core.canonical.content import ToolUseBlock
from metis.core.confirmations import ConfirmationBroker
from metis.core.store.store import Store
from metis.core.tools.dispatcher import Dispatcher
from metis.core.tools.results import cancelled_text, failed
from metis.core.turns.slots import TurnSlot, TurnSlots

CancelReason = Literal["user_cancel", "client_disconnect", "timeout", "server_shutdown"]


def request_cancel(slot: TurnSlot, reason: CancelReason) -> bool:
    """One synchronous step: in_flight → cancelling; repeats are no-ops."""
    if slot.status != "in_flight":
        return False
    slot.status, slot.cancel_reason = "cancelling", reason
    slot.cancel_event.set()
    return True


class TurnControl:
    """Stops a session's turn work (a running turn, suspended tool calls) for both the turn and the
    session services."""

    def __init__(
        self, slots: TurnSlots, broker: ConfirmationBroker, dispatcher: Dispatcher, store: Store
    ) -> None:
        self.slots = slots
        self._broker = broker
        self._dispatcher = dispatcher
        self._store = store

    async def cancel_and_wait(self, session_id: str, reason: CancelReason) -> None:
        """Cancel the session's turn, if any, and wait until it released its slot."""
        slot = self.slots.get(session_id)
        if slot is None:
            return
        if request_cancel(slot, reason):
            await self._broker.withdraw_turn(slot.turn_id)
        await slot.released.wait()

    async def close_suspended(self, session_id: str) -> None:
        """Session end: close tool calls parked by suspended turns."""
        calls = await self._store.messages.suspended_tool_calls(session_id)
        if not calls:
            return
        await self._broker.withdraw_suspended(session_id)
        dispatcher = self._dispatcher
        for call in calls:
            outcome = failed("cancelled", cancelled_text())
            block = ToolUseBlock(id=call.id, name=call.name, input={})
            message = await dispatcher.store_result(session_id, None, call.id, outcome)
            dispatcher.emit_outcome(session_id, None, block, outcome, message.id, None)

    async def stop_session(self, session_id: str) -> None:
        """A session's end begins: its running turn is cancelled, its parked calls closed."""
        await self.cancel_and_wait(session_id, "user_cancel")
        await self.close_suspended(session_id)
