"""PrefixCache: work over a growing sequence is carried forward, matched by identity only."""

from __future__ import annotations

from collections.abc import Sequence

from metis.core.turns.prefix_cache import PrefixCache


def test_the_longest_remembered_prefix_is_found() -> None:
    a, b, c, d = ["a"], ["b"], ["c"], ["d"]
    memo: PrefixCache[str] = PrefixCache()
    memo.remember([a], "1")
    memo.remember([c], "other")
    memo.remember([a, b, c], "3")
    assert memo.longest_prefix([a, b, c, d]) == (3, "3")
    assert memo.longest_prefix([a, b, c]) == (3, "3")
    assert memo.longest_prefix([a, d]) == (0, None)  # [a] was replaced by [a, b, c]
    assert memo.longest_prefix([c, a]) == (1, "other")
    assert memo.longest_prefix([]) == (0, None)


def test_items_are_matched_by_identity_not_equality() -> None:
    memo: PrefixCache[str] = PrefixCache()
    memo.remember([["a"], ["b"]], "state")
    assert memo.longest_prefix([["a"], ["b"]]) == (0, None)


def test_an_entry_is_dropped_when_extended_and_the_oldest_past_the_size() -> None:
    items = [[i] for i in range(5)]
    memo: PrefixCache[int] = PrefixCache(size=2)
    memo.remember(items[:2], 2)
    memo.remember(items[:4], 4)  # extends the first: replaces it
    memo.remember([items[4]], 1)
    assert memo.longest_prefix(items[:3]) == (0, None)
    assert memo.longest_prefix(items) == (4, 4)
    memo.remember([items[3]], 0)  # third entry: the oldest goes
    assert memo.longest_prefix(items) == (0, None)
    assert memo.longest_prefix([items[4]]) == (1, 1)


def test_extend_carries_the_state_on_over_the_new_items_only() -> None:
    a, b, c = ["a"], ["b"], ["c"]
    seen: list[int] = []

    def count(state: int | None, rest: Sequence[list[str]]) -> int:
        seen.append(len(rest))
        return (state or 0) + len(rest)

    memo: PrefixCache[int] = PrefixCache()
    assert memo.extend([a, b], count) == 2
    assert memo.extend([a, b, c], count) == 3  # [a, b] remembered: only c is looked at
    assert memo.extend([a, b, c], count) == 3  # nothing new
    assert memo.extend([c], count) == 1  # no remembered prefix: from the start
    assert seen == [2, 1, 0, 1]
