"""`CancelEvent`: a turn's cancel signal, which also calls back the moment it is set.

Code that must notice a cancel while it waits on something else (a provider's response, the
next piece of its stream) used to park a task in `Event.wait()` for the purpose: a task made,
started, and woken to end per model call. A callback registered on the event costs none of that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class CancelEvent(asyncio.Event):
    """An `asyncio.Event` whose `set` also runs the callbacks registered on it, once."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the event is set (callbacks run in the setter's stack, in the
        order they were added; an event already set does not run it)."""
        self._callbacks.append(callback)

    def remove_callback(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        for callback in list(self._callbacks):
            callback()
