"""PrefixCache: carry work over a growing history forward instead of redoing it every turn.

A session's history only grows, so what a turn computes over it (the token estimate, the
assembled context) can start from what an earlier call computed over a prefix of it; only the
new messages cost anything. Without this, every turn of a long session paid for all the turns
before it, several times over.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")


class PrefixCache(Generic[S]):
    """A state remembered for each of a few recent sequences, found again for any sequence
    that starts with one of them.

    Items are compared by identity (never `==`: two equal messages may still differ in what
    equality ignores), and must not change after being remembered — canonical messages,
    content lists and tool definitions are immutable. The memo holds its sequences, so they
    stay alive until pushed out by `size` newer ones; a session needs one or two entries, and
    a miss only costs what the work cost without the memo.
    """

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._entries: list[tuple[tuple[object, ...], S]] = []  # most recent first

    def longest_prefix(self, items: Sequence[object]) -> tuple[int, S | None]:
        """(length, state) of the longest remembered sequence `items` starts with, or (0, None)."""
        best: tuple[int, S | None] = (0, None)
        for seen, state in self._entries:
            n = len(seen)
            if (
                best[0] < n <= len(items)
                and items[n - 1] is seen[-1]  # cheap rejection before the full comparison
                and all(map(operator.is_, items, seen))
            ):
                best = (n, state)
        return best

    def extend(self, items: Sequence[T], more: Callable[[S | None, Sequence[T]], S]) -> S:
        """The state over `items`, carried on from the longest remembered prefix: `more(its state,
        or None, the items after it)`; remembered for the longer sequences still to come."""
        known, state = self.longest_prefix(items)
        result = more(state, items[known:])
        if known < len(items):
            self.remember(items, result)
        return result

    def remember(self, items: Sequence[object], state: S) -> None:
        """Store `state` for `items`, dropping the entries it extends or repeats."""
        if not items:
            return
        seen = tuple(items)
        self._entries = [
            (old, old_state)
            for old, old_state in self._entries
            if not (
                len(old) <= len(seen)
                and seen[len(old) - 1] is old[-1]
                and all(map(operator.is_, seen, old))
            )
        ]
        self._entries.insert(0, (seen, state))
        del self._entries[self._size :]
