"""The routing chain, validation, explicit choices and failover lists."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from metis.core.errors import RoutingFailed
from metis.core.models.registry import SCRIPTED_MODEL_ID, ModelRegistry
from metis.core.routing.availability import Availability
from metis.core.routing.engine import RouteDecision, RoutingEngine, StaticPolicy
from tests.core.routing.routing_kit import ManualClock, make_ctx, make_policy, make_registry

Build = Callable[..., RoutingEngine]

CHAIN_KEYS = {
    "policy",
    "verdict",
    "reason",
    "candidate_model",
    "rule_name",
    "validation_failure",
    "unavailable_scope",
    "attempts",
}


def slots(decision: RouteDecision) -> list[tuple[str, str]]:
    return [(e.policy, e.verdict) for e in decision.chain]


# ---- each slot wins alone -------------------------------------------------------------------------


def test_override_wins_first(make_engine: Build) -> None:
    decision = make_engine("rules: [{when: {}, use: opus}]").decide(
        make_ctx(per_message_override="anthropic:haiku", sticky_model="openai:gpt-5")
    )
    assert decision.chosen_model == "anthropic:haiku"
    assert slots(decision) == [("per_message_override", "chose")]
    assert decision.winner_index == 0 and decision.fallbacks == ()


def test_sticky_wins_when_there_is_no_override(make_engine: Build) -> None:
    decision = make_engine("rules: [{when: {}, use: opus}]").decide(
        make_ctx(sticky_model="openai:gpt-5")
    )
    assert decision.chosen_model == "openai:gpt-5"
    assert slots(decision) == [
        ("per_message_override", "not_applicable"),
        ("manual_sticky", "chose"),
    ]
    assert decision.fallbacks == ()
    assert decision.routing_metadata() == {
        "mode": "manual",
        "chosen_model": "openai:gpt-5",
        "rule_name": None,
        "reason": "session's active model",
        "policy_version": decision.policy_version,
    }


def test_first_matching_rule_wins(make_engine: Build) -> None:
    policy = """\
global_default: sonnet
rules:
  - {name: images, when: {has_images: true}, use: opus}
  - {name: short, when: {message_length_lt: 10}, use: haiku}
  - {name: any, when: {}, use: gpt5}
"""
    decision = make_engine(policy).decide(make_ctx(message_text="hi"))
    assert decision.chosen_model == "anthropic:haiku"
    rule = decision.chain[2]
    assert (rule.policy, rule.verdict, rule.rule_name, rule.reason) == (
        "rule",
        "chose",
        "short",
        "matched 'short'",
    )
    assert [a.rule_name for a in rule.attempts or ()] == ["short"]
    assert decision.fallbacks == ("openai:gpt-5", "anthropic:sonnet")
    assert decision.routing_metadata()["mode"] == "rule"  # type: ignore[index]


def test_workspace_default_wins_over_global_default(make_engine: Build, tmp_path: Path) -> None:
    engine = make_engine(f"global_default: sonnet\nworkspaces: {{{tmp_path}: {{default: gpt5}}}}\n")
    decision = engine.decide(make_ctx(workspace_path=str(tmp_path / "sub")))
    assert decision.chosen_model == "openai:gpt-5"
    assert slots(decision)[-1] == ("workspace_default", "chose")
    assert decision.fallbacks == ("anthropic:sonnet",)
    assert decision.routing_metadata()["mode"] == "default"  # type: ignore[index]


def test_global_default_then_the_registry_floor(make_engine: Build) -> None:
    explicit = make_engine("global_default: opus\n").decide(make_ctx())
    assert explicit.chosen_model == "anthropic:opus"
    assert explicit.chain[-1].reason == "global_default"
    floor = make_engine("").decide(make_ctx())
    assert floor.chosen_model == "anthropic:sonnet"  # first configured real model in file order
    assert slots(floor) == [
        ("per_message_override", "not_applicable"),
        ("manual_sticky", "not_applicable"),
        ("rule", "not_applicable"),
        ("workspace_default", "not_applicable"),
        ("global_default", "chose"),
    ]
    assert floor.chain[-1].reason == "registry default (first configured model)"


def test_a_rejected_global_default_falls_through_to_the_registry_default() -> None:
    """global_default names a model whose provider has no key: the turn goes to the first
    configured model, and the chain says why."""
    registry = make_registry({"OPENAI_API_KEY": "k"})
    engine = RoutingEngine(
        registry, _static(registry, "global_default: sonnet\n"), Availability(registry)
    )
    decision = engine.decide(make_ctx())
    assert decision.chosen_model == "openai:gpt-5"
    assert slots(decision)[-2:] == [("global_default", "rejected"), ("global_default", "chose")]
    assert decision.chain[-2].validation_failure == "not_configured"
    assert decision.chain[-1].reason == (
        "registry default (first configured model), as global_default anthropic:sonnet was "
        "rejected (not_configured)"
    )
    assert decision.routing_metadata()["mode"] == "default"  # type: ignore[index]
    assert engine.default_model_for("/x") == "openai:gpt-5"


def test_the_registry_default_is_a_fallback_of_a_global_default(make_engine: Build) -> None:
    """A turn on global_default fails over to the registry's default, never to the same model
    twice."""
    assert make_engine("global_default: opus\n").decide(make_ctx()).fallbacks == (
        "anthropic:sonnet",
    )
    same = make_engine("global_default: sonnet\n").decide(make_ctx())
    assert same.chosen_model == "anthropic:sonnet" and same.fallbacks == ()


def test_offline_mode_picks_the_scripted_model() -> None:
    registry = make_registry({})
    engine = RoutingEngine(registry, _static(registry, ""), Availability(registry))
    decision = engine.decide(make_ctx())
    assert registry.offline_mode
    assert decision.chosen_model == SCRIPTED_MODEL_ID and decision.offline_mode is True
    assert slots(decision)[-2:] == [
        ("global_default", "not_applicable"),
        ("offline_fallback", "chose"),
    ]
    assert decision.event_payload()["offline_mode"] is True


def test_scripted_model_is_never_a_silent_substitute_when_online(
    make_engine: Build, availability: Availability
) -> None:
    for model in ("anthropic:sonnet", "openai:gpt-5", "ollama:small:3b"):
        availability.record_failure(model, "auth")
    decision = make_engine("").decide(make_ctx())
    assert decision.outcome == "no_candidate"
    assert "offline_fallback" not in [e.policy for e in decision.chain]
    assert SCRIPTED_MODEL_ID not in decision.fallbacks


def test_scripted_model_is_used_when_referenced(make_engine: Build) -> None:
    decision = make_engine("rules: [{when: {}, use: scripted}]").decide(make_ctx())
    assert decision.chosen_model == SCRIPTED_MODEL_ID


# ---- validation, in order --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ctx", "model", "failure"),
    [
        ({}, "nosuch:model", "not_configured"),
        ({"image_count": 1}, "openai:mini", "no_vision_support"),
        ({"estimated_input_tokens": 6200}, "ollama:small:3b", "exceeds_context_window"),
        ({"tools_offered": 1}, "ollama:small:3b", "no_tool_support"),
    ],
)
def test_each_validation_failure_rejects_the_candidate(
    make_engine: Build, ctx: dict[str, object], model: str, failure: str
) -> None:
    decision = make_engine("global_default: haiku\n").decide(
        make_ctx(per_message_override=model, override_strict=False, **ctx)
    )
    first = decision.chain[0]
    assert (first.verdict, first.validation_failure) == ("rejected", failure)
    assert decision.chosen_model == "anthropic:haiku"


def test_context_window_counts_the_output_reserve_capped_by_the_setting(make_engine: Build) -> None:
    # ollama:small:3b: 8192 context, 2048 output → 6144 input tokens fit, 6145 do not.
    fits = make_engine("").decide(
        make_ctx(per_message_override="ollama:small:3b", estimated_input_tokens=6144)
    )
    assert fits.chosen_model == "ollama:small:3b"
    over = make_engine("").decide(
        make_ctx(per_message_override="ollama:small:3b", estimated_input_tokens=6145)
    )
    assert over.chain[0].validation_failure == "exceeds_context_window"
    assert "needs at least ~6,145 input tokens" in over.routing_failed().message
    assert "the model takes 6,144 beside its output reserve" in over.routing_failed().message
    # anthropic:opus: 200000 context, 32000 output capped to 1000 by the setting.
    capped = make_engine("", max_output_tokens_per_call=1000).decide(
        make_ctx(per_message_override="anthropic:opus", estimated_input_tokens=199_000)
    )
    assert capped.chosen_model == "anthropic:opus"


def test_validation_reports_the_first_failure_in_documented_order(make_engine: Build) -> None:
    registry = make_registry({"ANTHROPIC_API_KEY": "k"})
    decision = make_engine("", reg=registry).decide(
        make_ctx(per_message_override="openai:mini", override_strict=False, image_count=1)
    )
    assert decision.chain[0].validation_failure == "not_configured"
    both = make_engine("").decide(
        make_ctx(
            per_message_override="ollama:small:3b",
            override_strict=False,
            estimated_input_tokens=9000,
            tools_offered=2,
        )
    )
    assert both.chain[0].validation_failure == "exceeds_context_window"


def test_unavailable_provider_or_model_is_rejected_with_its_scope(
    make_engine: Build, availability: Availability
) -> None:
    availability.record_failure("anthropic:opus", "auth")
    for _ in range(5):
        availability.record_failure("openai:gpt-5", "server_error")
    engine = make_engine("")
    provider = engine.decide(
        make_ctx(per_message_override="anthropic:haiku", override_strict=False)
    )
    assert (provider.chain[0].validation_failure, provider.chain[0].unavailable_scope) == (
        "provider_unavailable",
        "provider",
    )
    model = engine.decide(make_ctx(per_message_override="openai:gpt-5", override_strict=False))
    assert (model.chain[0].validation_failure, model.chain[0].unavailable_scope) == (
        "provider_unavailable",
        "model",
    )
    assert engine.decide(make_ctx(per_message_override="openai:mini")).chosen_model == "openai:mini"


# ---- fall-through of rules and defaults --------------------------------------------------------------


def test_matching_rules_are_tried_in_order_with_every_attempt_recorded(
    make_engine: Build, availability: Availability
) -> None:
    for _ in range(5):
        availability.record_failure("anthropic:opus", "rate_limit")
    policy = """\
global_default: gpt5
rules:
  - {name: deep, when: {message_matches: design}, use: opus}
  - {name: vision, when: {has_images: true}, use: mini}
  - {name: deep fallback, when: {message_matches: design}, use: small}
  - {name: any, when: {}, use: sonnet}
"""
    decision = make_engine(policy).decide(
        make_ctx(message_text="design review", image_count=1, tools_offered=3)
    )
    assert decision.chosen_model == "anthropic:sonnet"
    rule = decision.chain[2]
    assert rule.rule_name == "any" and rule.verdict == "chose"
    assert [
        (a.rule_name, a.validation_failure, a.unavailable_scope) for a in rule.attempts or ()
    ] == [
        ("deep", "provider_unavailable", "model"),
        ("vision", "no_vision_support", None),
        ("deep fallback", "no_vision_support", None),  # checked before tools
        ("any", None, None),
    ]
    assert decision.fallbacks == ("openai:gpt-5",)


def test_all_matching_rules_rejected_then_defaults(make_engine: Build) -> None:
    policy = """\
global_default: haiku
rules:
  - {name: a, when: {}, use: mini}
  - {name: b, when: {}, use: small}
"""
    decision = make_engine(policy).decide(make_ctx(image_count=1))
    rule = decision.chain[2]
    assert (rule.verdict, rule.rule_name, rule.candidate_model, rule.validation_failure) == (
        "rejected",
        "a",
        "openai:mini",
        "no_vision_support",
    )
    assert rule.reason == "2 matching rules, all rejected"
    assert decision.chosen_model == "anthropic:haiku"
    assert slots(decision)[3:] == [
        ("workspace_default", "not_applicable"),
        ("global_default", "chose"),
    ]


def test_workspace_rules_run_before_global_rules(make_engine: Build, tmp_path: Path) -> None:
    policy = f"""\
rules: [{{name: global, when: {{}}, use: opus}}]
workspaces:
  {tmp_path}:
    rules: [{{name: local, when: {{message_length_lt: 100}}, use: haiku}}]
"""
    engine = make_engine(policy)
    inside = engine.decide(make_ctx(workspace_path=str(tmp_path)))
    assert (inside.chosen_model, inside.chain[2].rule_name) == ("anthropic:haiku", "local")
    assert inside.fallbacks[0] == "anthropic:opus"
    outside = engine.decide(make_ctx(workspace_path="/elsewhere"))
    assert outside.chosen_model == "anthropic:opus"


def test_longest_ancestor_workspace_scope_wins_and_scopes_never_merge(
    make_engine: Build, tmp_path: Path
) -> None:
    inner = tmp_path / "a" / "b"
    policy = f"""\
global_default: sonnet
workspaces:
  {tmp_path}: {{default: opus, rules: [{{name: outer, when: {{}}, use: gpt5}}]}}
  {tmp_path / "a"}: {{default: haiku}}
  {tmp_path}-sibling: {{default: mini}}
"""
    engine = make_engine(policy)
    deep = engine.decide(make_ctx(workspace_path=str(inner / "c")))
    assert deep.chosen_model == "anthropic:haiku"  # the outer scope's rule does not apply
    assert engine.decide(make_ctx(workspace_path=str(tmp_path))).chosen_model == "openai:gpt-5"
    assert (
        engine.decide(make_ctx(workspace_path=f"{tmp_path}-sibling")).chosen_model == "openai:mini"
    )
    assert engine.decide(make_ctx(workspace_path=f"{tmp_path}x")).chosen_model == "anthropic:sonnet"


# ---- explicit choices are never overridden ------------------------------------------------------------


def test_rejected_strict_override_refuses_the_turn(make_engine: Build) -> None:
    decision = make_engine("global_default: haiku\n").decide(
        make_ctx(per_message_override="openai:mini", image_count=1, sticky_model="anthropic:opus")
    )
    assert decision.outcome == "explicit_choice_rejected"
    assert (decision.chosen_model, decision.winner_index, decision.fallbacks) == (None, -1, ())
    assert decision.would_fall_back_to == "anthropic:opus"  # the sticky, unrecorded
    assert slots(decision) == [("per_message_override", "rejected")]
    error = decision.routing_failed()
    assert error.details["explicit_choice"] == {
        "policy": "per_message_override",
        "model": "openai:mini",
        "reason": "no_vision_support",
        "would_fall_back_to": "anthropic:opus",
    }
    assert error.details["tried"] == [
        {
            "model": "openai:mini",
            "policy": "per_message_override",
            "rule_name": None,
            "reason": "no_vision_support",
            "unavailable_scope": None,
            "unavailable_reason": None,
            "message": None,
            "recovers_at": None,
        }
    ]
    assert "openai:mini" in error.message and "without the override" in error.message


def test_rejected_sticky_refuses_the_turn_even_after_a_non_strict_override(
    make_engine: Build, availability: Availability
) -> None:
    availability.record_failure("openai:gpt-5", "auth")
    decision = make_engine("rules: [{when: {}, use: haiku}]").decide(
        make_ctx(
            per_message_override="openai:mini",
            override_strict=False,
            image_count=1,
            sticky_model="anthropic:opus",
        )
    )
    # non-strict override rejected → chain continues; sticky valid → chosen, no fallbacks
    assert decision.chosen_model == "anthropic:opus" and decision.fallbacks == ()
    refused = make_engine("rules: [{when: {}, use: haiku}]").decide(
        make_ctx(sticky_model="openai:gpt-5")
    )
    assert refused.outcome == "explicit_choice_rejected"
    assert refused.would_fall_back_to == "anthropic:haiku"
    assert refused.tried[0].reason == "provider_unavailable"
    assert refused.tried[0].unavailable_scope == "provider"
    assert "active_model: null" in refused.routing_failed().message


def test_non_strict_override_winner_gets_fallbacks(make_engine: Build) -> None:
    decision = make_engine("global_default: sonnet\n").decide(
        make_ctx(
            per_message_override="anthropic:haiku",
            override_strict=False,
            sticky_model="openai:gpt-5",
        )
    )
    assert decision.chosen_model == "anthropic:haiku"
    assert decision.fallbacks == ("openai:gpt-5", "anthropic:sonnet")


# ---- failure details -------------------------------------------------------------------------------


def test_no_candidate_lists_every_rejection_in_chain_order(
    make_engine: Build, availability: Availability
) -> None:
    registry = make_registry({"ANTHROPIC_API_KEY": "k"})
    availability_for = Availability(registry, clock=ManualClock())
    availability_for.record_failure("anthropic:opus", "auth", http_status=401)
    engine = RoutingEngine(
        registry,
        _static(registry, "global_default: gpt5\nrules: [{name: deep, when: {}, use: opus}]\n"),
        availability_for,
    )
    decision = engine.decide(make_ctx())
    assert decision.outcome == "no_candidate"
    assert decision.winner_index == -1 and decision.fallbacks == ()
    error = decision.routing_failed()
    assert isinstance(error, RoutingFailed)
    assert error.message == (
        "no model can serve this turn; tried: anthropic:opus (unavailable: "
        "anthropic refused the key from $ANTHROPIC_API_KEY (HTTP 401): the provider refused "
        "this key; set a valid key in ANTHROPIC_API_KEY and restart the daemon; routing tries "
        "it again after 2026-05-08 12:05:00 UTC), openai:gpt-5 (not configured), "
        "anthropic:sonnet (unavailable: anthropic refused the key from "
        "$ANTHROPIC_API_KEY (HTTP 401): the provider refused this key; set a valid key in "
        "ANTHROPIC_API_KEY and restart the daemon; routing tries it again after "
        "2026-05-08 12:05:00 UTC)"
    )
    assert error.details == {
        "tried": [
            {
                "model": "anthropic:opus",
                "policy": "rule",
                "rule_name": "deep",
                "reason": "provider_unavailable",
                "unavailable_scope": "provider",
                "unavailable_reason": "auth_error",
                "message": "anthropic refused the key from $ANTHROPIC_API_KEY (HTTP 401): the "
                "provider refused this key; set a valid key in ANTHROPIC_API_KEY and restart "
                "the daemon",
                "recovers_at": "2026-05-08T12:05:00.000000Z",
            },
            {
                "model": "openai:gpt-5",
                "policy": "global_default",
                "rule_name": None,
                "reason": "not_configured",
                "unavailable_scope": None,
                "unavailable_reason": None,
                "message": None,
                "recovers_at": None,
            },
            {  # the registry's default, after the rejected global_default
                "model": "anthropic:sonnet",
                "policy": "global_default",
                "rule_name": None,
                "reason": "provider_unavailable",
                "unavailable_scope": "provider",
                "unavailable_reason": "auth_error",
                "message": "anthropic refused the key from $ANTHROPIC_API_KEY (HTTP 401): the "
                "provider refused this key; set a valid key in ANTHROPIC_API_KEY and restart "
                "the daemon",
                "recovers_at": "2026-05-08T12:05:00.000000Z",
            },
        ],
        "alternative_providers_configured": [],
        "explicit_choice": None,
        "policy_version": decision.policy_version,
        "offline_mode": False,
    }


def test_alternative_providers_are_healthy_configured_and_untried(
    make_engine: Build, availability: Availability
) -> None:
    availability.record_failure("openai:gpt-5", "auth")
    decision = make_engine("rules: [{when: {}, use: small}]").decide(
        make_ctx(sticky_model="ollama:small:3b", tools_offered=1)
    )
    assert decision.alternative_providers_configured == ("anthropic",)
    registry = make_registry({})
    offline = RoutingEngine(registry, _static(registry, ""), Availability(registry))
    refused = offline.decide(make_ctx(sticky_model="anthropic:haiku"))
    assert refused.alternative_providers_configured == ("local",)


def test_routing_failed_is_only_for_failed_decisions(make_engine: Build) -> None:
    with pytest.raises(ValueError):
        make_engine("").decide(make_ctx()).routing_failed()


# ---- the route.decided payload ------------------------------------------------------------------------


def test_event_payload_has_exactly_the_documented_shape(make_engine: Build) -> None:
    decision = make_engine("rules: [{name: fast for commits, when: {}, use: haiku}]").decide(
        make_ctx(estimated_input_tokens=5120)
    )
    payload = decision.event_payload()
    assert set(payload) == {
        "outcome",
        "chosen_model",
        "winner_index",
        "would_fall_back_to",
        "fallbacks",
        "policy_version",
        "policy_source",
        "using_last_known_good",
        "offline_mode",
        "estimated_input_tokens",
        "elapsed_ms",
        "chain",
    }
    assert payload["outcome"] == "chose" and payload["winner_index"] == 2
    assert payload["policy_source"] == "user_file" and payload["using_last_known_good"] is False
    assert payload["estimated_input_tokens"] == 5120
    assert isinstance(payload["elapsed_ms"], float) and len(payload["policy_version"]) == 64
    assert all(set(entry) == CHAIN_KEYS for entry in payload["chain"])
    assert payload["chain"][0] == {
        "policy": "per_message_override",
        "verdict": "not_applicable",
        "reason": "no override",
        "candidate_model": None,
        "rule_name": None,
        "validation_failure": None,
        "unavailable_scope": None,
        "attempts": None,
    }
    assert payload["chain"][2]["attempts"] == [
        {
            "rule_name": "fast for commits",
            "candidate_model": "anthropic:haiku",
            "validation_failure": None,
            "unavailable_scope": None,
        }
    ]


def test_fallbacks_hold_at_most_two_distinct_valid_models(make_engine: Build) -> None:
    policy = """\
global_default: haiku
rules:
  - {when: {}, use: sonnet}
  - {when: {}, use: sonnet}
  - {when: {}, use: mini}
  - {when: {}, use: haiku}
  - {when: {}, use: gpt5}
"""
    decision = make_engine(policy).decide(make_ctx(image_count=1))
    assert decision.chosen_model == "anthropic:sonnet"
    assert decision.fallbacks == ("anthropic:haiku", "openai:gpt-5")  # mini lacks vision


# ---- defaults shown to clients ---------------------------------------------------------------------------


def test_default_model_for_a_workspace(make_engine: Build, tmp_path: Path) -> None:
    registry = make_registry({"ANTHROPIC_API_KEY": "k"})
    engine = make_engine(
        f"global_default: opus\nworkspaces: {{{tmp_path}: {{default: gpt5}}}}\n", reg=registry
    )
    assert engine.default_model_for(str(tmp_path)) == "anthropic:opus"  # gpt5 unconfigured
    assert engine.default_model_for("/elsewhere") == "anthropic:opus"
    assert make_engine("").default_model_for("/x") == "anthropic:sonnet"
    offline = make_registry({})
    assert make_engine("", reg=offline).default_model_for("/x") == SCRIPTED_MODEL_ID


def test_model_for_tier_prefers_workspace_then_global_then_registry(
    make_engine: Build, tmp_path: Path
) -> None:
    policy = f"""\
tiers: {{fast: mini, balanced: gpt5, deep: gpt5}}
workspaces:
  {tmp_path}: {{tiers: {{fast: small, balanced: small, deep: small}}}}
"""
    engine = make_engine(policy)
    assert engine.model_for_tier("fast", str(tmp_path)) == "ollama:small:3b"
    assert engine.model_for_tier("fast", "/elsewhere") == "openai:mini"
    assert make_engine("").model_for_tier("deep") == "anthropic:opus"


def _static(registry: ModelRegistry, text: str) -> StaticPolicy:
    return StaticPolicy(make_policy(text, registry))
