"""The AAP error envelope and the one table mapping domain errors to AAP wire errors.

AAP bodies use the project envelope `{"error": {"code", "message", "details"}}` (rendered by the
kernel, `metis/http/errors.py`) with a code from the closed table below; the metis REST table is
a different surface with different codes and is never used for `/aap` responses.
"""

from __future__ import annotations

from typing import Any

from metis.core import errors as core
from metis.core.application import ToolNameConflict
from metis.http.errors import WireError
from metis.http.errors import error_response as error_response

# code -> HTTP status: the closed table of the AAP surface. Adding a code is a contract change.
AAP_ERROR_CODES: dict[str, int] = {
    "invalid_json": 400,
    "validation_error": 400,
    "unknown_agent": 400,
    "invalid_option": 400,
    "invalid_tools": 400,
    "invalid_content": 400,
    "invalid_tool_answers": 400,
    "invalid_seed": 400,
    "invalid_cursor": 400,
    "invalid_history_type": 400,
    "unauthorized": 401,
    "origin_not_allowed": 403,
    "session_not_found": 404,
    "history_type_not_supported": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "turn_in_flight": 409,
    "session_already_ended": 409,
    "request_too_large": 413,
    "unsupported_media_type": 415,
    "internal_error": 500,
    "routing_failed": 503,
    "service_shutting_down": 503,
    # another process holds the store's write lock (with `Retry-After`); nothing was written
    "store_locked": 503,
}


class AapError(WireError):
    """A wire error of the AAP surface; rendered by the AAP middleware only."""

    table = AAP_ERROR_CODES


def _answers(exc: core.DomainError) -> AapError:
    keys = ("missing", "unknown", "duplicate", "wrong_kind")
    return AapError("invalid_tool_answers", exc.message, {k: exc.details.get(k, []) for k in keys})


def from_domain(exc: core.DomainError) -> AapError:
    """The single place a core error becomes an AAP error."""
    if isinstance(exc, core.PendingToolCalls | core.InvalidResolution):
        return _answers(exc)
    if isinstance(exc, core.InvalidContent):
        return AapError("invalid_content", exc.message, {"errors": exc.errors})
    if isinstance(exc, core.SessionNotFound | core.SurfaceMismatch):
        # A metis-surface session has no AAP configuration: through AAP it does not exist.
        return AapError("session_not_found", "session not found")
    if isinstance(exc, core.SessionAlreadyEnded):
        return AapError("session_already_ended", exc.message, dict(exc.details))
    if isinstance(exc, core.TurnInFlight):
        return AapError("turn_in_flight", exc.message, dict(exc.details))
    if isinstance(exc, core.RoutingFailed):
        return AapError("routing_failed", exc.message, dict(exc.details))
    if isinstance(exc, core.WorkspaceNotFound | core.WorkspaceRefused | core.WorkspaceInvalid):
        return AapError("invalid_option", exc.message, {"option": "workspace", **exc.details})
    if isinstance(exc, core.ModelNotConfigured):
        return AapError("invalid_option", exc.message, {"option": "model"})
    if isinstance(exc, ToolNameConflict):
        return AapError("invalid_tools", exc.message, dict(exc.details))
    if isinstance(exc, core.StoreBusy):
        retry = {"Retry-After": str(exc.retry_after_s)}
        return AapError("store_locked", exc.message, dict(exc.details), headers=retry)
    return AapError("internal_error", "internal error")


def validation_error(
    errors: list[dict[str, Any]], message: str = "request validation failed"
) -> AapError:
    return AapError("validation_error", message, {"errors": errors})


# The codes a turn request can answer with (v1 `POST /session/:id`, v3 `POST /sessions/:id/turns`).
TURN_ERRORS = (
    "session_not_found",
    "invalid_option",
    "invalid_tools",
    "invalid_content",
    "invalid_tool_answers",
    "turn_in_flight",
    "session_already_ended",
    "routing_failed",
)
