"""Routing decision time with a 200-rule policy (goal: p50 ≤ 50 µs; contract: ≤ 5 ms at 100).

Builds a registry from the shipped `metis/defaults/models.yaml` with dummy keys and a synthetic
policy mixing every predicate kind, where the turn matches only late rules, so nearly every rule
is evaluated on each decision. Run: `.venv/bin/python scripts/bench_routing.py [--rules N]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime
from decimal import Decimal

from metis.config import SHIPPED_CONFIG_DIR
from metis.core.models.registry import load_models_file
from metis.core.routing import Availability, RoutingEngine, StaticPolicy, TurnContext
from metis.core.routing.loader import validate_policy

MODELS = ["haiku", "sonnet", "opus", "gpt5", "mini"]


def synthetic_policy(count: int) -> bytes:
    """`count` rules cycling through the predicate vocabulary; a catch-all comes last."""
    shapes = [
        "message_matches: '(?i)\\\\bdeploy{i}\\\\b'",
        'message_contains_any: ["needle{i}", "haystack{i}"]',
        "message_length_gt: {big}",
        "estimated_input_tokens_gt: {big}",
        "mentions_file_extension: [ext{i}, x{i}]",
        'workspace_path_glob: "/srv/project{i}/**"',
        "turn_index_gt: {big}",
        'session_cost_usd_gt: "{big}.50"',
        "has_images: true",
        "all_of: [{{message_length_lt: 5}}, {{has_tool_calls_in_history: true}}]",
        "any_of: [{{message_matches: 'zz{i}'}}, {{turn_index_lt: 1}}]",
        "not: {{message_length_lt: {big}}}",
    ]
    lines = ["schema_version: 1", "global_default: sonnet", "rules:"]
    for i in range(count - 1):
        when = shapes[i % len(shapes)].format(i=i, big=100_000 + i)
        lines += [f"  - name: rule {i}", f"    when: {{{when}}}", f"    use: {MODELS[i % 5]}"]
    lines += ["  - name: catch-all", "    when: {}", "    use: haiku"]
    return ("\n".join(lines) + "\n").encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rules", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=20_000)
    args = parser.parse_args()

    env = {"ANTHROPIC_API_KEY": "bench", "OPENAI_API_KEY": "bench"}
    registry = load_models_file(SHIPPED_CONFIG_DIR / "models.yaml", env=env).registry
    assert registry is not None
    check = validate_policy(synthetic_policy(args.rules), registry)
    assert check.policy is not None, check.errors
    engine = RoutingEngine(registry, StaticPolicy(check.policy), Availability(registry))
    ctx = TurnContext(
        session_id="sess_bench",
        turn_id="turn",
        turn_index=3,
        workspace_path="/home/user/code/app",
        message_text="Please refactor the parser in src/parse.py and update the tests.",
        tools_offered=6,
        session_cost_usd=Decimal("0.42"),
        now=datetime(2026, 5, 8, 14, 30).astimezone(),
        estimated_input_tokens=5120,
    )
    for _ in range(500):  # warm-up
        engine.decide(ctx)
    samples = []
    for _ in range(args.iterations):
        start = time.perf_counter_ns()
        decision = engine.decide(ctx)
        samples.append((time.perf_counter_ns() - start) / 1000)
    samples.sort()
    p50 = statistics.median(samples)
    p95 = samples[int(len(samples) * 0.95)]
    print(f"rules={args.rules} iterations={args.iterations} chosen={decision.chosen_model}")
    print(f"decide p50 = {p50:.1f} µs, p95 = {p95:.1f} µs (goal p50 ≤ 50 µs)")


if __name__ == "__main__":
    main()
