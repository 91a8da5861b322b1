"""A provider's `retry-after` takes the model out of routing until then, at once."""

from __future__ import annotations

import pytest

from metis.core.routing.availability import Availability, retry_after_message
from tests.core.routing.routing_kit import EventLog, ManualClock

SONNET, OPUS = "anthropic:sonnet", "anthropic:opus"


def test_a_rate_limit_with_retry_after_takes_the_model_out_until_then(
    availability: Availability, clock: ManualClock, events: EventLog
) -> None:
    availability.record_failure(SONNET, "rate_limit", http_status=429, retry_after_s=120)
    assert availability.unavailable_scope(SONNET) == "model"
    assert availability.unavailable_scope(OPUS) is None  # its provider stays in
    status, detail = availability.model_status(SONNET)
    assert status == "model_unavailable" and detail == {
        "scope": "model",
        "since": "2026-05-08T12:00:00.000000Z",
        "trigger_reason": "retry_after",
        "recovers_at": "2026-05-08T12:02:00.000000Z",
        "message": "rate-limited; retry after 120 s",
    }
    assert events.of("routing.provider_unavailable")[0]["trigger_reason"] == "retry_after"
    clock.advance(119)
    availability.tick()
    assert availability.unavailable_scope(SONNET) == "model"
    clock.advance(1)
    availability.tick()
    assert availability.unavailable_scope(SONNET) is None
    assert events.of("routing.provider_recovered")[0]["downtime_seconds"] == 120.0


def test_after_it_a_new_retry_after_is_honoured_not_the_probation_timeout(
    availability: Availability, clock: ManualClock
) -> None:
    availability.record_failure(SONNET, "rate_limit", retry_after_s=30)
    clock.advance(30)
    availability.tick()
    availability.record_failure(SONNET, "server_error", retry_after_s=45)
    detail = availability.unavailable_detail(SONNET)
    assert detail is not None and detail["message"] == "overloaded; retry after 45 s"
    assert detail["recovers_at"] == "2026-05-08T12:01:15.000000Z"


@pytest.mark.parametrize(
    ("error_class", "retry_after_s"),
    [("rate_limit", None), ("rate_limit", 0.0), ("invalid_request", 60.0), ("cancelled", 60.0)],
)
def test_no_retry_after_or_an_uncounted_failure_takes_nothing_out(
    availability: Availability, error_class: str, retry_after_s: float | None
) -> None:
    availability.record_failure(SONNET, error_class, retry_after_s=retry_after_s)
    assert availability.unavailable_scope(SONNET) is None
    assert retry_after_message(error_class, retry_after_s) is None


@pytest.mark.parametrize("retry_after_s", [86_400.0 * 365, 1e300])
def test_a_retry_after_of_more_than_an_hour_keeps_the_model_out_for_an_hour(
    availability: Availability, clock: ManualClock, retry_after_s: float
) -> None:
    """A bogus header (a year, 1e300 s) must not take a model out of routing for good."""
    availability.record_failure(SONNET, "rate_limit", retry_after_s=retry_after_s)
    detail = availability.unavailable_detail(SONNET)
    assert detail is not None and detail["recovers_at"] == "2026-05-08T13:00:00.000000Z"
    assert detail["message"] == "rate-limited; retry after 3600 s"
    clock.advance(3600)
    availability.tick()
    assert availability.unavailable_scope(SONNET) is None
