"""How the chat clients word a failed call to the daemon (pure functions)."""

from __future__ import annotations

from metis.commands.client import ApiFailure
from metis.commands.failures import failure_text

TRIED = [
    {"model": "anthropic:opus", "reason": "provider_unavailable", "message": "the key was refused"},
    {"model": "openai:gpt-5", "reason": "not_configured"},
]
"""The models a routing refusal tried: one unavailable (said why), one not configured."""


def routing_failed(message: str, tried: list[dict[str, str]]) -> ApiFailure:
    return ApiFailure(
        503, {"error": {"code": "routing_failed", "message": message, "details": {"tried": tried}}}
    )


def test_a_routing_failure_says_each_models_reason_once() -> None:
    """The daemon's message names every model it tried, with why: the client added the same
    reasons again after it."""
    said = (
        "no model can serve this turn; tried: anthropic:opus (unavailable: the key was "
        "refused; routing tries it again after 2026-05-08 12:05:00 UTC), openai:gpt-5 (not "
        "configured)"
    )
    failure = routing_failed(said, TRIED)
    assert failure_text(failure) == said


def test_a_refused_explicit_choice_adds_the_models_its_message_does_not_name() -> None:
    """In words: a reason code is read by a person here."""
    said = "the model you asked for, anthropic:opus, is unavailable: the key was refused"
    failure = routing_failed(said, TRIED)
    assert failure_text(failure) == f"{said} (openai:gpt-5: not configured)"
