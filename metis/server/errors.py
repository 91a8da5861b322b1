"""The metis REST error envelope and the one table mapping domain errors to wire errors.

Every non-2xx response of the metis surface is `{"error": {"code", "message", "details"}}` with a
code from the closed table below (also in docs/api.md); nothing outside that table may be sent.
"""

from __future__ import annotations

from metis.core import errors as core
from metis.http.errors import WireError

# code -> HTTP status: the closed table. Adding a code is a contract change.
ERROR_CODES: dict[str, int] = {
    "validation_error": 400,
    "invalid_content": 400,
    "workspace_not_found": 400,
    "model_not_configured": 400,
    "invalid_workspace": 400,
    # a request (or request body) aiohttp's HTTP parser could not read: sent by the connection
    # layer (metis/server/malformed.py) and by `read_body` (metis/server/http.py)
    "malformed_request": 400,
    "unauthorized": 401,
    "attach_token_invalid": 401,
    "host_not_allowed": 403,
    "origin_not_allowed": 403,
    "attach_token_wrong_session": 403,
    "route_not_found": 404,
    "session_not_found": 404,
    "turn_not_found": 404,
    "confirmation_not_found": 404,
    "mcp_server_not_found": 404,
    "method_not_allowed": 405,
    # a request body still incomplete `limits.body_read_timeout_s` after its read began
    "request_timeout": 408,
    "session_already_ended": 409,
    "surface_mismatch": 409,
    "turn_in_flight": 409,
    "turn_already_completed": 409,
    "confirmation_already_resolved": 409,
    "mcp_server_disabled": 409,
    # config.yaml, read again for an MCP server's restart, has become invalid
    "config_invalid": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    # an `Expect` other than 100-continue: answered before the middleware by the routes' expect
    # handler (metis/http/routes.py) or the connection layer (metis/server/malformed.py)
    "expectation_failed": 417,
    "upgrade_required": 426,
    "internal_error": 500,
    "routing_failed": 503,
    "service_shutting_down": 503,
    # another process holds the store's write lock (with `Retry-After`); nothing was written
    "store_locked": 503,
}

# Domain error class -> wire code. Subclasses resolve through the MRO.
_DOMAIN_CODES: dict[type[core.DomainError], str] = {
    core.InvalidContent: "invalid_content",
    core.WorkspaceNotFound: "workspace_not_found",
    core.WorkspaceRefused: "invalid_workspace",
    core.WorkspaceInvalid: "invalid_workspace",
    core.ModelNotConfigured: "model_not_configured",
    core.SessionNotFound: "session_not_found",
    core.SessionAlreadyEnded: "session_already_ended",
    core.SurfaceMismatch: "surface_mismatch",
    core.TurnInFlight: "turn_in_flight",
    core.TurnNotFound: "turn_not_found",
    core.TurnAlreadyCompleted: "turn_already_completed",
    core.RoutingFailed: "routing_failed",
    core.ConfirmationNotFound: "confirmation_not_found",
    core.ConfirmationAlreadyResolved: "confirmation_already_resolved",
    core.ConfirmationPolicyMismatch: "surface_mismatch",
    core.McpServerNotFound: "mcp_server_not_found",
    core.McpServerDisabled: "mcp_server_disabled",
    core.McpConfigInvalid: "config_invalid",
    core.StoreBusy: "store_locked",
}


class ApiError(WireError):
    """A wire error raised by the metis surface itself (validation, media type, routing)."""

    table = ERROR_CODES


def from_domain(exc: core.DomainError) -> ApiError:
    for cls in type(exc).__mro__:
        code = _DOMAIN_CODES.get(cls)
        if code is not None:
            if isinstance(exc, core.ConfirmationPolicyMismatch):
                # a `suspend` request belongs to the AAP façade (core names no surface)
                return ApiError(code, "this request is answered through AAP", {"surface": "aap"})
            if isinstance(exc, core.StoreBusy):
                retry = {"Retry-After": str(exc.retry_after_s)}
                return ApiError(code, exc.message, dict(exc.details), headers=retry)
            return ApiError(code, exc.message, dict(exc.details))
    return ApiError("internal_error", "internal error")
