"""The per-session path order of write-class tool uses.

Write-class tool uses whose resolved paths are equal run one after another in tool_use order.
The order is fixed when a batch is planned, not when each tool use reaches its slot: the
dispatcher enqueues every write of a batch here, in tool_use order and without an `await` in
between, before any of them asks for a confirmation. A tool use may run once it heads the queue
of each of its paths; it leaves the queues when it has finished running or has ended without
running (denied, timed out, cancelled), so a later write never overtakes an earlier one whose
confirmation is still pending, and one that drops out does not hold up the rest.

Keys are opaque (the dispatcher uses `(session_id, real_path)`). Everything here is synchronous
and runs on the event loop; waiting is `PathTurn.ready`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field


@dataclass(eq=False)
class PathTurn:
    """One tool use's place in the queues of its paths; `ready` is set once it heads them all."""

    keys: tuple[Hashable, ...]
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    released: bool = False


class PathOrder:
    """The queues of write-class tool uses per path key, in tool_use order, for one dispatcher."""

    def __init__(self) -> None:
        self._queues: dict[Hashable, list[PathTurn]] = {}

    def enqueue(self, keys: Iterable[Hashable]) -> PathTurn | None:
        """Append a tool use to the queue of each key (duplicates once); None without keys."""
        unique = tuple(dict.fromkeys(keys))
        if not unique:
            return None
        turn = PathTurn(unique)
        for key in unique:
            self._queues.setdefault(key, []).append(turn)
        self._wake(turn)
        return turn

    def release(self, turn: PathTurn | None) -> None:
        """Leave every queue (idempotent) and let the next tool use of each path go."""
        if turn is None or turn.released:
            return
        turn.released = True
        heads: list[PathTurn] = []
        for key in turn.keys:
            queue = self._queues.get(key)
            if queue is None or turn not in queue:
                continue
            queue.remove(turn)
            if queue:
                heads.append(queue[0])
            else:
                del self._queues[key]
        for head in heads:
            self._wake(head)

    def forget(self, matches: Callable[[Hashable], bool]) -> None:
        """Drop the queues of matching keys; whoever still waits in them is let go."""
        for key in [k for k in self._queues if matches(k)]:
            for turn in self._queues.pop(key):
                turn.ready.set()

    def pending(self) -> int:
        """How many paths have a queue (for tests and diagnostics)."""
        return len(self._queues)

    def _wake(self, turn: PathTurn) -> None:
        if turn.released or turn.ready.is_set():
            return
        if all((queue := self._queues.get(key)) is None or queue[0] is turn for key in turn.keys):
            turn.ready.set()
