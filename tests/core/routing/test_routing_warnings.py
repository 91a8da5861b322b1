"""Warnings, shadowing analysis and policy versions."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from metis.core.models.registry import ModelRegistry
from metis.core.routing.loader import EMPTY_POLICY_VERSION, validate_policy
from tests.core.routing.routing_kit import check_policy, make_registry


def warnings_of(registry: ModelRegistry, text: str) -> list[tuple[str, str]]:
    result = check_policy(text, registry)
    assert result.valid, result.errors
    return [(d.code, d.message) for d in result.diagnostics if d.severity == "warning"]


def two_rules(earlier: str, later: str, use_earlier: str = "haiku", use_later: str = "opus") -> str:
    return (
        "rules:\n"
        f"  - {{name: E, when: {earlier}, use: {use_earlier}}}\n"
        f"  - {{name: L, when: {later}, use: {use_later}}}\n"
    )


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("{}", "{message_length_gt: 3}"),
        ("{message_length_gt: 100}", "{message_length_gt: 200}"),
        ("{estimated_input_tokens_lt: 500}", "{estimated_input_tokens_lt: 100}"),
        ("{turn_index_gt: 1}", "{turn_index_gt: 1, has_images: true}"),
        ("{session_cost_usd_gt: '1.0'}", "{session_cost_usd_gt: 2}"),
        ("{message_contains_any: [a, B, c]}", "{message_contains_any: [b]}"),
        ("{mentions_file_extension: [py, toml]}", "{mentions_file_extension: [.TOML]}"),
        ("{workspace_path_glob: ['/a/**', '/b/**']}", "{workspace_path_glob: '/b/**'}"),
        ("{message_length_gt: 5}", "{all_of: [{message_length_gt: 10}, {has_images: true}]}"),
        ("{all_of: [{has_images: true}]}", "{has_images: true, turn_index_gt: 2}"),
        (
            "{any_of: [{has_images: true}, {turn_index_gt: 1}]}",
            "{any_of: [{turn_index_gt: 1}, {has_images: true}], message_length_gt: 1}",
        ),
        ("{not: {has_images: true}}", "{not: {has_images: true}, message_length_gt: 1}"),
        ("{message_matches: 'x'}", "{message_matches: 'x', has_images: false}"),
        (
            "{time_of_day_between: ['22:00', '06:00']}",
            "{time_of_day_between: ['22:00', '06:00'], has_images: true}",
        ),
    ],
)
def test_an_earlier_rule_covering_a_later_one_shadows_it(
    registry: ModelRegistry, earlier: str, later: str
) -> None:
    found = warnings_of(registry, two_rules(earlier, later))
    assert [code for code, _ in found] == ["shadowed_rule"]
    assert found[0][1] == (
        "rules[1] ('L') is shadowed by rules[0] ('E'): only used when anthropic:haiku is rejected; "
        "move it above 'E' to give it priority"
    )


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("{message_length_gt: 200}", "{message_length_gt: 100}"),
        ("{estimated_input_tokens_lt: 100}", "{estimated_input_tokens_lt: 500}"),
        ("{message_length_gt: 1, has_images: true}", "{message_length_gt: 1}"),
        ("{message_contains_any: [a]}", "{message_contains_any: [a, b]}"),
        ("{message_matches: 'x'}", "{message_matches: 'y'}"),
        ("{message_length_gt: 5}", "{any_of: [{message_length_gt: 10}, {has_images: true}]}"),
        ("{message_length_lt: 5}", "{message_length_gt: 5}"),
        ("{has_images: true}", "{has_images: false}"),
        ("{not: {message_length_gt: 5}}", "{not: {message_length_gt: 9}}"),
    ],
)
def test_rules_that_do_not_cover_raise_no_warning(
    registry: ModelRegistry, earlier: str, later: str
) -> None:
    assert warnings_of(registry, two_rules(earlier, later)) == []


def test_equal_when_with_a_different_model_is_the_fallback_idiom(registry: ModelRegistry) -> None:
    when = "{message_matches: '(?i)architecture', has_images: false}"
    assert warnings_of(registry, two_rules(when, when.replace("has_images: false, ", ""))) == []
    same = "{has_images: false, message_matches: '(?i)architecture'}"
    assert warnings_of(registry, two_rules(when, same)) == []


def test_covered_rule_with_the_same_model_is_a_duplicate(registry: ModelRegistry) -> None:
    found = warnings_of(registry, two_rules("{}", "{has_images: true}", "opus", "opus"))
    assert found == [
        (
            "duplicate_rule",
            "rules[1] ('L') can never be chosen: rules[0] ('E') matches whenever it does and uses "
            "the same model anthropic:opus",
        )
    ]
    equal = warnings_of(
        registry, two_rules("{has_images: true}", "{has_images: true}", "opus", "opus")
    )
    assert [code for code, _ in equal] == ["duplicate_rule"]


def test_every_covering_pair_is_reported(registry: ModelRegistry) -> None:
    text = """\
rules:
  - {name: A, when: {}, use: haiku}
  - {name: B, when: {has_images: true}, use: opus}
  - {name: C, when: {has_images: true}, use: opus}
"""
    found = warnings_of(registry, text)
    assert sorted((code, msg.split(":")[0]) for code, msg in found) == [
        ("duplicate_rule", "rules[2] ('C') can never be chosen"),
        ("shadowed_rule", "rules[1] ('B') is shadowed by rules[0] ('A')"),
        ("shadowed_rule", "rules[2] ('C') is shadowed by rules[0] ('A')"),
    ]


def test_workspace_rules_are_checked_before_global_rules(
    registry: ModelRegistry, tmp_path: Path
) -> None:
    text = f"""\
rules:
  - {{name: global, when: {{has_images: true}}, use: opus}}
workspaces:
  {tmp_path}:
    rules:
      - {{name: ws, when: {{}}, use: haiku}}
      - {{name: ws2, when: {{message_length_gt: 3}}, use: haiku}}
"""
    found = warnings_of(registry, text)
    key = f'workspaces["{tmp_path}"]'
    assert found == [  # document order of the shadowed rule
        (
            "shadowed_rule",
            f"rules[0] ('global') is shadowed by {key}.rules[0] ('ws') in workspace {tmp_path}: "
            "only used when anthropic:haiku is rejected; move it above 'ws' to give it priority",
        ),
        (
            "duplicate_rule",
            f"{key}.rules[1] ('ws2') can never be chosen: {key}.rules[0] ('ws') matches whenever it "
            "does and uses the same model anthropic:haiku",
        ),
    ]


def test_global_rules_never_shadow_workspace_rules(registry: ModelRegistry, tmp_path: Path) -> None:
    text = f"""\
rules:
  - {{name: all, when: {{}}, use: opus}}
workspaces:
  {tmp_path}:
    rules:
      - {{name: all, when: {{has_images: true}}, use: haiku}}
"""
    assert warnings_of(registry, text) == []


# ---- the other warning codes ---------------------------------------------------------------------


def test_references_to_unconfigured_models_load_with_a_warning() -> None:
    registry = make_registry({"ANTHROPIC_API_KEY": "k"})
    found = warnings_of(registry, "global_default: gpt5\nrules: [{when: {}, use: mini}]\n")
    assert found == [
        (
            "model_not_configured",
            "global_default references openai:gpt-5, which is not configured (no key: OPENAI_API_KEY is not set); "
            "turns will reject it",
        ),
        (
            "model_not_configured",
            "rules[0].use references openai:mini, which is not configured (no key: OPENAI_API_KEY is not set); "
            "turns will reject it",
        ),
    ]


def test_a_reference_unconfigured_offline_names_metis_offline() -> None:
    registry = make_registry({"ANTHROPIC_API_KEY": "k", "METIS_OFFLINE": "1"})
    found = warnings_of(registry, "global_default: haiku\n")
    assert found == [
        (
            "model_not_configured",
            "global_default references anthropic:haiku, which is not configured "
            "(METIS_OFFLINE=1); turns will reject it",
        )
    ]


def test_a_regex_whose_backtracking_can_explode_is_flagged(registry: ModelRegistry) -> None:
    """`(a+)+$` against "aaaa…b" takes exponential time on the daemon's event loop."""
    text = (
        "rules:\n"
        "  - {name: a, when: {message_matches: '^(a+)+$'}, use: haiku}\n"
        "  - {name: b, when: {not: {message_matches: '(\\w+\\s?)*!'}}, use: opus}\n"
        "  - {name: c, when: {message_matches: '(?i)\\b(commit|push)+ (a|the)? ?msg'}, use: haiku}\n"
    )
    found = [(code, message.split(":")[0]) for code, message in warnings_of(registry, text)]
    assert found == [
        ("regex_backtracking", "rules[0].when.message_matches"),
        ("regex_backtracking", "rules[1].when.not.message_matches"),
    ]


def test_use_and_default_targets_without_tool_support_warn(
    registry: ModelRegistry, tmp_path: Path
) -> None:
    text = f"""\
global_default: small
rules: [{{when: {{}}, use: small}}]
workspaces:
  {tmp_path}: {{default: small}}
"""
    found = warnings_of(registry, text)
    assert [code for code, _ in found] == ["model_without_tools", "model_without_tools"]
    assert found[0][1].startswith(
        "rules[0].use references ollama:small:3b, which does not support tools"
    )


def test_missing_workspace_directories_and_the_pattern_block_warn(
    registry: ModelRegistry, tmp_path: Path
) -> None:
    text = f"""\
workspaces:
  {tmp_path}/absent: {{default: haiku}}
pattern: {{enabled: true, cost_weight: 0.5, min_confidence: 0, min_sample_size: 3}}
"""
    result = check_policy(text, registry)
    assert [d.code for d in result.diagnostics] == ["workspace_missing", "pattern_reserved"]
    assert result.warnings[0].endswith("the scope matches nothing until it exists (line 2)")
    assert result.policy is not None
    assert result.policy.pattern.describe() == {
        "enabled": True,
        "cost_weight": 0.5,
        "min_confidence": 0,
        "min_sample_size": 3,
    }


# ---- versions ------------------------------------------------------------------------------------


def test_version_is_the_sha256_of_the_exact_bytes(registry: ModelRegistry) -> None:
    raw = b"schema_version: 1\nrules: []\n"
    result = validate_policy(raw, registry)
    assert result.version == hashlib.sha256(raw).hexdigest()
    assert len(result.version) == 64 and result.version == result.version.lower()
    assert result.policy is not None and result.policy.version == result.version
    commented = validate_policy(raw + b"# a comment\n", registry)
    assert commented.version != result.version
    assert hashlib.sha256(b"").hexdigest() == EMPTY_POLICY_VERSION
