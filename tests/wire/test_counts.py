"""Counts read as English: the singular for one, the plural otherwise (pure functions)."""

from __future__ import annotations

from typing import Any

import pytest

from metis.wire.counts import counted, tokens_in, turn_totals


@pytest.mark.parametrize(
    ("n", "said"),
    [(0, "0 turns"), (1, "1 turn"), (2, "2 turns"), (11, "11 turns"), (-1, "-1 turns")],
)
def test_a_count_takes_the_singular_for_one_and_the_plural_otherwise(n: int, said: str) -> None:
    assert counted(n, "turn") == said


def test_an_irregular_plural_is_given() -> None:
    assert counted(1, "tool run", "tools run") == "1 tool run"
    assert counted(3, "tool run", "tools run") == "3 tools run"
    assert counted(2, "entry", "entries") == "2 entries"


@pytest.mark.parametrize(
    ("payload", "said"),
    [
        (
            {"llm_call_count": 1, "tool_call_count": 3, "total_cost_usd": "0.0012"},
            "1 model call · 3 tools run · $0.0012",
        ),
        (
            {"llm_call_count": 2, "tool_call_count": 1, "total_cost_usd": "0"},
            "2 model calls · 1 tool run · $0",
        ),
        (
            {"llm_call_count": 0, "tool_call_count": 0, "total_cost_usd": "0"},
            "0 model calls · 0 tools run · $0",
        ),
        ({}, "0 model calls · 0 tools run · $0"),  # a failed turn's payload may lack counts
        (
            {"llm_call_count": None, "tool_call_count": None, "total_cost_usd": None},
            "0 model calls · 0 tools run · $0",
        ),
    ],
)
def test_a_turns_totals_count_its_model_calls_the_tools_run_and_its_cost(
    payload: dict[str, Any], said: str
) -> None:
    assert turn_totals(payload) == said


def test_the_tokens_read_count_those_read_from_and_written_to_the_cache() -> None:
    usage = {"input_tokens": 12, "cache_read_tokens": 5000, "cache_write_tokens": 300}
    assert tokens_in({**usage, "output_tokens": 7}) == 5312
    assert tokens_in({"input_tokens": 4}) == 4  # an older event without the cache buckets
    assert tokens_in({"input_tokens": None}) == 0  # a run interrupted before its end
