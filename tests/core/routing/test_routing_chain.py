"""The compiled rule chain matches exactly the rules their closures match, and runs no policy text."""

from __future__ import annotations

import json
import random
import re
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest

from metis.core.models.registry import ModelRegistry
from metis.core.routing.predicates import Facts, compile_chain
from tests.core.routing.routing_kit import make_ctx, make_policy, make_registry

LEAVES = [
    "{{message_matches: '(?i)\\\\b{word}\\\\b'}}",
    "{{message_contains_any: [{word}, zz]}}",
    "{{message_length_gt: {n}}}",
    "{{message_length_lt: {n}}}",
    "{{estimated_input_tokens_gt: {big}}}",
    "{{turn_index_lt: {small}}}",
    "{{has_images: {flag}}}",
    "{{has_tool_calls_in_history: {flag}}}",
    "{{tool_use_in_progress: {flag}}}",
    "{{mentions_file_extension: [py, md]}}",
    '{{workspace_path_glob: "/work/{word}/**"}}',
    '{{session_cost_usd_gt: "0.{small}"}}',
    '{{time_of_day_between: ["{small:02d}:00", "{n_hour:02d}:30"]}}',
]
WORDS = ["alpha", "beta", "gamma", "project"]


def _leaf(rng: random.Random) -> str:
    return rng.choice(LEAVES).format(
        word=rng.choice(WORDS),
        n=rng.randint(0, 40),
        big=rng.randint(0, 3000),
        small=rng.randint(0, 9),
        n_hour=rng.randint(10, 23),
        flag=rng.choice(["true", "false"]),
    )


def _when(rng: random.Random, depth: int = 0) -> str:
    """A `when` flow mapping: leaves, and combinators nested up to three levels."""
    roll = rng.random()
    if depth < 3 and roll < 0.15:
        return f"{{not: {_when(rng, depth + 1)}}}"
    if depth < 3 and roll < 0.35:
        key = rng.choice(["all_of", "any_of"])
        items = ", ".join(_when(rng, depth + 1) for _ in range(rng.randint(1, 3)))
        return f"{{{key}: [{items}]}}"
    if depth == 0 and roll < 0.45:
        return "{}"  # the catch-all; nested empty mappings are refused
    leaves = [_leaf(rng)[1:-1] for _ in range(rng.randint(1, 2))]
    keys = {leaf.split(":", 1)[0] for leaf in leaves}
    return "{" + ", ".join(leaves[: len(keys)]) + "}"


def _contexts(rng: random.Random) -> list[dict[str, object]]:
    return [
        {
            "message_text": " ".join(rng.choices([*WORDS, "x.py", "notes.md", "ZZ"], k=5)),
            "workspace_path": f"/work/{rng.choice(WORDS)}/src",
            "estimated_input_tokens": rng.randint(0, 3000),
            "turn_index": rng.randint(0, 9),
            "image_count": rng.randint(0, 1),
            "has_tool_calls_in_history": rng.random() < 0.5,
            "tool_use_in_progress": rng.random() < 0.5,
            "session_cost_usd": Decimal(rng.randint(0, 99)) / 100,
            "now": datetime(2026, 5, 8, rng.randint(0, 23), rng.randint(0, 59)),
        }
        for _ in range(25)
    ]


@pytest.fixture(scope="module")
def registry() -> ModelRegistry:
    return make_registry()


@pytest.mark.parametrize("seed", range(20))
def test_the_chain_yields_exactly_the_rules_whose_closures_match(
    seed: int, registry: ModelRegistry
) -> None:
    rng = random.Random(seed)
    rules = "".join(f"  - when: {_when(rng)}\n    use: haiku\n" for _ in range(30))
    policy = make_policy(f"rules:\n{rules}", registry)
    chain, ordered = policy.rules_in_order(None)
    for ctx in _contexts(rng):
        expected = [i for i, r in enumerate(ordered) if r.when.test(Facts(make_ctx(**ctx)))]
        assert list(chain(Facts(make_ctx(**ctx)))) == expected


def test_policy_text_shaped_like_code_stays_data(registry: ModelRegistry, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    hostile = [f'") or {payload} or ("', f"') or {payload} or ('", f"{{k}} {payload}"]
    rules = "".join(
        f"  - when: {{message_matches: {json.dumps(re.escape(text))}}}\n    use: haiku\n"
        f"  - when: {{message_contains_any: [{json.dumps(text)}]}}\n    use: haiku\n"
        for text in hostile
    )
    policy = make_policy(f"rules:\n{rules}", registry)
    chain, _ = policy.rules_in_order(None)
    assert list(chain(Facts(make_ctx(message_text="nothing to see")))) == []
    assert list(chain(Facts(make_ctx(message_text=hostile[2])))) == [4, 5]
    assert not marker.exists()


def test_a_policy_without_rules_yields_nothing() -> None:
    assert list(compile_chain([])(Facts(make_ctx()))) == []
