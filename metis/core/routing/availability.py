"""Provider and model availability: a small state machine per provider and model.

Routing must stop sending turns to a provider that keeps failing, without a single bad call or a
user's cancel taking a model out of rotation. The TurnRunner reports one outcome per logical LLM
call (after the adapter's own retries); this module turns those reports into healthy/unavailable
transitions, heals scopes after a quiet period (on probation) and announces every transition
through the injected `emit_system_event` callback. State is in memory only.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from metis.core.canonical.times import format_datetime
from metis.core.models.registry import LOCAL_PROVIDER, ModelRegistry
from metis.core.models.types import split_model_id
from metis.core.routing.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

FAILURE_STREAK = 5
STREAK_WINDOW_S = 120.0
NETWORK_BURST = 2
NETWORK_WINDOW_S = 30.0
MULTI_MODEL = 3
MULTI_MODEL_WINDOW_S = 120.0
RECOVERY_AFTER_S = 300.0
MAX_RETRY_AFTER_S = 3600.0
"""The longest a provider's `retry-after` keeps a model out: a bogus header (a day, a year)
must not take it out of routing for good; routing tries it again after an hour."""

COUNTED_ERRORS = frozenset({"rate_limit", "server_error", "network", "auth"})
STREAK_ERRORS = frozenset({"rate_limit", "server_error", "network"})

EmitSystemEvent = Callable[[str, dict[str, Any]], None]
UnavailableScope = Literal["provider", "model"]


@dataclass
class _ScopeState:
    unavailable: bool = False
    since_mono: float = 0.0
    since_wall: datetime | None = None
    trigger: str | None = None
    message: str | None = None  # why, in words a user can act on (never a key)
    probation: bool = False
    out_for_s: float = RECOVERY_AFTER_S  # how long after `since` routing tries it again

    def recovers_at(self) -> str:
        assert self.since_wall is not None
        return format_datetime(self.since_wall + timedelta(seconds=self.out_for_s))

    def detail(self, scope: str) -> dict[str, Any]:
        assert self.since_wall is not None
        return {
            "scope": scope,
            "since": format_datetime(self.since_wall),
            "trigger_reason": self.trigger,
            "recovers_at": self.recovers_at(),
            "message": self.message,
        }


@dataclass
class _ModelState(_ScopeState):
    streak: int = 0
    last_failure: float | None = None


@dataclass
class _ProviderState(_ScopeState):
    network: deque[float] = field(default_factory=deque)
    outages: dict[str, float] = field(default_factory=dict)

    def clear_windows(self) -> None:
        self.network.clear()
        self.outages.clear()


def _no_emit(event_type: str, payload: dict[str, Any]) -> None:
    log.debug("%s %s", event_type, payload)


_TRIGGER_TEXT = {
    "consecutive_failures": f"{FAILURE_STREAK} failed calls in a row",
    "network_burst": f"{NETWORK_BURST} network failures within {NETWORK_WINDOW_S:.0f} s",
    "multi_model_failures": f"{MULTI_MODEL} of its models failed repeatedly",
    "probation_failure": "it failed again right after recovering",
}
_RETRY_AFTER_TEXT = {"rate_limit": "rate-limited", "server_error": "overloaded"}


def retry_after_message(error_class: str, retry_after_s: float | None) -> str | None:
    """Why a provider's `retry-after` takes a model out, e.g. `rate-limited; retry after 120 s`;
    None when it does not (none sent, or a failure that does not count)."""
    if not retry_after_s or error_class not in STREAK_ERRORS:
        return None
    what = _RETRY_AFTER_TEXT.get(error_class, "unavailable")
    return f"{what}; retry after {retry_after_s:.0f} s"


def unsendable_key(registry: ModelRegistry, provider: str) -> str | None:
    """Why `provider`'s key can never be sent (`ProviderConfig.unusable_key`), or None."""
    config = registry.provider(provider)
    return config.unusable_key() if config is not None else None


def key_refused_message(
    registry: ModelRegistry,
    provider: str,
    http_status: int | None = None,
    provider_error: str | None = None,
) -> str:
    """What a provider's auth refusal means, naming where the key comes from (never the key).
    A key no HTTP header can carry was never sent: no provider refused it, and its own message
    says so."""
    unsendable = unsendable_key(registry, provider)
    if unsendable is not None:
        return unsendable
    config = registry.provider(provider)
    env_var = config.api_key_env if config is not None else None
    source = f"${env_var}" if env_var else f"providers.{provider}.api_key in models.yaml"
    status = f"HTTP {http_status}" if http_status is not None else "auth error"
    if provider_error:
        status += f", {provider_error}"
    if http_status is not None and http_status not in (401, 403):
        # e.g. an exhausted quota: the key is known but the account may not use it
        return (
            f"{provider} refused the key from {source} ({status}): the provider refused this "
            "key for this account (quota or billing); fix the account or the key"
        )
    fix = f"set a valid key in {env_var}" if env_var else "correct the key in models.yaml"
    return (
        f"{provider} refused the key from {source} ({status}): the provider refused this key; "
        f"{fix} and restart the daemon"
    )


class Availability:
    """Healthy/unavailable state per provider and per (provider, model)."""

    def __init__(
        self,
        registry: ModelRegistry,
        *,
        emit_system_event: EmitSystemEvent | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._registry = registry
        self._emit = _no_emit if emit_system_event is None else emit_system_event
        self._clock = clock
        self._providers: dict[str, _ProviderState] = {}
        self._models: dict[str, _ModelState] = {}
        # Fast membership sets read by every routing decision.
        self._down_providers: set[str] = set()
        self._down_models: set[str] = set()

    # ---- queries ------------------------------------------------------------------------

    def unavailable_scope(self, model_id: str) -> UnavailableScope | None:
        """`provider` if the model's provider is down, else `model` if the model is, else None."""
        if self._down_providers and split_model_id(model_id)[0] in self._down_providers:
            return "provider"
        if model_id in self._down_models:
            return "model"
        return None

    def provider_healthy(self, provider: str) -> bool:
        """Whether the provider as a whole is in routing; a single model of it may still be out."""
        return provider not in self._down_providers

    def model_status(self, model_id: str) -> tuple[str, dict[str, Any] | None]:
        """`(availability, availability_detail)` as shown by `GET /models`."""
        provider = split_model_id(model_id)[0]
        if provider in self._down_providers:
            return "provider_unavailable", self._providers[provider].detail("provider")
        if model_id in self._down_models:
            return "model_unavailable", self._models[model_id].detail("model")
        return "healthy", None

    def unavailable_detail(self, model_id: str) -> dict[str, Any] | None:
        """Why a model is unavailable and until when (`availability_detail`), or None."""
        return self.model_status(model_id)[1]

    # ---- reports from the TurnRunner ------------------------------------------------------

    def record_success(self, model_id: str) -> None:
        """A logical call completed (any stop reason): the model and its provider are healthy."""
        provider = split_model_id(model_id)[0]
        if provider == LOCAL_PROVIDER:
            return
        model = self._model(model_id)
        if model.unavailable:
            self._recover_model(model_id, model, "success")
        model.streak, model.last_failure, model.probation = 0, None, False
        state = self._provider(provider)
        if state.unavailable:
            self._recover_provider(provider, state, "success")
        state.probation = False
        state.clear_windows()

    def record_failure(
        self,
        model_id: str,
        error_class: str,
        *,
        http_status: int | None = None,
        provider_error: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        """A logical call failed after the adapter's retries with `error_class`.

        Only `rate_limit`, `server_error`, `network` and `auth` count; anything else
        (`cancelled`, `invalid_request`, `context_overflow`, ...) changes nothing. An `auth`
        failure's status and provider code make the unavailability's message precise. A
        `retry_after_s` the provider sent takes the model out until then at once: the provider
        said when it will answer, so a failure streak need not find it out turn by turn.
        """
        provider = split_model_id(model_id)[0]
        if provider == LOCAL_PROVIDER or error_class not in COUNTED_ERRORS:
            return
        now = self._clock.monotonic()
        is_auth = error_class == "auth"
        state = self._provider(provider)
        if not state.unavailable:
            if is_auth:
                message = key_refused_message(self._registry, provider, http_status, provider_error)
                self._trip_provider(provider, state, "auth_error", message)
            elif state.probation:
                self._trip_provider(provider, state, "probation_failure")
            elif error_class == "network":
                state.network.append(now)
                while state.network and now - state.network[0] > NETWORK_WINDOW_S:
                    state.network.popleft()
                if len(state.network) >= NETWORK_BURST:
                    self._trip_provider(provider, state, "network_burst")
        model = self._model(model_id)
        if model.unavailable:
            return
        if retry_after_s is not None:
            retry_after_s = min(retry_after_s, MAX_RETRY_AFTER_S)
        retry_after = retry_after_message(error_class, retry_after_s)
        if retry_after is not None and retry_after_s is not None:
            self._trip_model(model_id, model, "retry_after", retry_after, out_for_s=retry_after_s)
            return
        if model.probation:
            if is_auth:
                message = key_refused_message(self._registry, provider, http_status, provider_error)
                self._trip_model(model_id, model, "auth_error", message)
            else:
                self._trip_model(model_id, model, "probation_failure")
            return
        if error_class not in STREAK_ERRORS:
            return
        if model.last_failure is None or now - model.last_failure > STREAK_WINDOW_S:
            model.streak = 1
        else:
            model.streak += 1
        model.last_failure = now
        if model.streak >= FAILURE_STREAK:
            self._trip_model(model_id, model, "consecutive_failures")
            state.outages[model_id] = now
            for other, at in list(state.outages.items()):
                if now - at > MULTI_MODEL_WINDOW_S:
                    del state.outages[other]
            if len(state.outages) >= MULTI_MODEL and not state.unavailable:
                self._trip_provider(provider, state, "multi_model_failures")

    # ---- time and resets --------------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """Heal scopes whose time out is over (`RECOVERY_AFTER_S`, or the `retry-after` that took
        them out), on probation (run before routing)."""
        if not self._down_providers and not self._down_models:
            return
        now = self._clock.monotonic() if now is None else now
        for name in sorted(self._down_providers):
            state = self._providers[name]
            if now - state.since_mono >= state.out_for_s:
                self._recover_provider(name, state, "timeout_elapsed", now)
                state.probation = True
                state.clear_windows()
        for model_id in sorted(self._down_models):
            model = self._models[model_id]
            if now - model.since_mono >= model.out_for_s:
                self._recover_model(model_id, model, "timeout_elapsed", now)
                model.probation = True
                model.streak, model.last_failure = 0, None

    def reset(self) -> None:
        """Everything healthy, every counter cleared (`POST /routing/reload?reset_availability`)."""
        for name in sorted(self._down_providers):
            self._recover_provider(name, self._providers[name], "manual_reset")
        for model_id in sorted(self._down_models):
            self._recover_model(model_id, self._models[model_id], "manual_reset")
        self._providers.clear()
        self._models.clear()

    def reset_model(self, model_id: str) -> list[str]:
        """Heal one model and its provider, counters cleared (`POST /models/{model}/reset`).

        Returns the models that were unavailable and are healthy now (a provider-wide outage
        heals every model of the provider).
        """
        provider = split_model_id(model_id)[0]
        recovered: list[str] = []
        if provider in self._down_providers:
            recovered += [m for m in self._provider_models(provider) if m not in self._down_models]
            self._recover_provider(provider, self._providers[provider], "manual_reset")
        if model_id in self._down_models:
            recovered.append(model_id)
            self._recover_model(model_id, self._models[model_id], "manual_reset")
        self._providers.pop(provider, None)
        self._models.pop(model_id, None)
        return sorted(set(recovered))

    def unavailable_models(self) -> list[str]:
        """Every registry model routing currently skips (its own or its provider's outage)."""
        return [m.id for m in self._registry.models() if self.unavailable_scope(m.id) is not None]

    # ---- transitions ----------------------------------------------------------------------

    def _provider(self, name: str) -> _ProviderState:
        state = self._providers.get(name)
        if state is None:
            state = self._providers[name] = _ProviderState()
        return state

    def _model(self, model_id: str) -> _ModelState:
        state = self._models.get(model_id)
        if state is None:
            state = self._models[model_id] = _ModelState()
        return state

    def _provider_models(self, provider: str) -> list[str]:
        return [m.id for m in self._registry.models() if m.provider == provider]

    def _trip(
        self, state: _ScopeState, trigger: str, message: str | None, out_for_s: float
    ) -> None:
        state.unavailable, state.probation, state.trigger = True, False, trigger
        state.message = message or _TRIGGER_TEXT.get(trigger, trigger)
        state.out_for_s = out_for_s
        state.since_mono = self._clock.monotonic()
        state.since_wall = self._clock.wall()

    def _trip_provider(
        self, name: str, state: _ProviderState, trigger: str, message: str | None = None
    ) -> None:
        self._trip(state, trigger, message, RECOVERY_AFTER_S)
        self._down_providers.add(name)
        self._announce_down(name, "provider_wide", self._provider_models(name), state)

    def _trip_model(
        self,
        model_id: str,
        state: _ModelState,
        trigger: str,
        message: str | None = None,
        *,
        out_for_s: float = RECOVERY_AFTER_S,
    ) -> None:
        self._trip(state, trigger, message, out_for_s)
        self._down_models.add(model_id)
        self._announce_down(split_model_id(model_id)[0], "model_specific", [model_id], state)

    def _announce_down(
        self, provider: str, scope: str, models: list[str], state: _ScopeState
    ) -> None:
        assert state.since_wall is not None
        log.warning("provider %s unavailable (%s, %s)", provider, scope, state.trigger)
        self._emit(
            "routing.provider_unavailable",
            {
                "provider": provider,
                "scope": scope,
                "models_affected": models,
                "trigger_reason": state.trigger,
                "since": format_datetime(state.since_wall),
                "message": state.message,
            },
        )

    def _recover_provider(
        self, name: str, state: _ProviderState, reason: str, now: float | None = None
    ) -> None:
        self._down_providers.discard(name)
        self._announce_up(name, "provider_wide", self._provider_models(name), state, reason, now)

    def _recover_model(
        self, model_id: str, state: _ModelState, reason: str, now: float | None = None
    ) -> None:
        self._down_models.discard(model_id)
        provider = split_model_id(model_id)[0]
        self._announce_up(provider, "model_specific", [model_id], state, reason, now)

    def _announce_up(
        self,
        provider: str,
        scope: str,
        models: list[str],
        state: _ScopeState,
        reason: str,
        now: float | None,
    ) -> None:
        now = self._clock.monotonic() if now is None else now
        downtime = max(0.0, now - state.since_mono)
        state.unavailable, state.trigger, state.since_wall = False, None, None
        state.message = None
        log.info("provider %s recovered (%s, %s)", provider, scope, reason)
        self._emit(
            "routing.provider_recovered",
            {
                "provider": provider,
                "scope": scope,
                "models_recovered": models,
                "downtime_seconds": round(downtime, 3),
                "recovery_reason": reason,
            },
        )


__all__ = [
    "COUNTED_ERRORS",
    "FAILURE_STREAK",
    "MULTI_MODEL",
    "MULTI_MODEL_WINDOW_S",
    "NETWORK_BURST",
    "NETWORK_WINDOW_S",
    "RECOVERY_AFTER_S",
    "STREAK_WINDOW_S",
    "Availability",
    "EmitSystemEvent",
    "key_refused_message",
    "retry_after_message",
]
