"""Plumbing shared by the v3 and v1 routes: the route table (also feeding `/openapi.json`),
the façade state, body parsing into wire models, and JSON responses with the CORS headers the
middleware computed for this request."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from metis.aap.agents import AgentCatalog
from metis.aap.auth import ApiKey
from metis.aap.cors import CorsPolicy
from metis.aap.errors import validation_error
from metis.aap.settings import AapSettings
from metis.aap.store import AapStore
from metis.aap.workspaces import Workspaces

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)

BODY_KEY = web.RequestKey("aap.body", dict)  # the parsed JSON object of a POST/PUT
CORS_KEY = web.RequestKey("aap.cors", dict)  # the CORS headers for this request's response


@dataclass
class AapState:
    """What every AAP handler needs; one instance shared by the v3 and v1 sub-apps."""

    server: Any  # metis.server.state.ServerState
    settings: AapSettings
    api_key: ApiKey
    cors: CorsPolicy
    workspaces: Workspaces
    agents: AgentCatalog
    store: AapStore

    @property
    def core(self) -> Any:
        return self.server.core


AAP_STATE_KEY = web.AppKey("metis.aap.state", AapState)


@dataclass(frozen=True)
class AapRoute:
    method: str
    path: str
    handler: Handler
    summary: str
    status: int = 200
    body: bool = False
    public: bool = False  # GET /meta: no key needed (a wrong non-empty key is still 401)
    request_model: type[BaseModel] | None = None
    response_model: type[BaseModel] | None = None
    errors: tuple[str, ...] = ()
    streams: bool = False  # may answer with text/event-stream


@dataclass
class AapRoutes:
    version: int
    routes: list[AapRoute] = field(default_factory=list)

    def route(self, method: str, path: str, **kwargs: Any) -> Callable[[Handler], Handler]:
        def decorator(handler: Handler) -> Handler:
            summary = (handler.__doc__ or "").strip().split("\n")[0]
            self.routes.append(AapRoute(method, path, handler, summary, **kwargs))
            return handler

        return decorator


def state_of(request: web.Request) -> AapState:
    return request.config_dict[AAP_STATE_KEY]


def cors_headers(request: web.Request) -> dict[str, str]:
    return dict(request.get(CORS_KEY) or {})


def raw_body(request: web.Request) -> dict[str, Any]:
    return request[BODY_KEY]


def parse_body(request: web.Request, model: type[M]) -> M:
    """The body as a wire model; shape and type errors → 400 `validation_error`."""
    try:
        return model.model_validate(raw_body(request))
    except ValidationError as exc:
        raise validation_error(
            [
                {"loc": ["body", *e["loc"]], "msg": e["msg"]}
                for e in exc.errors(include_input=False, include_url=False, include_context=False)
            ]
        ) from None


def dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def json_response(request: web.Request, data: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        text=dumps(data),
        content_type="application/json",
        charset="utf-8",
        headers=cors_headers(request),
    )


def no_content(request: web.Request) -> web.Response:
    return web.Response(status=204, headers=cors_headers(request))
