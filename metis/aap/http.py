"""Plumbing shared by the v3 and v1 routes on the HTTP kernel (`metis/http/`): the façade
state, body parsing into wire models, and JSON responses with the CORS headers the middleware
computed for this request. Route tables are the kernel's (`RouteTable(tag="aap-v3")`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from metis.aap.agents import AgentCatalog
from metis.aap.cors import CorsPolicy
from metis.aap.errors import validation_error
from metis.aap.store import AapStore
from metis.aap.workspaces import Workspaces
from metis.config import AapSettings, Settings
from metis.core.application import Application
from metis.http import responses
from metis.http.apikey import ApiKey

M = TypeVar("M", bound=BaseModel)

BODY_KEY = web.RequestKey("aap.body", dict)  # the parsed JSON object of a POST/PUT
CORS_KEY = web.RequestKey("aap.cors", dict)  # the CORS headers for this request's response


class Host(Protocol):
    """What the façade needs of the daemon it is mounted in (the metis surface's state):
    the settings, the application, the bound port and the shutdown flag."""

    settings: Settings
    app: Application
    port: int
    shutting_down: bool


@dataclass
class AapState:
    """What every AAP handler needs; one instance shared by the v3 and v1 sub-apps."""

    server: Host
    settings: AapSettings
    api_key: ApiKey
    cors: CorsPolicy
    workspaces: Workspaces
    agents: AgentCatalog
    aap_store: AapStore  # the AAP tables (metis/aap/store.py)

    @property
    def app(self) -> Application:
        return self.server.app


AAP_STATE_KEY = web.AppKey("metis.aap.state", AapState)


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


def json_response(request: web.Request, data: Any, status: int = 200) -> web.Response:
    return responses.json_response(data, status, cors_headers(request))


def no_content(request: web.Request) -> web.Response:
    return responses.no_content(cors_headers(request))
