"""Turns over REST: submit (202), cancel, and answer confirmations."""

from typing import Any, Literal

from aiohttp import web
from pydantic import ConfigDict, Field
from pydantic.config import JsonDict

from metis.core.application import Application, TurnRequest
from metis.core.canonical.content import IMAGE_MEDIA_TYPES
from metis.core.canonical.times import format_us
from metis.core.datamodel import DataModel
from metis.http.openapi import BASE64_PATTERN, from_setting
from metis.server.http import RouteTable, json_response, read_body, validation_error
from metis.server.state import STATE_KEY

routes = RouteTable()

# The user content `canonical.parse_user_content` accepts (its blocks are checked there, so a
# bad block is `invalid_content`, not a shape error): documentation of those checks.
_USER_CONTENT: JsonDict = {
    "type": "array",
    "minItems": 1,
    "items": {
        "oneOf": [
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["type", "text"],
                "properties": {
                    "type": {"const": "text"},
                    "text": {"type": "string", "minLength": 1},
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["type", "source"],
                "properties": {
                    "type": {"const": "image"},
                    "source": {
                        "oneOf": [
                            {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["type", "media_type", "data"],
                                "properties": {
                                    "type": {"const": "base64"},
                                    "media_type": {"enum": [*sorted(IMAGE_MEDIA_TYPES)]},
                                    "data": {
                                        "type": "string",
                                        "pattern": BASE64_PATTERN,
                                        # limits.max_image_bytes, as base64 text
                                        **from_setting(maxLength="image_base64_chars"),
                                    },
                                },
                            },
                            {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["type", "url"],
                                "properties": {
                                    "type": {"const": "url"},
                                    "url": {"type": "string", "pattern": "^https://"},
                                },
                            },
                        ]
                    },
                },
            },
        ]
    },
}


class SubmitTurnRequest(DataModel):
    model_config = ConfigDict(extra="forbid")

    content: list[Any] = Field(json_schema_extra=_USER_CONTENT)
    per_message_override: str | None = Field(default=None, strict=True)


class CancelRequest(DataModel):
    model_config = ConfigDict(extra="forbid")

    reason: Literal["user_cancel"] = "user_cancel"


class ConfirmationRequestBody(DataModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["allow", "deny"]
    scope: Literal["once", "session"] = "once"
    reason: str | None = Field(
        default=None, strict=True, json_schema_extra=from_setting(maxLength="reason_chars")
    )


class TurnAcceptedResponse(DataModel):
    turn_id: str
    session_id: str
    submitted_at: str
    user_message_id: str | None
    model: str


class CancelResponse(DataModel):
    turn_id: str
    cancellation_initiated: bool


class ConfirmationResponse(DataModel):
    request_id: str
    decision: str
    scope: str
    applied: bool


def _app(request: web.Request) -> Application:
    return request.app[STATE_KEY].app


@routes.route(
    "POST",
    "/sessions/{session_id}/turns",
    status=202,
    body="required",
    request_model=SubmitTurnRequest,
    response_model=TurnAcceptedResponse,
    errors=(
        "session_not_found",
        "session_already_ended",
        "surface_mismatch",
        "invalid_content",
        "model_not_configured",
        "turn_in_flight",
        "routing_failed",
    ),
)
async def submit_turn(request: web.Request) -> web.Response:
    """Accept a turn; its events follow on the session's WebSocket."""
    body = await read_body(request, SubmitTurnRequest)
    assert body is not None
    session_id = request.match_info["session_id"]
    # submit checks the session (404, 409) before the content
    accepted = await _app(request).turns.submit(
        TurnRequest(session_id, body.content, body.per_message_override)
    )
    return json_response(
        {
            "turn_id": accepted.turn_id,
            "session_id": accepted.session_id,
            "submitted_at": format_us(accepted.submitted_at_us),
            "user_message_id": accepted.user_message_id,
            "model": accepted.model,
        },
        status=202,
    )


@routes.route(
    "POST",
    "/sessions/{session_id}/turns/{turn_id}/cancel",
    status=202,
    body="optional",
    request_model=CancelRequest,
    response_model=CancelResponse,
    errors=(
        "session_not_found",
        "session_already_ended",
        "turn_not_found",
        "turn_already_completed",
    ),
)
async def cancel_turn(request: web.Request) -> web.Response:
    """Cancel a running turn (idempotent); the outcome is `turn.cancelled`."""
    await read_body(request, CancelRequest, required=False)
    turn_id = request.match_info["turn_id"]
    initiated = await _app(request).turns.cancel(request.match_info["session_id"], turn_id)
    return json_response({"turn_id": turn_id, "cancellation_initiated": initiated}, status=202)


@routes.route(
    "POST",
    "/sessions/{session_id}/turns/{turn_id}/confirmations/{request_id}",
    body="required",
    request_model=ConfirmationRequestBody,
    response_model=ConfirmationResponse,
    errors=(
        "session_not_found",
        "turn_not_found",
        "confirmation_not_found",
        "surface_mismatch",
        "confirmation_already_resolved",
    ),
)
async def answer_confirmation(request: web.Request) -> web.Response:
    """Answer a tool confirmation request; the first answer wins."""
    body = await read_body(request, ConfirmationRequestBody)
    assert body is not None
    app = _app(request)
    session_id, turn_id = request.match_info["session_id"], request.match_info["turn_id"]
    request_id = request.match_info["request_id"]
    longest = app.settings.limits.max_reason_chars
    if body.reason is not None and len(body.reason) > longest:
        raise validation_error(
            [
                {
                    "loc": ["body", "reason"],
                    "msg": f"at most {longest} characters",
                    "type": "string_too_long",
                }
            ]
        )
    result = await app.confirmations.answer(
        session_id, turn_id, request_id, body.decision, body.scope, body.reason
    )
    return json_response(
        {
            "request_id": request_id,
            "decision": result.decision,
            "scope": result.scope,
            "applied": result.applied,
        }
    )
