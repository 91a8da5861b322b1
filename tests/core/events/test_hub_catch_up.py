"""The hub's catch-up state around the end of a message.

Between `message.complete` and the bus event naming the message (`llm.call_completed`), a new
client's snapshot stops at W (the message is not under it) and its live queue starts after the
message: only the catch-up can carry it then.
"""

from __future__ import annotations

from typing import Any

from metis.core.canonical.ids import new_ulid
from metis.core.events.envelope import Event, TransientEvent
from metis.core.events.hub import HubClient, SessionHub

SID, TURN = "sess_x", new_ulid()
USER_MESSAGE, ASSISTANT_MESSAGE = new_ulid(), new_ulid()


def bus(hub: SessionHub, seq: int, event_type: str, payload: dict[str, Any]) -> None:
    hub(Event(new_ulid(), seq, 0, SID, TURN, None, event_type, "system", payload))


def streaming(hub: SessionHub, event_type: str, **payload: Any) -> None:
    hub(TransientEvent(SID, TURN, None, event_type, {"message_id": ASSISTANT_MESSAGE, **payload}))


def handoff(hub: SessionHub) -> tuple[list[str], str]:
    point = hub.handoff_point(HubClient(SID, maxsize=100), None, new_ulid)
    return [e.type for e in point.catch_up], point.message_watermark


def test_a_completed_message_stays_in_catch_up_until_a_bus_event_names_it() -> None:
    hub = SessionHub()
    bus(hub, 1, "turn.started", {"user_message_id": USER_MESSAGE})
    streaming(hub, "message.start", model="m")
    streaming(hub, "text.delta", content_block_index=0, text="hel")
    assert handoff(hub) == (["message.start", "text.delta"], USER_MESSAGE)
    streaming(hub, "text.delta", content_block_index=0, text="lo")
    streaming(hub, "message.complete", final_content=[{"type": "text", "text": "hello"}])
    types, watermark = handoff(hub)
    assert types == ["message.start", "text.delta", "message.complete"]
    assert watermark == USER_MESSAGE  # the snapshot leaves the message out: catch-up has it
    bus(hub, 2, "llm.call_completed", {"message_id": ASSISTANT_MESSAGE})
    assert handoff(hub) == ([], ASSISTANT_MESSAGE)  # now the snapshot holds it


def test_a_terminal_event_clears_a_message_no_bus_event_named() -> None:
    hub = SessionHub()
    bus(hub, 1, "turn.started", {"user_message_id": USER_MESSAGE})
    streaming(hub, "message.start", model="m")
    streaming(hub, "message.complete", final_content=[])
    bus(hub, 2, "turn.failed", {})
    assert handoff(hub)[0] == []


def test_a_client_joining_after_a_dropped_call_ended_is_told_it_was_dropped() -> None:
    hub = SessionHub()
    bus(hub, 1, "turn.started", {"user_message_id": USER_MESSAGE})
    streaming(hub, "message.start", model="m")
    ids = {"content_block_index": 0, "tool_use_id": "tu_1"}
    streaming(hub, "tool.use_start", **ids, tool_name="write_file")
    streaming(hub, "tool.use_input_delta", **ids, partial_json='{"path": "a.txt", "con')
    streaming(hub, "tool.use_end", **ids, final_input={}, dropped=True)
    point = hub.handoff_point(HubClient(SID, maxsize=100), None, new_ulid)
    [end] = [e for e in point.catch_up if e.type == "tool.use_end"]
    assert end.payload["dropped"] is True and end.payload["final_input"] == {}
