"""The AAP routes in `/openapi.json`, from the same route tables that register them.

AAP operations list AAP error codes (`metis/aap/errors.py`) in `x-error-codes`; they never mix
with the metis REST table.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from metis.aap import routes_v1, routes_v3
from metis.aap.errors import AAP_ERROR_CODES
from metis.aap.wire import StopReason, Wire
from metis.config import AapSettings
from metis.core.canonical.ids import ULID_CHARS
from metis.http import openapi
from metis.http.routes import RouteSpec

_ALWAYS = (
    "unauthorized",  # `GET /meta` too: it is public, but a non-empty wrong key is refused
    "not_found",
    "method_not_allowed",
    "service_shutting_down",
    "internal_error",
)
_WITH_BODY = (
    "origin_not_allowed",
    "request_too_large",
    "unsupported_media_type",
    "invalid_json",
    "validation_error",
)
PREFIXES = {3: "/aap", 1: "/aap/v1"}
PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    # a value outside it names no session: 404 session_not_found
    "session_id": {"type": "string", "pattern": f"^sess_{ULID_CHARS}$"},
    "tail": {"type": "string"},
}
# The longest `data:image/<type>;base64,` prefix a data URI may carry (jpeg, webp).
_DATA_URI_PREFIX = len("data:image/jpeg;base64,")


# ---- the events of a turn's `text/event-stream` reply (rendered by `stream.py`) --


class SessionStart(Wire):
    session_id: str


class TurnStart(Wire):
    pass


class Delta(Wire):
    delta: str


class Text(Wire):
    text: str


class Thinking(Wire):
    thinking: str


class ToolCall(Wire):
    tool_call_id: str
    name: str
    input: dict[str, Any]


class ToolResult(Wire):
    tool_call_id: str
    content: str | list[dict[str, Any]]


class TurnStop(Wire):
    stop_reason: StopReason


STREAM_EVENTS: dict[str, type[BaseModel]] = {
    "session_start": SessionStart,  # the first event of a v1 create-and-run only
    "turn_start": TurnStart,
    "text_delta": Delta,  # stream "delta" only
    "thinking_delta": Delta,  # stream "delta" only
    "text": Text,  # stream "message" only
    "thinking": Thinking,  # stream "message" only
    "tool_call": ToolCall,
    "tool_result": ToolResult,
    "turn_stop": TurnStop,  # always the last event
}
_STREAM = (
    'Server-sent events (stream "delta" or "message"), in order: turn_start, the turn\'s '
    "events, then turn_stop; comment lines keep an idle stream alive."
)


def setting_limits(settings: AapSettings) -> dict[str, Any]:
    """The values of the `from_setting` names the AAP wire models use (`mapping.py` checks)."""
    return {
        "image_uri_chars": _DATA_URI_PREFIX + openapi.base64_length(settings.max_image_bytes),
    }


def _operation(route: RouteSpec, version: int, components: dict[str, Any]) -> dict[str, Any]:
    prefix = f"AapV{version}"
    has_body = route.body != "none"
    codes = list(dict.fromkeys((*route.errors, *_ALWAYS, *(_WITH_BODY if has_body else ()))))
    if route.method == "DELETE":
        codes.append("origin_not_allowed")
    op: dict[str, Any] = {
        "summary": route.summary,
        "tags": [route.tag],
        "responses": {},
        "x-error-codes": list(dict.fromkeys(codes)),
    }
    params = openapi.path_parameters(route.path, PATH_PARAMETERS)
    if route.query_model is not None:
        params += openapi.query_parameters(route.query_model)
    if params:
        op["parameters"] = params
    if not route.public:
        op["security"] = [{"aapBearer": []}]
    body = openapi.request_body(route, components, prefix)
    if body is not None:
        op["requestBody"] = body
    op["responses"][str(route.status)] = openapi.success_response(route, components, prefix)
    if route.streams:
        # An SSE reply is always 200, whatever the JSON reply's status.
        stream = op["responses"].setdefault("200", {"description": "success (stream)"})
        events = {
            name: openapi.schema_ref(model, components, f"{prefix}Stream")
            for name, model in STREAM_EVENTS.items()
        }
        stream.setdefault("content", {})["text/event-stream"] = openapi.event_stream(
            events, _STREAM
        )
    openapi.add_error_responses(op["responses"], op["x-error-codes"], AAP_ERROR_CODES)
    return op


def extend(doc: dict[str, Any], settings: AapSettings) -> dict[str, Any]:
    """Add every AAP route (and each sub-app's preflight catch-all) to a metis OpenAPI doc,
    with the limits `settings` sets."""
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    schemes = doc["components"].setdefault("securitySchemes", {})
    schemes["aapBearer"] = {"type": "http", "scheme": "bearer"}
    for version, table in ((3, routes_v3.routes), (1, routes_v1.routes)):
        base = PREFIXES[version]
        for route in table.specs:
            path = base + route.path
            doc["paths"].setdefault(path, {})[route.method.lower()] = _operation(
                route, version, components
            )
        doc["paths"].setdefault(base + "/{tail}", {})["options"] = {
            "summary": "CORS preflight for any AAP path (no auth)",
            "tags": [f"aap-v{version}"],
            "parameters": openapi.path_parameters("/{tail}", PATH_PARAMETERS),
            "security": [],
            "responses": {"204": {"description": "preflight answered"}},
            "x-error-codes": [],
        }
    openapi.resolve_settings(doc, setting_limits(settings).__getitem__)
    return doc
