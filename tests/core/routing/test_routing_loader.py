"""routing.yaml validation and the predicate vocabulary."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from metis.config import SHIPPED_CONFIG_DIR
from metis.core.models.registry import ModelRegistry, load_models_file
from metis.core.routing.loader import EMPTY_POLICY_VERSION, validate_policy
from metis.core.routing.predicates import MAX_TEXT_CHARS, Facts
from tests.core.routing.routing_kit import check_policy, make_ctx, make_policy, make_registry

EXAMPLES = Path(__file__).resolve().parents[2] / "fixtures"


def matches(registry: ModelRegistry, when: str, **ctx: Any) -> bool:
    """The rule's closure and the policy's compiled chain must agree on every case."""
    policy = make_policy(f"rules:\n  - when: {when}\n    use: haiku\n", registry)
    by_test = policy.rules[0].when.test(Facts(make_ctx(**ctx)))
    chain, _ = policy.rules_in_order(None)
    assert list(chain(Facts(make_ctx(**ctx)))) == ([0] if by_test else [])
    return by_test


def errors_of(registry: ModelRegistry, text: str) -> list[str]:
    result = check_policy(text, registry)
    assert not result.valid
    return result.errors


def rule_errors(registry: ModelRegistry, when: str) -> list[str]:
    return errors_of(registry, f"rules:\n  - when: {when}\n    use: haiku\n")


# ---- predicates: each one true and false ---------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "ctx", "expected"),
    [
        ("{message_matches: '^/commit\\b'}", {"message_text": "/commit now"}, True),
        ("{message_matches: '^/commit\\b'}", {"message_text": "please /commit"}, False),
        ("{message_matches: 'Design'}", {"message_text": "design"}, False),
        ("{message_matches: '(?i)Design'}", {"message_text": "design"}, True),
        (
            "{message_contains_any: [Changelog, 'RELEASE note']}",
            {"message_text": "a release NOTE"},
            True,
        ),
        ("{message_contains_any: [changelog]}", {"message_text": "nothing here"}, False),
        ("{message_contains_any: [straße]}", {"message_text": "STRASSE"}, True),
        ("{message_length_gt: 5}", {"message_text": "123456"}, True),
        ("{message_length_gt: 5}", {"message_text": "12345"}, False),
        ("{message_length_lt: 5}", {"message_text": "1234"}, True),
        ("{message_length_lt: 5}", {"message_text": "12345"}, False),
        ("{estimated_input_tokens_gt: 1000}", {"estimated_input_tokens": 1001}, True),
        ("{estimated_input_tokens_gt: 1000}", {"estimated_input_tokens": 1000}, False),
        ("{estimated_input_tokens_lt: 1000}", {"estimated_input_tokens": 999}, True),
        ("{estimated_input_tokens_lt: 1000}", {"estimated_input_tokens": 1000}, False),
        ("{has_images: true}", {"image_count": 1}, True),
        ("{has_images: true}", {"image_count": 0}, False),
        ("{has_images: false}", {"image_count": 0}, True),
        ("{mentions_file_extension: [toml, .YAML]}", {"message_text": "edit pyproject.toml"}, True),
        ("{mentions_file_extension: [yaml]}", {"message_text": "see ~/cfg/A.Yaml, ok"}, True),
        ("{mentions_file_extension: [yaml]}", {"message_text": "no extension yaml here"}, False),
        ("{mentions_file_extension: [tar]}", {"message_text": "unpack x.tar.gz"}, False),
        ("{mentions_file_extension: [gz]}", {"message_text": "unpack x.tar.gz"}, True),
        ("{mentions_file_extension: [py]}", {"message_text": "run x.pyc"}, False),
        ("{mentions_file_extension: [c++]}", {"message_text": "main.c++ please"}, True),
        ("{workspace_path_glob: '/work/**'}", {"workspace_path": "/work"}, True),
        ("{workspace_path_glob: '/work/**'}", {"workspace_path": "/work/a/b"}, True),
        ("{workspace_path_glob: '/work/**'}", {"workspace_path": "/workshop"}, False),
        ("{workspace_path_glob: '/work/*'}", {"workspace_path": "/work/a/b"}, False),
        ("{workspace_path_glob: '/work/?'}", {"workspace_path": "/work/a"}, True),
        ("{workspace_path_glob: '/w/**/src'}", {"workspace_path": "/w/src"}, True),
        ("{workspace_path_glob: '/w/**/src'}", {"workspace_path": "/w/a/b/src"}, True),
        ("{workspace_path_glob: ['/x/*', '/w/[ab]*']}", {"workspace_path": "/w/beta"}, True),
        ("{workspace_path_glob: '/w/[!ab]*'}", {"workspace_path": "/w/beta"}, False),
        ("{turn_index_gt: 2}", {"turn_index": 3}, True),
        ("{turn_index_gt: 2}", {"turn_index": 2}, False),
        ("{turn_index_lt: 2}", {"turn_index": 1}, True),
        ("{turn_index_lt: 2}", {"turn_index": 2}, False),
        ("{has_tool_calls_in_history: true}", {"has_tool_calls_in_history": True}, True),
        ("{has_tool_calls_in_history: true}", {"has_tool_calls_in_history": False}, False),
        ("{tool_use_in_progress: true}", {"tool_use_in_progress": True}, True),
        ("{tool_use_in_progress: false}", {"tool_use_in_progress": True}, False),
        ("{session_cost_usd_gt: '5.00'}", {"session_cost_usd": Decimal("5.01")}, True),
        ("{session_cost_usd_gt: 5}", {"session_cost_usd": Decimal("5")}, False),
        ("{time_of_day_between: ['09:00', '17:00']}", {"now": datetime(2026, 1, 1, 9, 0)}, True),
        ("{time_of_day_between: ['09:00', '17:00']}", {"now": datetime(2026, 1, 1, 17, 0)}, False),
        ("{time_of_day_between: ['22:00', '06:00']}", {"now": datetime(2026, 1, 1, 23, 59)}, True),
        ("{time_of_day_between: ['22:00', '06:00']}", {"now": datetime(2026, 1, 1, 5, 59)}, True),
        ("{time_of_day_between: ['22:00', '06:00']}", {"now": datetime(2026, 1, 1, 12, 0)}, False),
        (
            "{all_of: [{message_length_gt: 1}, {message_length_lt: 9}]}",
            {"message_text": "abc"},
            True,
        ),
        (
            "{all_of: [{message_length_gt: 1}, {message_length_lt: 2}]}",
            {"message_text": "abc"},
            False,
        ),
        ("{any_of: [{message_length_lt: 1}, {has_images: false}]}", {"message_text": "abc"}, True),
        ("{any_of: [{message_length_lt: 1}, {has_images: true}]}", {"message_text": "abc"}, False),
        ("{not: {message_length_lt: 2}}", {"message_text": "abc"}, True),
        ("{not: {message_length_lt: 9}}", {"message_text": "abc"}, False),
        ("{message_length_gt: 1, has_images: true}", {"message_text": "abc"}, False),
        ("{}", {}, True),
    ],
)
def test_each_predicate_holds_exactly_when_documented(
    registry: ModelRegistry, when: str, ctx: dict[str, Any], expected: bool
) -> None:
    assert matches(registry, when, **ctx) is expected


def test_time_of_day_uses_daemon_local_time_of_an_aware_now(registry: ModelRegistry) -> None:
    local_noon = datetime(2026, 1, 1, 12, 0).astimezone()
    as_utc = local_noon.astimezone(UTC)
    assert matches(registry, "{time_of_day_between: ['12:00', '12:01']}", now=as_utc)


def test_text_predicates_see_only_the_first_65536_code_points(registry: ModelRegistry) -> None:
    text = "a" * MAX_TEXT_CHARS + "NEEDLE"
    assert not matches(registry, "{message_matches: NEEDLE}", message_text=text)
    assert not matches(registry, "{message_contains_any: [needle]}", message_text=text)
    assert matches(registry, "{message_matches: 'a$'}", message_text=text)


def test_length_predicates_measure_the_whole_message(registry: ModelRegistry) -> None:
    """The code-point length of the message text, not of the searched part."""
    text = "é" * (MAX_TEXT_CHARS + 6)
    assert matches(registry, "{message_length_gt: 65541}", message_text=text)
    assert not matches(registry, "{message_length_gt: 65542}", message_text=text)
    assert matches(registry, "{message_length_lt: 65543}", message_text=text)
    assert not matches(registry, "{message_length_lt: 65537}", message_text=text)
    assert matches(
        registry,
        "{all_of: [{message_length_gt: 65536}, {not: {message_length_lt: 9}}]}",
        message_text=text,
    )


def test_tilde_in_globs_is_expanded_at_load(registry: ModelRegistry) -> None:
    home = os.path.expanduser("~")
    assert matches(
        registry, "{workspace_path_glob: '~/scratch/**'}", workspace_path=f"{home}/scratch/x"
    )
    policy = make_policy("rules: [{when: {workspace_path_glob: '~/s/**'}, use: haiku}]", registry)
    assert policy.rules[0].when.to_yaml() == {"workspace_path_glob": f"{home}/s/**"}


# ---- type rules and value errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "code_fragment"),
    [
        ("{message_length_gt: true}", "expected an integer, got boolean"),
        ("{message_length_gt: 1.5}", "expected an integer, got number"),
        ("{message_length_gt: -1}", "must be at least 0"),
        ("{turn_index_lt: '3'}", "expected an integer, got string"),
        ("{has_images: 'yes'}", "expected a boolean (true or false), got string"),
        ("{has_images: 1}", "expected a boolean (true or false), got integer"),
        ("{message_contains_any: [a, 3]}", "message_contains_any[1]: expected a non-empty string"),
        ("{message_contains_any: ['']}", "message_contains_any[0]: must not be empty"),
        ("{message_contains_any: []}", "message_contains_any: must not be empty"),
        ("{message_contains_any: abc}", "expected a list, got string"),
        ("{mentions_file_extension: ['..py']}", "is not a file extension"),
        ("{mentions_file_extension: [[py]]}", "expected a non-empty string, got list"),
        ("{session_cost_usd_gt: true}", "expected a number or numeric string, got boolean"),
        ("{session_cost_usd_gt: 'lots'}", "expected a number or numeric string, got string"),
        ("{session_cost_usd_gt: -1}", "must not be negative"),
        ("{message_matches: '(unclosed'}", "invalid regex"),
        ("{message_matches: 5}", "expected a string, got integer"),
        ("{workspace_path_glob: 'relative/**'}", "must be an absolute path after ~ expansion"),
        ("{workspace_path_glob: '/a/{b,c}'}", "brace expansion is not supported"),
        ("{workspace_path_glob: '/a/[bc'}", "unterminated character class"),
        ("{workspace_path_glob: []}", "must not be empty"),
        ("{time_of_day_between: ['9:00', '17:00']}", 'expected ["HH:MM", "HH:MM"]'),
        ("{time_of_day_between: ['24:00', '17:00']}", 'expected ["HH:MM", "HH:MM"]'),
        ("{time_of_day_between: ['10:00', '10:00']}", "different start and end"),
        ("{time_of_day_between: ['10:00']}", 'expected ["HH:MM", "HH:MM"]'),
        ("{any_of: []}", "any_of: must not be empty"),
        ("{all_of: [{}]}", "all_of[0]: must not be empty"),
        ("{not: {}}", "not: must not be empty"),
        ("{any_of: {message_length_gt: 1}}", "expected a list, got mapping"),
    ],
)
def test_predicate_values_are_type_checked(
    registry: ModelRegistry, when: str, code_fragment: str
) -> None:
    found = rule_errors(registry, when)
    assert len(found) == 1, found
    assert found[0].startswith("rules[0].when.")
    assert code_fragment in found[0]


def test_unknown_predicate_suggests_the_close_one(registry: ModelRegistry) -> None:
    text = "schema_version: 1\nrules:\n  - name: x\n    use: haiku\n    when:\n      message_maches: a\n"
    result = check_policy(text, registry)
    assert result.errors == [
        "rules[0].when: unknown predicate 'message_maches'; did you mean 'message_matches'? (line 6)"
    ]
    assert result.diagnostics[0].code == "unknown_predicate"


def test_nesting_deeper_than_eight_is_an_error(registry: ModelRegistry) -> None:
    eight = "{message_length_gt: 1}"
    for _ in range(8):
        eight = f"{{not: {eight}}}"
    assert matches(registry, eight, message_text="abc")
    found = rule_errors(registry, f"{{not: {eight}}}")
    assert len(found) == 1 and "nested deeper than 8" in found[0]


def test_empty_when_matches_every_turn(registry: ModelRegistry) -> None:
    assert matches(registry, "{}", message_text="", image_count=3, turn_index=99)


# ---- rules, tiers, workspaces, references -------------------------------------------------------


def test_rule_keys_are_closed_and_names_unique_per_list(registry: ModelRegistry) -> None:
    text = """\
rules:
  - {name: a, when: {}, use: haiku}
  - {name: a, when: {}, use: opus}
  - {when: {}, use: haiku, fallback: [opus]}
  - {name: '', when: {}, use: haiku}
  - {use: haiku}
workspaces:
  /tmp:
    rules:
      - {name: a, when: {}, use: haiku}
"""
    assert errors_of(registry, text) == [
        "rules[1].name: duplicate rule name 'a' (also rules[0]) (line 3)",
        "rules[2]: unknown key 'fallback' (allowed: name, description, when, use) (line 4)",
        "rules[3].name: must not be empty (line 5)",
        "rules[4]: missing required key 'when' (line 6)",
    ]


def test_default_rule_names_use_the_index_in_their_list(registry: ModelRegistry) -> None:
    policy = make_policy(
        "rules: [{when: {}, use: haiku}, {when: {has_images: true}, use: opus}]", registry
    )
    assert [r.name for r in policy.rules] == ["rule_0", "rule_1"]


def test_tiers_need_all_three_keys_or_none(registry: ModelRegistry) -> None:
    assert errors_of(registry, "tiers: {fast: haiku, deep: opus}\n") == [
        "tiers: give all of fast, balanced and deep or none (missing: balanced) (line 1)"
    ]
    assert errors_of(registry, "tiers: {fast: haiku, balanced: sonnet, deep: opus, huge: gpt5}\n")[
        0
    ].startswith("tiers: unknown key 'huge'")


def test_references_are_canonicalised_everywhere(registry: ModelRegistry, tmp_path: Path) -> None:
    text = f"""\
global_default: SONNET
tiers: {{fast: haiku, balanced: sonnet, deep: opus}}
rules: [{{when: {{}}, use: gpt5}}]
workspaces:
  {tmp_path}:
    default: mini
    tiers: {{fast: mini, balanced: gpt5, deep: openai:gpt-5}}
    rules: [{{when: {{}}, use: small}}]
"""
    policy = make_policy(text, registry)
    assert policy.global_default == "anthropic:sonnet"
    assert policy.tiers == {
        "fast": "anthropic:haiku",
        "balanced": "anthropic:sonnet",
        "deep": "anthropic:opus",
    }
    assert policy.rules[0].use == "openai:gpt-5"
    scope = policy.scopes[0]
    assert scope.default == "openai:mini"
    assert scope.tiers == {
        "fast": "openai:mini",
        "balanced": "openai:gpt-5",
        "deep": "openai:gpt-5",
    }
    assert scope.rules[0].use == "ollama:small:3b"


def test_seed_example_unknown_global_default(registry: ModelRegistry) -> None:
    result = check_policy(
        "schema_version: 1\nglobal_default: nonexistent:model\nrules: []", registry
    )
    body = result.as_dict()
    assert body["valid"] is False and body["warnings"] == []
    assert len(body["errors"]) == 1
    assert body["errors"][0].startswith(
        "global_default references unknown model: nonexistent:model"
    )
    assert body["diagnostics"] == [
        {
            "severity": "error",
            "code": "unknown_model",
            "path": "global_default",
            "line": 2,
            "column": 1,
            "message": "global_default references unknown model: nonexistent:model",
        }
    ]
    assert len(body["version"]) == 64


def test_workspace_keys_are_expanded_normalised_and_unique(
    registry: ModelRegistry, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    text = f"""\
workspaces:
  {tmp_path}/a/../a: {{default: haiku}}
  {tmp_path}/a/: {{default: opus}}
  relative/dir: {{default: opus}}
"""
    found = errors_of(registry, text)
    assert len(found) == 2
    assert found[0] == (
        f'workspaces["{tmp_path}/a/"]: resolves to {tmp_path}/a, '
        f'like workspaces["{tmp_path}/a/../a"] (line 3)'
    )
    assert found[1].startswith('workspaces["relative/dir"]: workspace key must be an absolute path')
    home = os.path.expanduser("~")
    policy = make_policy("workspaces: {'~/proj': {default: haiku}}\n", registry)
    assert policy.scopes[0].path == str(Path(home, "proj").resolve())


def test_a_workspace_key_left_empty_or_null_is_named_null_at_its_line(
    registry: ModelRegistry,
) -> None:
    """YAML reads `~:` and an empty key as null: named as YAML writes it, not Python's `None`."""
    for written in ("~:", "? \n  :"):
        found = errors_of(registry, f"workspaces:\n  /tmp: {{}}\n  {written} {{default: haiku}}\n")
        assert found == ["workspaces.null: expected a path string key, got null (line 3)"]


def test_every_top_level_problem_is_reported_together(registry: ModelRegistry) -> None:
    text = """\
schema_version: 2
global_defualt: haiku
rules: {a: 1}
pattern: {enabled: maybe, cost_weight: 2}
"""
    found = errors_of(registry, text)
    assert found == [
        "schema_version: unsupported version 2 (only 1 is accepted) (line 1)",
        "unknown key 'global_defualt' (allowed: schema_version, global_default, tiers, rules, "
        "workspaces, pattern); did you mean 'global_default'? (line 2)",
        "rules: expected a list, got mapping (line 3)",
        "pattern.enabled: expected a boolean (true or false), got string (line 4)",
        "pattern.cost_weight: must be at most 1 (line 4)",
    ]


def test_duplicate_key_message_starts_with_its_path(registry: ModelRegistry) -> None:
    text = "rules:\n  - name: a\n    name: b\n    when: {}\n    use: haiku\n"
    assert errors_of(registry, text) == ["rules[0].name: duplicate key 'name' (line 3)"]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"rules: [\n", "yaml_syntax"),
        (b"- 1\n", "root_not_mapping"),
        (b"\xff\xfe", "not_utf8"),
        (b"a: 1\na: 2\n", "duplicate_key"),
        (b"x" * (1024 * 1024 + 1), "too_large"),
    ],
)
def test_file_level_problems_are_diagnostics(
    registry: ModelRegistry, raw: bytes, code: str
) -> None:
    result = validate_policy(raw, registry)
    assert not result.valid
    assert code in [d.code for d in result.diagnostics]


def test_empty_and_comment_only_files_are_valid_empty_policies(registry: ModelRegistry) -> None:
    empty = validate_policy(b"", registry)
    assert empty.valid and empty.version == EMPTY_POLICY_VERSION
    assert (
        EMPTY_POLICY_VERSION == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    comments = validate_policy(b"# nothing yet\n", registry)
    assert comments.valid and comments.policy is not None and comments.policy.rules == ()
    assert validate_policy(b"rules:\n", registry).valid  # rules: null is []


def test_bom_is_tolerated(registry: ModelRegistry) -> None:
    assert validate_policy(b"\xef\xbb\xbfschema_version: 1\n", registry).valid


# ---- shipped and example files ----------------------------------------------------------------


def test_shipped_routing_yaml_is_the_documented_empty_default() -> None:
    shipped = SHIPPED_CONFIG_DIR / "routing.yaml"
    result = validate_policy(shipped.read_bytes(), make_registry())
    assert result.valid and result.warnings == []
    assert result.policy is not None
    assert (result.policy.global_default, result.policy.rules) == (None, ())


def test_design_example_validates_with_only_workspace_missing_warnings() -> None:
    dummy = {"ANTHROPIC_API_KEY": "dummy", "OPENAI_API_KEY": "dummy"}
    registry = load_models_file(EXAMPLES / "models.yaml", env=dummy).registry
    assert registry is not None
    result = validate_policy((EXAMPLES / "routing.yaml").read_bytes(), registry)
    assert result.errors == []
    codes = {d.code for d in result.diagnostics}
    assert codes <= {"workspace_missing"}
