"""GET /health, /server/version and /openapi.json."""

from collections.abc import Callable
from typing import Literal

from aiohttp import web
from pydantic import Field

from metis.core.canonical.messages import SCHEMA_VERSION
from metis.core.canonical.times import format_us
from metis.core.datamodel import DataModel
from metis.server.http import RouteTable, json_response
from metis.server.state import STATE_KEY
from metis.version import metis_version

routes = RouteTable()
# The document's builder (memoised): generating the models' schemas is the costliest step
# of building the app, and most daemons never serve the document.
OPENAPI_KEY: web.AppKey[Callable[[], dict[str, object]]] = web.AppKey("metis.openapi")


class HealthResponse(DataModel):
    status: str
    started_at: str
    uptime_seconds: float
    active_sessions: int
    active_turns: int
    shell_sandbox: Literal["bubblewrap", "none"]


class SchemaVersions(DataModel):
    canonical_message: int
    events: int
    routing_policy: int
    storage: int


class VersionResponse(DataModel):
    version: str
    schema_versions: SchemaVersions
    streaming_protocol: int
    shell_sandbox: Literal["bubblewrap", "none"]
    start_up_files: dict[str, str | None] = Field(
        description="the sha256 (hex) of each file of METIS_HOME read once at start-up "
        "(`config.yaml`, `models.yaml`), as the daemon read it; null when the home held none "
        "(the defaults, or the shipped models.yaml, are in force). A file whose bytes differ "
        "now was edited since: the edit applies when the daemon restarts"
    )


@routes.route(
    "GET",
    "/health",
    public=True,
    response_model=HealthResponse,
    errors=("service_shutting_down",),
)
async def health(request: web.Request) -> web.Response:
    """Liveness and load: O(1), from in-memory counters only (never scans the store)."""
    system = request.app[STATE_KEY].app.system
    return json_response(
        {
            "status": "ok",
            "started_at": format_us(system.started_at_us),
            "uptime_seconds": round(system.uptime_seconds, 3),
            "active_sessions": system.active_session_count(),
            "active_turns": system.active_turn_count(),
            "shell_sandbox": system.shell_sandbox,
        }
    )


@routes.route("GET", "/server/version", response_model=VersionResponse)
async def server_version(request: web.Request) -> web.Response:
    """Package version and the schema versions clients may check."""
    system = request.app[STATE_KEY].app.system
    return json_response(
        {
            "version": metis_version(),
            "schema_versions": {
                "canonical_message": SCHEMA_VERSION,
                "events": 1,
                "routing_policy": 1,
                "storage": system.schema_version,
            },
            "streaming_protocol": 1,
            "shell_sandbox": system.shell_sandbox,
            "start_up_files": system.start_up_digests,
        }
    )


@routes.route("GET", "/openapi.json", public=True)
async def openapi(request: web.Request) -> web.Response:
    """The OpenAPI 3.1 document generated from the routes' pydantic models (at the first
    request: it is the same document for the daemon's whole life)."""
    return json_response(request.app[OPENAPI_KEY]())
