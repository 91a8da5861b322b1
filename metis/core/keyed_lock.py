"""One holder at a time per key, with no lock kept for a key nobody holds or waits for.

Ending and purging a session each take several awaits (stopping its turn, closing its clients,
committing), and two of them on one session must not interleave: the second has to see what
the first left (an ended session to purge, or nothing at all). Locks are per key so that a
slow end (a shell command being killed) never holds up another session's; each is dropped
with its last user, so a daemon that ends thousands of sessions keeps none of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager


class KeyedLock:
    """`async with locks.hold(key):` runs its body alone among holders of the same key, in
    the order they asked."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        """How many keys are held or waited for (what stays in memory)."""
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
