"""The metis surface's request plumbing on the HTTP kernel (`metis/http/`): its route table
(operations tagged `metis`), JSON bodies and query strings refused with its `validation_error`.

Handlers stay translation-only: parse into a pydantic wire model, call core, render.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar, get_args, get_origin

from aiohttp import web
from pydantic import BaseModel, ValidationError

from metis.config import PageSize
from metis.http import routes
from metis.http.body import BodyRefused, decode_json, problem_said, read_whole
from metis.http.errors import WireError
from metis.http.responses import json_response as json_response
from metis.http.routes import ROUTE_SPEC_KEY as ROUTE_SPEC_KEY
from metis.http.routes import RouteSpec as RouteSpec
from metis.server.errors import ApiError
from metis.server.state import STATE_KEY

M = TypeVar("M", bound=BaseModel)


@dataclass
class RouteTable(routes.RouteTable):
    """All routes of one part of the metis surface, declared once with their wire models; what
    is refused on them before the middleware (an unmet `Expect`) is an `ApiError` too."""

    tag: str = "metis"
    wire_error: type[WireError] | None = ApiError


def _pydantic_errors(exc: ValidationError, where: str) -> list[dict[str, Any]]:
    """pydantic errors as `{loc, msg, type}`; the input value is never echoed (may be a secret)."""
    return [
        {"loc": [where, *e["loc"]], "msg": problem_said(e), "type": e["type"]}
        for e in exc.errors(include_input=False, include_url=False, include_context=False)
    ]


def validation_error(
    errors: list[dict[str, Any]],
    message: str = "request validation failed",
    *,
    headers: dict[str, str] | None = None,
) -> ApiError:
    return ApiError("validation_error", message, {"errors": errors}, headers=headers)


def page_limit(requested: int | None, size: PageSize) -> int:
    """A list endpoint's `limit`: the configured default when absent; over the maximum → 400
    (never clamped, so a client learns the page is smaller than it asked)."""
    if requested is None:
        return size.default
    if requested > size.maximum:
        raise validation_error(
            [
                {
                    "loc": ["query", "limit"],
                    "msg": f"must be at most {size.maximum}",
                    "type": "less_than_equal",
                }
            ]
        )
    return requested


def _decode_json(raw: bytes) -> Any:
    """A request body's JSON value; undecodable or malformed → 400 `validation_error`."""
    try:
        return decode_json(raw)
    except BodyRefused as exc:
        kind = "utf8" if exc.reason == "not_utf8" else "json_invalid"
        raise validation_error([{"loc": ["body"], "msg": exc.message, "type": kind}]) from None


async def read_body(request: web.Request, model: type[M], *, required: bool = True) -> M | None:
    """The body validated into `model`; None only when an optional body is absent (empty).

    A JSON `null` is a body that is not an object, never "no body". A body the HTTP parser
    could not read (its chunked framing broken after the head was routed) is 400
    `malformed_request`, as the same bytes arriving with the head are, and the connection is
    closed after the answer (metis/server/malformed.py): nothing after the break can be parsed.
    A body still incomplete `limits.body_read_timeout_s` after the read began is 408
    `request_timeout`, and the connection is closed too.
    """
    limits = request.config_dict[STATE_KEY].settings.limits
    try:
        raw = await read_whole(request, limits.body_read_timeout_s)
    except BodyRefused as exc:
        # nothing after a broken or missing body can be read as a next request: close after
        code = "request_timeout" if exc.reason == "too_slow" else "malformed_request"
        raise ApiError(code, exc.message, headers={"Connection": "close"}) from None
    if not raw:
        if required:
            raise validation_error(
                [{"loc": ["body"], "msg": "a JSON body is required", "type": "missing"}]
            )
        return None
    data = _decode_json(raw)
    if not isinstance(data, dict):
        raise validation_error(
            [{"loc": ["body"], "msg": "body must be a JSON object", "type": "dict_type"}]
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(_pydantic_errors(exc, "body")) from None


def _admits(annotation: Any, kind: type) -> bool:
    """Whether a field's annotation is `kind` or an optional/union containing it."""
    if annotation is kind:
        return True
    return get_origin(annotation) is not None and kind in get_args(annotation)


# Query integers are plain decimal digits: pydantic's lax str→int would also take "5_0",
# "1.0", "+3" and " 3 ", which no client means as a page size.
_QUERY_INT = re.compile(r"-?[0-9]+")


def parse_query(request: web.Request, model: type[M]) -> M:
    """The route's parameters; repeated, unparseable or out-of-range ones → 400 (never clamped).
    Unknown ones never get here: the middleware refused them (`refuse_undeclared`)."""
    data: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        values = request.query.getall(key, [])
        if not values:
            continue
        if len(values) > 1:
            errors.append(
                {"loc": ["query", key], "msg": "parameter given more than once", "type": "repeated"}
            )
            continue
        value: Any = values[0]
        if _admits(info.annotation, bool):
            lowered = value.lower()
            if lowered not in ("true", "false"):
                errors.append(
                    {"loc": ["query", key], "msg": "must be true or false", "type": "bool_parsing"}
                )
                continue
            value = lowered == "true"
        elif _admits(info.annotation, int) and not _QUERY_INT.fullmatch(value):
            errors.append(
                {"loc": ["query", key], "msg": "must be a decimal integer", "type": "int_parsing"}
            )
            continue
        data[key] = value
    if errors:
        raise validation_error(errors)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(_pydantic_errors(exc, "query")) from None


# What a WebSocket upgrade reads from its query: the attach token (metis/server/ws/handshake.py).
_UPGRADE_QUERY = frozenset({"attach"})


@cache
def _query_names(model: type[BaseModel] | None) -> frozenset[str]:
    """The parameters a query model reads, by the names `parse_query` looks them up by."""
    if model is None:
        return frozenset()
    return frozenset(info.alias or name for name, info in model.model_fields.items())


def has_body(request: web.Request) -> bool:
    """Whether the request announces a body: a non-zero length, or chunks to come."""
    chunked = request.headers.get("Transfer-Encoding", "").lower() == "chunked"
    return (request.content_length or 0) > 0 or chunked


def refuse_undeclared(request: web.Request, spec: RouteSpec, *, query: bool = True) -> None:
    """400 `validation_error` for what a route would ignore: a query parameter it does not
    declare (`query=False`: the query is not checked) and a body on a route that takes none.

    Ignored, they looked accepted (`DELETE …?purged=true`, or with a `{"purge": true}` body,
    ended a session instead of erasing it); they are refused as unknown body fields are
    (`extra_forbidden`). A refused body is left unread, so the connection is closed after.
    """
    errors: list[dict[str, Any]] = []
    if query and request.query_string:
        errors += _unknown_parameters(request, spec)
    body = spec.body == "none" and has_body(request)
    if body:
        errors.append(
            {"loc": ["body"], "msg": "this route takes no body", "type": "extra_forbidden"}
        )
    if errors:
        raise validation_error(errors, headers={"Connection": "close"} if body else None)


def _unknown_parameters(request: web.Request, spec: RouteSpec) -> list[dict[str, Any]]:
    known = _query_names(spec.query_model) | (_UPGRADE_QUERY if spec.websocket else frozenset())
    said = f"this route takes {', '.join(sorted(known))}" if known else "this route takes none"
    return [
        {
            "loc": ["query", name],
            "msg": f"unknown query parameter; {said}",
            "type": "extra_forbidden",
        }
        for name in dict.fromkeys(request.query)
        if name not in known
    ]
