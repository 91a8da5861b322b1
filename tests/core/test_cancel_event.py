"""CancelEvent: an asyncio.Event that calls back when set."""

from __future__ import annotations

import asyncio

from metis.core.cancel_event import CancelEvent


async def test_set_runs_each_callback_once_in_order_and_wakes_waiters() -> None:
    event = CancelEvent()
    calls: list[str] = []
    event.add_callback(lambda: calls.append("first"))
    event.add_callback(lambda: calls.append("second"))
    waiter = asyncio.ensure_future(event.wait())
    await asyncio.sleep(0)
    event.set()
    assert calls == ["first", "second"]  # at once, in the setter's stack
    event.set()  # already set: nothing runs again
    assert calls == ["first", "second"]
    assert await waiter is True


async def test_a_removed_callback_does_not_run() -> None:
    event = CancelEvent()
    calls: list[str] = []

    def callback() -> None:
        calls.append("ran")

    event.add_callback(callback)
    event.remove_callback(callback)
    event.remove_callback(callback)  # removing twice is harmless
    event.set()
    assert calls == []


async def test_a_callback_may_remove_itself_while_the_event_is_being_set() -> None:
    event = CancelEvent()
    calls: list[str] = []

    def once() -> None:
        calls.append("once")
        event.remove_callback(once)

    event.add_callback(once)
    event.add_callback(lambda: calls.append("after"))
    event.set()
    assert calls == ["once", "after"]
