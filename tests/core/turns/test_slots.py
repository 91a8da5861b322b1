"""The cancel state machine of a turn slot: in_flight → cancelling, repeats are no-ops."""

from __future__ import annotations

from metis.core.turns.service import TurnService
from metis.core.turns.slots import TurnSlots


async def test_cancel_moves_in_flight_to_cancelling_once() -> None:
    slots = TurnSlots()
    slot = slots.claim("s", "t")
    assert slot is not None and slots.claim("s", "u") is None
    service = TurnService  # request_cancel is the service's synchronous step on a slot
    assert service.request_cancel(slot, "user_cancel") is True
    assert slot.status == "cancelling" and slot.cancel_event.is_set()
    assert service.request_cancel(slot, "user_cancel") is False
    slots.release(slot)
    assert slots.get("s") is None and slot.released.is_set()


async def test_a_completing_turn_cannot_be_cancelled() -> None:
    slot = TurnSlots().claim("s", "t")
    assert slot is not None
    slot.status = "completing"
    assert TurnService.request_cancel(slot, "user_cancel") is False
    assert not slot.cancel_event.is_set()
