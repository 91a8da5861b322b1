"""The routing chain: which model serves a turn, and why.

`RoutingEngine.decide` is synchronous and pure over (active policy, registry, availability,
context): it walks the fixed slots, validates each candidate, stops at the first valid one and
records the chain prefix it walked. The returned `RouteDecision` carries everything the surface
needs: the `route.decided` payload, the failover list, the assistant message's routing summary
and, when nothing can serve the turn, the `RoutingFailed` error and its details.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

from metis.core.errors import RoutingFailed
from metis.core.models.registry import LOCAL_PROVIDER, SCRIPTED_MODEL_ID, ModelRegistry
from metis.core.routing.availability import Availability
from metis.core.routing.context import TurnContext
from metis.core.routing.loader import TIERS, Policy, Rule
from metis.core.routing.predicates import Facts

DEFAULT_MAX_OUTPUT_TOKENS_PER_CALL = 8192
MAX_FALLBACKS = 2

Outcome = Literal["chose", "no_candidate", "explicit_choice_rejected"]
Verdict = Literal["not_applicable", "rejected", "chose"]

OVERRIDE = "per_message_override"
STICKY = "manual_sticky"
RULE = "rule"
WORKSPACE_DEFAULT = "workspace_default"
GLOBAL_DEFAULT = "global_default"
REGISTRY_DEFAULT = "registry_default"
OFFLINE_FALLBACK = "offline_fallback"
_MODES = {OVERRIDE: "override", STICKY: "manual", RULE: "rule"}
# The event catalog names no policy for the registry's default (the first configured model): its
# entries are recorded as `global_default`, their reason telling the two apart.
_RECORDED_AS = {REGISTRY_DEFAULT: GLOBAL_DEFAULT}


class PolicySource(Protocol):
    """What the engine reads per decision; `PolicyManager` swaps `active` atomically."""

    @property
    def active(self) -> Policy:
        """The policy in force for this decision."""

    @property
    def source(self) -> str:
        """Where the active policy came from (the file, or the built-in default)."""

    @property
    def using_last_known_good(self) -> bool:
        """Whether the file on disk was refused and an older valid version is in force."""


@dataclass
class StaticPolicy:
    """A fixed policy (tests, benchmarks, one-off checks) in place of a `PolicyManager`."""

    active: Policy
    source: str = "user_file"
    using_last_known_good: bool = False


class RuleAttempt(NamedTuple):
    """One matching rule tried in the `rule` slot."""

    rule_name: str
    candidate_model: str
    validation_failure: str | None
    unavailable_scope: str | None

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


class ChainEntry(NamedTuple):
    """One slot of the recorded chain (tuples: built on every decision, so kept cheap)."""

    policy: str
    verdict: Verdict
    reason: str
    candidate_model: str | None = None
    rule_name: str | None = None
    validation_failure: str | None = None
    unavailable_scope: str | None = None
    attempts: tuple[RuleAttempt, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        entry = self._asdict()
        if self.attempts is not None:
            entry["attempts"] = [a.as_dict() for a in self.attempts]
        return entry


class TriedCandidate(NamedTuple):
    """One rejected candidate, as listed in the 503 `details.tried`.

    An unavailable candidate also says why (`unavailable_reason`, the trigger such as
    `auth_error`, and `message`, in words) and when routing tries it again (`recovers_at`); one
    whose window is too small says the sizes in `message`.
    """

    model: str
    policy: str
    rule_name: str | None
    reason: str
    unavailable_scope: str | None
    unavailable_reason: str | None = None
    message: str | None = None
    recovers_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()

    def explained(self, availability: Availability) -> TriedCandidate:
        """This candidate with the availability's why and until-when filled in."""
        if self.unavailable_scope is None:
            return self
        detail = availability.unavailable_detail(self.model)
        if detail is None:
            return self
        return self._replace(
            unavailable_reason=detail["trigger_reason"],
            message=detail["message"],
            recovers_at=detail["recovers_at"],
        )

    def why(self) -> str:
        """The reason in words (the code is `reason`, in the error's details), and for an
        unavailable model what happened and until when."""
        words = _REJECTED_BECAUSE.get(self.reason, self.reason)
        if self.message is None:
            return words
        until = (
            f"; routing tries it again after {_readable(self.recovers_at)}"
            if self.recovers_at
            else ""
        )
        return f"{words}: {self.message}{until}"


def _readable(stamp: str) -> str:
    """`2026-11-29T16:20:42.819646Z` as `2026-11-29 16:20:42 UTC`: a person reads the refusal's
    message; the exact stamp stays in its details (`recovers_at`)."""
    return f"{stamp[:19].replace('T', ' ')} UTC" if stamp.endswith("Z") else stamp


_REJECTED_BECAUSE = {
    "not_configured": "not configured",
    "provider_unavailable": "unavailable",
    "no_vision_support": "it cannot read images",
    "exceeds_context_window": "too small for this turn",
    "no_tool_support": "it cannot use tools",
}
"""A rejected candidate's `reason` as the refusal's message says it."""


class RouteDecision(NamedTuple):
    """The outcome of one `decide` (immutable; a tuple because one is built per turn)."""

    outcome: Outcome
    chosen_model: str | None
    winner_index: int
    would_fall_back_to: str | None
    fallbacks: tuple[str, ...]
    policy_version: str
    policy_source: str
    using_last_known_good: bool
    offline_mode: bool
    estimated_input_tokens: int
    elapsed_ms: float
    chain: tuple[ChainEntry, ...]
    tried: tuple[TriedCandidate, ...]
    alternative_providers_configured: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.outcome == "chose"

    @property
    def winner(self) -> ChainEntry | None:
        return self.chain[self.winner_index] if self.winner_index >= 0 else None

    def event_payload(self) -> dict[str, Any]:
        """The `route.decided` payload."""
        return {
            "outcome": self.outcome,
            "chosen_model": self.chosen_model,
            "winner_index": self.winner_index,
            "would_fall_back_to": self.would_fall_back_to,
            "fallbacks": list(self.fallbacks),
            "policy_version": self.policy_version,
            "policy_source": self.policy_source,
            "using_last_known_good": self.using_last_known_good,
            "offline_mode": self.offline_mode,
            "estimated_input_tokens": self.estimated_input_tokens,
            "elapsed_ms": self.elapsed_ms,
            "chain": [entry.as_dict() for entry in self.chain],
        }

    def routing_metadata(self) -> dict[str, Any] | None:
        """The assistant message's `metadata.routing` summary; None unless a model was chosen."""
        winner = self.winner
        if winner is None:
            return None
        return {
            "mode": _MODES.get(winner.policy, "default"),
            "chosen_model": self.chosen_model,
            "rule_name": winner.rule_name,
            "reason": winner.reason,
            "policy_version": self.policy_version,
        }

    def explicit_choice(self) -> dict[str, Any] | None:
        """The rejected explicit choice (override or sticky model) of a failed decision, for the
        error's details; None otherwise."""
        if self.outcome != "explicit_choice_rejected":
            return None
        rejected = self.chain[-1]
        return {
            "policy": rejected.policy,
            "model": rejected.candidate_model,
            "reason": rejected.validation_failure,
            "would_fall_back_to": self.would_fall_back_to,
        }

    def routing_failed(self) -> RoutingFailed:
        """The 503 error of a failed decision, with its `details`."""
        if self.ok:
            raise ValueError("the decision chose a model; there is no routing failure")
        explicit = self.explicit_choice()
        if explicit is not None:
            message = _explicit_message(explicit, self.tried[-1] if self.tried else None)
        elif self.tried:
            tried = ", ".join(f"{t.model} ({t.why()})" for t in self.tried)
            message = f"no model can serve this turn; tried: {tried}"
        else:
            message = (
                "no model can serve this turn; no candidate model "
                "(configure a provider key in models.yaml or set global_default)"
            )
        return RoutingFailed(
            message,
            tried=[t.as_dict() for t in self.tried],
            alternative_providers_configured=list(self.alternative_providers_configured),
            explicit_choice=explicit,
            policy_version=self.policy_version,
            offline_mode=self.offline_mode,
        )


def _explicit_message(explicit: dict[str, Any], tried: TriedCandidate | None) -> str:
    model, reason = explicit["model"], explicit["reason"]
    if tried is not None and tried.model == model:
        reason = tried.why()
    if explicit["policy"] == OVERRIDE:
        return (
            f"the per-message override {model} cannot serve this turn ({reason}); pick another "
            "model or send the message without the override"
        )
    return (
        f"the session's active model {model} cannot serve this turn ({reason}); pick another "
        "model or clear it (active_model: null)"
    )


@dataclass(frozen=True)
class _ModelFacts:
    """Per-model constants of validation, precomputed once per registry."""

    configured: bool
    supports_images: bool
    supports_tools: bool
    input_budget: int  # context window minus the output reserve


class _Validator:
    """Candidate validation with a per-decision memo (deterministic within a decide)."""

    __slots__ = ("availability", "ctx", "memo", "models")

    def __init__(
        self, models: dict[str, _ModelFacts], availability: Availability, ctx: TurnContext
    ) -> None:
        self.models = models
        self.availability = availability
        self.ctx = ctx
        self.memo: dict[str, tuple[str | None, str | None]] = {}

    def __call__(self, model_id: str) -> tuple[str | None, str | None]:
        result = self.memo.get(model_id)
        if result is None:
            result = self.memo[model_id] = self._check(model_id)
        return result

    def _check(self, model_id: str) -> tuple[str | None, str | None]:
        facts = self.models.get(model_id)
        if facts is None or not facts.configured:
            return "not_configured", None
        scope = self.availability.unavailable_scope(model_id)
        if scope is not None:
            return "provider_unavailable", scope
        ctx = self.ctx
        if ctx.image_count > 0 and not facts.supports_images:
            return "no_vision_support", None
        if ctx.context_floor_tokens > facts.input_budget:
            return "exceeds_context_window", None
        if ctx.tools_offered > 0 and not facts.supports_tools:
            return "no_tool_support", None
        return None, None


# Not-applicable entries never vary, so they are built once (a decision must stay cheap).
_NOT_APPLICABLE = {
    slot: ChainEntry(slot, "not_applicable", reason)
    for slot, reason in (
        (OVERRIDE, "no override"),
        (STICKY, "no sticky model"),
        (RULE, "no rule matched"),
        (GLOBAL_DEFAULT, "no global_default and no configured real model"),
    )
}
_NO_SCOPE = ChainEntry(WORKSPACE_DEFAULT, "not_applicable", "no workspace scope")
_NO_SCOPE_DEFAULT = ChainEntry(
    WORKSPACE_DEFAULT, "not_applicable", "workspace scope has no default"
)
_FLOOR = "registry default (first configured model)"
_SLOT_REASONS = {
    OVERRIDE: "per-message override",
    STICKY: "session's active model",
    OFFLINE_FALLBACK: "offline mode: no configured real model",
}
_Result = tuple[Outcome, str | None, str | None, tuple[str, ...]]


class _Walk:
    """One pass over the chain's slots for one turn; records the chain prefix it walks."""

    __slots__ = (
        "_defaults",
        "chain",
        "ctx",
        "engine",
        "facts",
        "policy",
        "scope",
        "tried",
        "validate",
    )

    def __init__(self, engine: RoutingEngine, ctx: TurnContext, policy: Policy) -> None:
        self.engine = engine
        self.ctx = ctx
        self.policy = policy
        self.scope = policy.scope_for(ctx.workspace_path)
        self.facts = Facts(ctx)
        self.validate = _Validator(engine._models, engine.availability, ctx)
        self.chain: list[ChainEntry] = []
        self.tried: list[TriedCandidate] = []
        self._defaults: list[tuple[str, str | None]] | None = None

    def run(self) -> _Result:
        ctx = self.ctx
        for slot, model in ((OVERRIDE, ctx.per_message_override), (STICKY, ctx.sticky_model)):
            if model is None:
                self.chain.append(_NOT_APPLICABLE[slot])
                continue
            explicit = slot == STICKY or ctx.override_strict
            failure = self.single(slot, model)
            if failure is None:
                # an explicit choice is never swapped for another model: no fallbacks
                return (
                    "chose",
                    model,
                    None,
                    () if explicit else self.fallbacks(self.after_explicit(slot), model),
                )
            if explicit:
                self.tried = self.tried[-1:]
                return (
                    "explicit_choice_rejected",
                    None,
                    self.first_valid(self.after_explicit(slot)),
                    (),
                )
        matching = self.matching_rules()
        attempts: list[RuleAttempt] = []
        for rule in matching:
            failure, unavailable = self.validate(rule.use)
            attempts.append(RuleAttempt(rule.name, rule.use, failure, unavailable))
            if failure is None:
                self.chain.append(
                    ChainEntry(
                        RULE,
                        "chose",
                        f"matched '{rule.name}'",
                        rule.use,
                        rule.name,
                        None,
                        None,
                        tuple(attempts),
                    )
                )
                later = itertools.chain((r.use for r in matching), self.default_models(0))
                return "chose", rule.use, None, self.fallbacks(later, rule.use)
            self.tried.append(TriedCandidate(rule.use, RULE, rule.name, failure, unavailable))
        if attempts:
            first = attempts[0]
            self.chain.append(
                ChainEntry(
                    RULE,
                    "rejected",
                    f"{len(attempts)} matching rule{'' if len(attempts) == 1 else 's'}, all rejected",
                    first.candidate_model,
                    first.rule_name,
                    first.validation_failure,
                    first.unavailable_scope,
                    tuple(attempts),
                )
            )
        else:
            self.chain.append(_NOT_APPLICABLE[RULE])
        for index, (slot, model) in enumerate(self.defaults()):
            if model is None:
                self.chain.append(self.not_applicable(slot))
            elif self.single(slot, model) is None:
                return "chose", model, None, self.fallbacks(self.default_models(index + 1), model)
        return "no_candidate", None, None, ()

    # ---- candidates -----------------------------------------------------------------------

    def matching_rules(self) -> Iterator[Rule]:
        """Matching rules in evaluation order, evaluated lazily (only as far as needed)."""
        chain, rules = self.policy.rules_in_order(self.scope)
        return map(rules.__getitem__, chain(self.facts))

    def defaults(self) -> list[tuple[str, str | None]]:
        """(slot, candidate) of the default slots; computed once per walk.

        The registry's default follows a set global_default as a slot of its own, so a
        global_default that cannot serve the turn (its provider has no key, say) falls through
        to the first configured model instead of failing a turn another model could serve.
        """
        if self._defaults is None:
            registry = self.engine.registry
            chosen, floor = self.policy.global_default, registry.default_model()
            self._defaults = [
                (WORKSPACE_DEFAULT, self.scope.default if self.scope is not None else None),
                (GLOBAL_DEFAULT, chosen or floor),
            ]
            if chosen and floor is not None and floor != chosen:
                self._defaults.append((REGISTRY_DEFAULT, floor))
            if registry.offline_mode:
                self._defaults.append((OFFLINE_FALLBACK, SCRIPTED_MODEL_ID))
        return self._defaults

    def default_models(self, start: int) -> Iterator[str]:
        for _, model in self.defaults()[start:]:
            if model is not None:
                yield model

    def after_explicit(self, slot: str) -> Iterator[str]:
        """Candidates of the slots after an override or sticky, in chain order (unrecorded)."""
        if slot == OVERRIDE and self.ctx.sticky_model is not None:
            yield self.ctx.sticky_model
        for rule in self.matching_rules():
            yield rule.use
        yield from self.default_models(0)

    def fallbacks(self, later: Iterator[str], chosen: str) -> tuple[str, ...]:
        """Up to two further valid candidates, in chain order, without duplicates."""
        result: list[str] = []
        for model in later:
            if model != chosen and model not in result and self.validate(model)[0] is None:
                result.append(model)
                if len(result) == MAX_FALLBACKS:
                    break
        return tuple(result)

    def first_valid(self, later: Iterator[str]) -> str | None:
        return next((m for m in later if self.validate(m)[0] is None), None)

    # ---- chain entries --------------------------------------------------------------------

    def single(self, slot: str, model: str) -> str | None:
        """Validate a one-candidate slot, record its entry, return the failure (or None)."""
        failure, unavailable = self.validate(model)
        reason = self.slot_reason(slot)
        policy = _RECORDED_AS.get(slot, slot)
        if failure is None:
            self.chain.append(ChainEntry(policy, "chose", reason, model))
        else:
            self.chain.append(
                ChainEntry(
                    policy,
                    "rejected",
                    f"{reason}: {model} rejected ({failure})",
                    model,
                    None,
                    failure,
                    unavailable,
                )
            )
            self.tried.append(TriedCandidate(model, policy, None, failure, unavailable))
        return failure

    def not_applicable(self, slot: str) -> ChainEntry:
        if slot == WORKSPACE_DEFAULT:
            return _NO_SCOPE if self.scope is None else _NO_SCOPE_DEFAULT
        return _NOT_APPLICABLE[slot]

    def slot_reason(self, slot: str) -> str:
        if slot == WORKSPACE_DEFAULT and self.scope is not None:
            return f"default of workspace {self.scope.path}"
        if slot == GLOBAL_DEFAULT and self.policy.global_default:
            return "global_default"
        if slot in (GLOBAL_DEFAULT, REGISTRY_DEFAULT):
            return self.registry_default_reason()
        return _SLOT_REASONS.get(slot, slot)

    def registry_default_reason(self) -> str:
        """Why the registry's default is a candidate: no global_default, or the one set was
        rejected (only then is its slot reached), named with the reason."""
        chosen = self.policy.global_default
        if not chosen:
            return _FLOOR
        return f"{_FLOOR}, as global_default {chosen} was rejected ({self.validate(chosen)[0]})"


class RoutingEngine:
    """Runs the routing chain for one turn at a time."""

    def __init__(
        self,
        registry: ModelRegistry,
        policies: PolicySource,
        availability: Availability,
        *,
        max_output_tokens_per_call: int = DEFAULT_MAX_OUTPUT_TOKENS_PER_CALL,
    ) -> None:
        self.registry = registry
        self.policies = policies
        self.availability = availability
        self._models = {
            m.id: _ModelFacts(
                configured=registry.is_configured(m.id),
                supports_images=m.capabilities.supports_images,
                supports_tools=m.capabilities.supports_tools,
                input_budget=m.capabilities.max_context_tokens
                - min(m.capabilities.max_output_tokens, max_output_tokens_per_call),
            )
            for m in registry.models()
        }

    # ---- the chain ----------------------------------------------------------------------

    def decide(self, ctx: TurnContext) -> RouteDecision:
        """Pick the model for one turn; never raises for an unroutable turn (see `ok`)."""
        started = time.perf_counter()
        self.availability.tick()
        source = self.policies
        policy = source.active
        walk = _Walk(self, ctx, policy)
        outcome, chosen, would_fall_back_to, fallbacks = walk.run()
        chose = outcome == "chose"
        return RouteDecision(
            outcome=outcome,
            chosen_model=chosen,
            winner_index=len(walk.chain) - 1 if chose else -1,
            would_fall_back_to=would_fall_back_to,
            fallbacks=fallbacks,
            policy_version=policy.version,
            policy_source=source.source,
            using_last_known_good=source.using_last_known_good,
            offline_mode=self.registry.offline_mode,
            estimated_input_tokens=ctx.estimated_input_tokens,
            elapsed_ms=round((time.perf_counter() - started) * 1000, 3),
            chain=tuple(walk.chain),
            tried=() if chose else tuple(self._explained(t, ctx) for t in walk.tried),
            alternative_providers_configured=() if chose else self._alternatives(walk.tried),
        )

    def _explained(self, tried: TriedCandidate, ctx: TurnContext) -> TriedCandidate:
        """A rejected candidate with its why in words: an unavailable one's from availability,
        and for a window too small the two sizes, so that whoever reads the refusal knows how
        far the turn is from fitting (and whether any model could take it)."""
        if tried.reason == "exceeds_context_window":
            budget = self._models[tried.model].input_budget
            return tried._replace(
                message=f"this turn needs at least ~{ctx.context_floor_tokens:,} input tokens "
                f"(its new content, the system prompt with the project's instructions, and the "
                f"tools); the model takes "
                f"{budget:,} beside its output reserve"
            )
        return tried.explained(self.availability)

    def _alternatives(self, tried: list[TriedCandidate]) -> tuple[str, ...]:
        """Configured, healthy providers owning no tried model (`local` only when offline)."""
        owners = {t.model.partition(":")[0] for t in tried}
        return tuple(
            name
            for name in self.registry.configured_providers()
            if name not in owners
            and self.availability.provider_healthy(name)
            and (name != LOCAL_PROVIDER or self.registry.offline_mode)
        )

    # ---- defaults shown to clients --------------------------------------------------------

    def default_model_for(self, workspace_path: str) -> str | None:
        """The model a session shows as active when it has no sticky."""
        policy = self.policies.active
        scope = policy.scope_for(workspace_path)
        candidates = [
            scope.default if scope else None,
            policy.global_default,
            self.registry.default_model(),
            SCRIPTED_MODEL_ID if self.registry.offline_mode else None,
        ]
        for candidate in candidates:
            if candidate is not None and self.registry.is_configured(candidate):
                return candidate
        return None

    def model_for_tier(self, tier: str, workspace_path: str | None = None) -> str | None:
        """Workspace `tiers`, then global `tiers`, then the registry's first model of the tier."""
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}")
        policy = self.policies.active
        scope = policy.scope_for(workspace_path) if workspace_path else None
        for tiers in (scope.tiers if scope else None, policy.tiers):
            if tiers is not None:
                return tiers[tier]
        return self.registry.model_for_tier(tier)


__all__ = [
    "ChainEntry",
    "PolicySource",
    "RouteDecision",
    "RoutingEngine",
    "RuleAttempt",
    "StaticPolicy",
    "TriedCandidate",
]
