"""Provider/model availability state machine."""

from __future__ import annotations

import pytest

from metis.core.models.registry import SCRIPTED_MODEL_ID, ModelRegistry
from metis.core.routing.availability import Availability
from tests.core.routing.routing_kit import EventLog, ManualClock

SONNET, OPUS, HAIKU = "anthropic:sonnet", "anthropic:opus", "anthropic:haiku"
REFUSED = (  # an auth failure reported without a status (a stream's error event)
    "anthropic refused the key from $ANTHROPIC_API_KEY (auth error): the provider refused this "
    "key; set a valid key in ANTHROPIC_API_KEY and restart the daemon"
)
ANTHROPIC_MODELS = [SONNET, OPUS, HAIKU]


def fail(availability: Availability, model: str, times: int, error: str = "server_error") -> None:
    for _ in range(times):
        availability.record_failure(model, error)


def test_five_counted_failures_within_the_window_take_the_model_out(
    availability: Availability, clock: ManualClock, events: EventLog
) -> None:
    fail(availability, SONNET, 4, "rate_limit")
    assert availability.unavailable_scope(SONNET) is None
    clock.advance(100)
    availability.record_failure(SONNET, "server_error")
    assert availability.unavailable_scope(SONNET) == "model"
    assert availability.unavailable_scope(OPUS) is None
    assert events == [
        (
            "routing.provider_unavailable",
            {
                "provider": "anthropic",
                "scope": "model_specific",
                "models_affected": [SONNET],
                "trigger_reason": "consecutive_failures",
                "since": "2026-05-08T12:01:40.000000Z",
                "message": "5 failed calls in a row",
            },
        )
    ]
    fail(availability, SONNET, 3)
    assert len(events) == 1  # already unavailable: no second transition


def test_a_gap_over_120_seconds_restarts_the_streak(
    availability: Availability, clock: ManualClock
) -> None:
    fail(availability, SONNET, 4)
    clock.advance(121)
    fail(availability, SONNET, 4)
    assert availability.unavailable_scope(SONNET) is None
    availability.record_failure(SONNET, "network")
    assert availability.unavailable_scope(SONNET) == "model"


def test_one_auth_failure_takes_the_provider_out(
    availability: Availability, events: EventLog
) -> None:
    availability.record_failure(HAIKU, "auth")
    assert availability.unavailable_scope(SONNET) == "provider"
    assert availability.unavailable_scope("openai:gpt-5") is None
    assert events.of("routing.provider_unavailable") == [
        {
            "provider": "anthropic",
            "scope": "provider_wide",
            "models_affected": ANTHROPIC_MODELS,
            "trigger_reason": "auth_error",
            "since": "2026-05-08T12:00:00.000000Z",
            "message": REFUSED,
        }
    ]


def test_two_network_failures_within_30_seconds_take_the_provider_out(
    availability: Availability, clock: ManualClock
) -> None:
    availability.record_failure(SONNET, "network")
    clock.advance(30)
    availability.record_failure(OPUS, "network")
    assert availability.unavailable_scope(HAIKU) == "provider"


def test_two_network_failures_spread_over_31_seconds_do_not(
    availability: Availability, clock: ManualClock, events: EventLog
) -> None:
    availability.record_failure(SONNET, "network")
    clock.advance(31)
    availability.record_failure(OPUS, "network")
    assert availability.unavailable_scope(HAIKU) is None
    assert events == []


def test_three_models_out_within_120_seconds_take_the_provider_out(
    availability: Availability, clock: ManualClock, events: EventLog
) -> None:
    for model in ANTHROPIC_MODELS:
        fail(availability, model, 5)
        clock.advance(50)
    assert availability.unavailable_scope("anthropic:haiku") == "provider"
    assert [p["scope"] for p in events.of("routing.provider_unavailable")] == [
        "model_specific",
        "model_specific",
        "model_specific",
        "provider_wide",
    ]
    assert events[-1][1]["trigger_reason"] == "multi_model_failures"


def test_model_outages_older_than_120_seconds_do_not_add_up(
    availability: Availability, clock: ManualClock
) -> None:
    fail(availability, SONNET, 5)
    clock.advance(70)
    fail(availability, OPUS, 5)
    clock.advance(70)
    fail(availability, HAIKU, 5)
    assert availability.unavailable_scope(HAIKU) == "model"


def test_recovery_after_300_seconds_on_probation(
    availability: Availability, clock: ManualClock, events: EventLog
) -> None:
    availability.record_failure(SONNET, "auth")
    clock.advance(299)
    availability.tick()
    assert availability.unavailable_scope(SONNET) == "provider"
    clock.advance(1)
    availability.tick()
    assert availability.unavailable_scope(SONNET) is None
    assert events.of("routing.provider_recovered") == [
        {
            "provider": "anthropic",
            "scope": "provider_wide",
            "models_recovered": ANTHROPIC_MODELS,
            "downtime_seconds": 300.0,
            "recovery_reason": "timeout_elapsed",
        }
    ]
    availability.record_failure(OPUS, "rate_limit")  # one failure on probation re-trips
    assert availability.unavailable_scope(SONNET) == "provider"
    assert events[-1][1]["trigger_reason"] == "probation_failure"


def test_model_probation_retrips_on_the_first_failure(
    availability: Availability, clock: ManualClock, events: EventLog
) -> None:
    fail(availability, SONNET, 5)
    clock.advance(300)
    availability.tick()
    assert availability.unavailable_scope(SONNET) is None
    availability.record_failure(SONNET, "server_error")
    assert availability.unavailable_scope(SONNET) == "model"
    assert events[-1][1]["trigger_reason"] == "probation_failure"
    assert [t for t, _ in events] == [
        "routing.provider_unavailable",
        "routing.provider_recovered",
        "routing.provider_unavailable",
    ]


def test_success_clears_state_and_ends_probation(
    availability: Availability, clock: ManualClock, events: EventLog
) -> None:
    fail(availability, SONNET, 5)
    clock.advance(12.5)
    availability.record_success(SONNET)
    assert availability.unavailable_scope(SONNET) is None
    assert events[-1] == (
        "routing.provider_recovered",
        {
            "provider": "anthropic",
            "scope": "model_specific",
            "models_recovered": [SONNET],
            "downtime_seconds": 12.5,
            "recovery_reason": "success",
        },
    )
    fail(availability, SONNET, 4)  # the streak restarted from zero
    assert availability.unavailable_scope(SONNET) is None
    availability.record_failure(SONNET, "network")
    availability.record_success(OPUS)  # clears the provider's network window
    availability.record_failure(SONNET, "network")
    assert availability.unavailable_scope(HAIKU) is None


def test_probation_ends_with_a_success(availability: Availability, clock: ManualClock) -> None:
    availability.record_failure(SONNET, "auth")
    clock.advance(300)
    availability.tick()
    availability.record_success(SONNET)
    availability.record_failure(SONNET, "rate_limit")
    assert availability.unavailable_scope(SONNET) is None


@pytest.mark.parametrize(
    "error", ["cancelled", "invalid_request", "context_overflow", "content_filter", "other"]
)
def test_uncounted_errors_change_nothing(
    availability: Availability, events: EventLog, error: str
) -> None:
    fail(availability, SONNET, 5, "network")  # provider window would trip on 2
    availability.reset()
    events.clear()
    fail(availability, SONNET, 10, error)
    assert availability.unavailable_scope(SONNET) is None
    availability.record_failure(SONNET, "server_error")
    fail(availability, SONNET, 3, error)
    fail(availability, SONNET, 3, "rate_limit")
    assert availability.unavailable_scope(SONNET) is None  # 4 counted, uncounted ones in between
    assert events == []


def test_the_local_provider_never_changes_state(
    availability: Availability, events: EventLog
) -> None:
    fail(availability, SCRIPTED_MODEL_ID, 10, "auth")
    assert availability.unavailable_scope(SCRIPTED_MODEL_ID) is None
    assert events == []


def test_reset_heals_everything_and_announces_it(
    availability: Availability, clock: ManualClock, events: EventLog
) -> None:
    availability.record_failure(SONNET, "auth")
    fail(availability, "openai:gpt-5", 5)
    clock.advance(10)
    events.clear()
    availability.reset()
    assert availability.unavailable_scope(SONNET) is None
    assert availability.unavailable_scope("openai:gpt-5") is None
    assert [(p["provider"], p["scope"], p["recovery_reason"]) for _, p in events] == [
        ("anthropic", "provider_wide", "manual_reset"),
        ("openai", "model_specific", "manual_reset"),
    ]
    fail(availability, SONNET, 4)  # counters are cleared too
    assert availability.unavailable_scope(SONNET) is None


def test_models_body_shows_each_availability_value(
    registry: ModelRegistry, availability: Availability, clock: ManualClock
) -> None:
    availability.record_failure(SONNET, "auth")
    clock.advance(60)
    fail(availability, "openai:gpt-5", 5)
    body = registry.describe_models(availability)
    by_id = {m["id"]: m for m in body["models"]}
    assert by_id[OPUS]["availability"] == "provider_unavailable"
    assert by_id[OPUS]["availability_detail"] == {
        "scope": "provider",
        "since": "2026-05-08T12:00:00.000000Z",
        "trigger_reason": "auth_error",
        "recovers_at": "2026-05-08T12:05:00.000000Z",
        "message": REFUSED,
    }
    assert by_id["openai:gpt-5"]["availability"] == "model_unavailable"
    assert by_id["openai:gpt-5"]["availability_detail"] == {
        "scope": "model",
        "since": "2026-05-08T12:01:00.000000Z",
        "trigger_reason": "consecutive_failures",
        "recovers_at": "2026-05-08T12:06:00.000000Z",
        "message": "5 failed calls in a row",
    }
    assert by_id["openai:mini"]["availability"] == "healthy"
    assert by_id["openai:mini"]["availability_detail"] is None
    clock.advance(240)
    body = registry.describe_models(availability)  # runs the tick first
    assert {m["id"]: m["availability"] for m in body["models"]}[OPUS] == "healthy"


def test_a_refused_key_and_an_exhausted_quota_are_told_apart(
    availability: Availability, registry: ModelRegistry
) -> None:
    availability.record_failure(HAIKU, "auth", http_status=403, provider_error="permission_error")
    assert availability.unavailable_detail(HAIKU)["message"] == (  # type: ignore[index]
        "anthropic refused the key from $ANTHROPIC_API_KEY (HTTP 403, permission_error): the "
        "provider refused this key; set a valid key in ANTHROPIC_API_KEY and restart the daemon"
    )
    availability.record_failure(
        "openai:gpt-5", "auth", http_status=429, provider_error="insufficient_quota"
    )
    message = availability.unavailable_detail("openai:gpt-5")["message"]  # type: ignore[index]
    assert "(HTTP 429, insufficient_quota)" in message and "quota or billing" in message
    availability.reset()
    assert availability.unavailable_detail(HAIKU) is None
