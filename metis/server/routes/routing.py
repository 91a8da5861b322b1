"""GET /routing/policy, POST /routing/check, POST /routing/reload, GET /routing/decisions,
GET /models, and the availability resets POST /models/reset and POST /models/{model}/reset."""

from typing import Any

from aiohttp import web
from pydantic import ConfigDict, Field

from metis.core.datamodel import DataModel
from metis.core.errors import ModelNotConfigured
from metis.server.http import RouteTable, json_response, parse_query, read_body
from metis.server.state import STATE_KEY

routes = RouteTable()


class RoutingCheckRequest(DataModel):
    model_config = ConfigDict(extra="forbid")

    policy_yaml: str | None = Field(default=None, strict=True)


class ReloadQuery(DataModel):
    reset_availability: bool = False


class ErrorDetail(DataModel):
    """One error of the file named in `file`, where it is (line/column are 1-based or null)."""

    file: str | None
    line: int | None
    column: int | None
    code: str
    path: str
    message: str


class PolicyResponse(DataModel):
    version: str
    valid: bool
    loaded_at: str | None
    source: str
    path: str | None
    file_version: str | None
    global_default: str | None
    fallback_model: str | None = Field(
        description="the model of a turn that no rule, workspace default or global_default "
        "picks: the first configured model of models.yaml (null when none is configured)"
    )
    tiers: dict[str, Any]
    rules: list[dict[str, Any]]
    workspaces: dict[str, Any]
    pattern: dict[str, Any]
    errors: list[str]
    warnings: list[str]
    using_last_known_good: bool
    in_force: str
    reason: str
    user_file: str
    error_details: list[ErrorDetail]


class CheckResponse(DataModel):
    valid: bool
    errors: list[str]
    warnings: list[str]
    diagnostics: list[dict[str, Any]]
    version: str


class ReloadResponse(DataModel):
    version: str
    valid: bool
    changed: bool
    source: str
    using_last_known_good: bool
    errors: list[str]
    warnings: list[str]
    availability_reset: bool
    in_force: str
    reason: str
    user_file: str
    error_details: list[ErrorDetail]


class ResetResponse(DataModel):
    model: str | None
    recovered: list[str]


class DecisionsQuery(DataModel):
    limit: int = Field(default=20, ge=1, le=200)


class DecisionsResponse(DataModel):
    decisions: list[dict[str, Any]] = Field(
        description="`route.decided` events of every session, newest first, as the events "
        "pages give them"
    )


class ModelsResponse(DataModel):
    offline_mode: bool
    pricing_version: str
    models: list[dict[str, Any]]
    unconfigured: list[dict[str, Any]]


@routes.route("GET", "/routing/policy", response_model=PolicyResponse)
async def routing_policy(request: web.Request) -> web.Response:
    """The policy in use, plus the state of the on-disk file."""
    return json_response(request.app[STATE_KEY].app.routing.describe())


@routes.route(
    "POST",
    "/routing/check",
    body="optional",
    request_model=RoutingCheckRequest,
    response_model=CheckResponse,
)
async def routing_check(request: web.Request) -> web.Response:
    """Validate a policy (the body's text, else the on-disk file); changes nothing."""
    body = await read_body(request, RoutingCheckRequest, required=False)
    text = body.policy_yaml if body is not None else None
    return json_response(request.app[STATE_KEY].app.routing.check(text))


@routes.route("POST", "/routing/reload", query_model=ReloadQuery, response_model=ReloadResponse)
async def routing_reload(request: web.Request) -> web.Response:
    """Re-read and re-validate routing.yaml; an invalid file keeps the active policy."""
    query = parse_query(request, ReloadQuery)
    routing = request.app[STATE_KEY].app.routing
    return json_response(await routing.reload(reset_availability=query.reset_availability))


@routes.route(
    "GET", "/routing/decisions", query_model=DecisionsQuery, response_model=DecisionsResponse
)
async def routing_decisions(request: web.Request) -> web.Response:
    """The newest route decisions across sessions (the sessions' own event pages have each
    one's); `limit` of them, 20 unless asked."""
    query = parse_query(request, DecisionsQuery)
    history = request.app[STATE_KEY].app.history
    decided = await history.newest_events_of_type("route.decided", query.limit)
    return json_response({"decisions": [e.wire() for e in decided]})


@routes.route("GET", "/models", response_model=ModelsResponse)
async def models(request: web.Request) -> web.Response:
    """Configured models with availability, and declared-but-unconfigured ones."""
    return json_response(request.app[STATE_KEY].app.models.describe())


@routes.route("POST", "/models/reset", response_model=ResetResponse)
async def reset_models(request: web.Request) -> web.Response:
    """Mark every model and provider healthy again; `recovered` lists the models that were not."""
    recovered = request.app[STATE_KEY].app.routing.reset_all()
    return json_response({"model": None, "recovered": recovered})


@routes.route(
    "POST",
    "/models/{model}/reset",
    response_model=ResetResponse,
    errors=("model_not_configured",),
)
async def reset_model(request: web.Request) -> web.Response:
    """Mark one model (id or alias) and its provider healthy again, counters cleared."""
    app = request.app[STATE_KEY].app
    ref = request.match_info["model"]
    model_id = app.models.resolve(ref)
    if model_id is None:
        raise ModelNotConfigured(f"unknown model '{ref}'", reference=ref, reason="unknown")
    return json_response({"model": model_id, "recovered": app.routing.reset_model(model_id)})
