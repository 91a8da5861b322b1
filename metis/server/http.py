"""Request/response plumbing shared by every metis route: the route table (which also feeds the
OpenAPI document), JSON bodies, query strings and JSON responses.

Handlers stay translation-only: parse into a pydantic wire model, call core, render.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args, get_origin

from aiohttp import web
from pydantic import BaseModel, ValidationError

from metis.config import PageSize
from metis.core.canonical import parse_client_json
from metis.server.errors import ApiError, dumps

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BodyPolicy = Literal["none", "optional", "required"]
M = TypeVar("M", bound=BaseModel)


STATE_CHANGING_METHODS = frozenset({"POST", "PATCH", "DELETE", "PUT"})


@dataclass(frozen=True)
class RouteSpec:
    method: str
    path: str
    handler: Handler
    summary: str
    status: int = 200
    body: BodyPolicy = "none"
    request_model: type[BaseModel] | None = None
    query_model: type[BaseModel] | None = None
    response_model: type[BaseModel] | None = None
    errors: tuple[str, ...] = ()
    tag: str = "metis"
    websocket: bool = False
    # served without the daemon's key (metis/server/auth.py); a WebSocket upgrade is
    # authorised by its attach token instead
    public: bool = False

    @property
    def needs_key(self) -> bool:
        return not (self.public or self.websocket)

    @property
    def origin_checked(self) -> bool:
        """A foreign Origin is refused on state-changing methods and WebSocket upgrades."""
        return self.method in STATE_CHANGING_METHODS or self.websocket


@dataclass
class RouteTable:
    """All routes of one surface, declared once with their wire models."""

    specs: list[RouteSpec] = field(default_factory=list)

    def route(self, method: str, path: str, **kwargs: Any) -> Callable[[Handler], Handler]:
        def decorator(handler: Handler) -> Handler:
            summary = kwargs.pop("summary", None) or (handler.__doc__ or "").strip().split("\n")[0]
            self.specs.append(RouteSpec(method, path, handler, summary, **kwargs))
            return handler

        return decorator


ROUTE_SPEC_KEY = web.AppKey("metis.route_specs", dict)


def spec_of(request: web.Request) -> RouteSpec | None:
    specs = request.app.get(ROUTE_SPEC_KEY)
    if specs is None:
        return None
    return specs.get(request.match_info.route)


def json_response(
    data: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    return web.Response(
        status=status,
        text=dumps(data),
        content_type="application/json",
        charset="utf-8",
        headers=headers,
    )


def _pydantic_errors(exc: ValidationError, where: str) -> list[dict[str, Any]]:
    """pydantic errors as `{loc, msg, type}`; the input value is never echoed (may be a secret)."""
    return [
        {"loc": [where, *e["loc"]], "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_input=False, include_url=False, include_context=False)
    ]


def validation_error(
    errors: list[dict[str, Any]], message: str = "request validation failed"
) -> ApiError:
    return ApiError("validation_error", message, {"errors": errors})


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
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise validation_error(
            [{"loc": ["body"], "msg": "body is not UTF-8", "type": "utf8"}]
        ) from None
    try:
        # Stricter than json.loads where it matters: an escaped lone surrogate ("\ud800")
        # cannot be stored or sent as UTF-8 and is refused here, with its position.
        return parse_client_json(text)
    except ValueError as exc:
        raise validation_error(
            [{"loc": ["body"], "msg": f"malformed JSON: {exc}", "type": "json_invalid"}]
        ) from None


async def read_body(request: web.Request, model: type[M], *, required: bool = True) -> M | None:
    """The body validated into `model`; None only when an optional body is absent (empty).

    A JSON `null` is a body that is not an object, never "no body".
    """
    raw = await request.read()
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
    """Known parameters only; repeated, unparseable or out-of-range ones → 400 (never clamped)."""
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
