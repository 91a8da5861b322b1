"""Plumbing shared by the v3 and v1 routes on the HTTP kernel (`metis/http/`): the CORS policy
(configured origins, reflected, never credentials; the metis surface never sees CORS), the
façade state, body parsing into wire models, and JSON responses with the CORS headers the
middleware computed for this request. Route tables are the kernel's (`RouteTable(tag="aap-v3")`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from metis.aap.agents import AgentCatalog, Workspaces
from metis.aap.errors import validation_error
from metis.aap.store import AapStore
from metis.config import AapSettings, Settings
from metis.core.application import Application
from metis.http import responses
from metis.http.apikey import ApiKey
from metis.http.body import problem_said

# ---------------------------------------------------------------------------------------------
# CORS for the AAP routes only: configured origins, reflected, never credentials.
# ---------------------------------------------------------------------------------------------

ALLOW_METHODS = "GET, POST, PUT, DELETE, OPTIONS"
ALLOW_HEADERS = "authorization, content-type"
MAX_AGE = "600"


class CorsPolicy:
    def __init__(
        self, origins: Iterable[str], own_origins: Callable[[], Iterable[str]] = tuple
    ) -> None:
        """`own_origins` is called per check: the port is only known once the daemon binds."""
        self.origins = frozenset(origins)
        self.any = "*" in self.origins
        self._own = own_origins

    @property
    def enabled(self) -> bool:
        return bool(self.origins)

    def allowed(self, origin: str) -> bool:
        """May this origin call AAP at all (the 403 `origin_not_allowed` check)?"""
        own = {o.lower() for o in self._own()}
        return origin.lower() in own or self.any or origin in self.origins

    def response_headers(self, origin: str | None) -> dict[str, str]:
        """Headers every AAP response to this origin carries (empty when not allowed)."""
        if origin is None or not self.enabled or not self.allowed(origin):
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    def preflight_headers(self, origin: str | None) -> dict[str, str]:
        headers = self.response_headers(origin)
        if headers:
            headers.update(
                {
                    "Access-Control-Allow-Methods": ALLOW_METHODS,
                    "Access-Control-Allow-Headers": ALLOW_HEADERS,
                    "Access-Control-Max-Age": MAX_AGE,
                }
            )
        return headers


# ---------------------------------------------------------------------------------------------
# Plumbing shared by the v3 and v1 routes on the HTTP kernel (`metis/http/`): the façade
# ---------------------------------------------------------------------------------------------

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


def body_loc(body: Any, loc: Sequence[int | str]) -> list[int | str]:
    """A pydantic error location as a path into the request body.

    pydantic puts segments of its own into `loc` for a union: the tag of a tagged union (a
    message's role) and the member a value failed (`str`, `list[any]`). They name no key of
    what the client sent, so a client following the path would get lost: only the segments
    found in the body are kept, and a last one that is missing (a required field).
    """
    path: list[int | str] = []
    node = body
    for i, part in enumerate(loc):
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_list or (isinstance(node, dict) and part in node):
            node = node[part]
        elif not (isinstance(node, dict) and i == len(loc) - 1):
            continue
        path.append(part)
    return path


def parse_body(request: web.Request, model: type[M]) -> M:
    """The body as a wire model; shape and type errors → 400 `validation_error`."""
    body = raw_body(request)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(
            [
                {"loc": ["body", *body_loc(body, e["loc"])], "msg": problem_said(e)}
                for e in exc.errors(include_input=False, include_url=False, include_context=False)
            ]
        ) from None


def json_response(request: web.Request, data: Any, status: int = 200) -> web.Response:
    return responses.json_response(data, status, cors_headers(request))


def no_content(request: web.Request) -> web.Response:
    return responses.no_content(cors_headers(request))
