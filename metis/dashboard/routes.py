"""The dashboard's routes: the page at `/`, its static files, server-side markdown rendering
and the costs summary.

`/` and `/static/…` are public (they hold no data and no secret): without a valid browser
session the page's script shows how to log in (`metis open`, or the login URL `metis serve`
prints; metis/server/auth.py). Every page and file carries a strict
Content-Security-Policy: scripts and styles only from the daemon itself, no inline code.
"""

from datetime import UTC, datetime, time, timedelta, tzinfo
from decimal import Decimal
from functools import lru_cache
from importlib.resources import files
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from aiohttp import web
from pydantic import ConfigDict, Field

from metis.core.canonical.money import decimal_str
from metis.core.canonical.times import now_us
from metis.core.datamodel import DataModel
from metis.dashboard.render import highlight_css, render_markdown
from metis.server.errors import ApiError
from metis.server.http import RouteTable, json_response, parse_query, read_body
from metis.server.state import STATE_KEY, ServerState
from metis.wire.counts import tokens_in

routes = RouteTable()

_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}
MAX_RENDER_TEXTS = 200
MAX_RENDER_CHARS = 1_000_000


@lru_cache(maxsize=1)
def _static_files() -> dict[str, tuple[bytes, str]]:
    """Every shipped file by its path under static/ (the only paths ever served)."""
    root = files("metis.dashboard") / "static"
    found: dict[str, tuple[bytes, str]] = {}

    def walk(node: Any, prefix: str) -> None:
        for child in node.iterdir():
            name = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, f"{name}/")
            else:
                suffix = "." + child.name.rsplit(".", 1)[-1]
                if suffix in _TYPES:
                    found[name] = (child.read_bytes(), _TYPES[suffix])

    walk(root, "")
    found["highlight.css"] = (highlight_css().encode(), "text/css")
    return found


def security_headers(state: ServerState) -> dict[str, str]:
    """Headers of every dashboard response (the WebSocket is the only other origin allowed)."""
    port = state.port
    # a CSP source cannot name an IPv6 literal: the page is served on 127.0.0.1 or localhost
    sockets = f"ws://127.0.0.1:{port} ws://localhost:{port}"
    csp = (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        f"connect-src 'self' {sockets}; font-src 'self'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": csp,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def _file_response(
    state: ServerState, name: str, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    body, content_type = _static_files()[name]
    return web.Response(
        status=status,
        body=body,
        content_type=content_type,
        charset="utf-8",
        headers={**security_headers(state), **(headers or {})},
    )


def login_link_page(state: ServerState, headers: dict[str, str]) -> web.Response:
    """The 401 a browser gets for a used, expired or unknown login link: how to get a new one."""
    return _file_response(state, "login-link.html", status=401, headers=headers)


async def not_found_page(request: web.Request) -> web.Response:
    """The 404 a browser gets for an address no route serves (a typo, an old bookmark): a page
    that points to the dashboard, not the API's JSON refusal of a call without a key."""
    return _file_response(request.app[STATE_KEY], "not-found.html", status=404)


@routes.route("GET", "/", public=True, summary="The dashboard (its script shows how to log in)")
async def index(request: web.Request) -> web.Response:
    """The dashboard's page. It holds no data: the browser-session secret is in the page's
    storage, not in this request, so the page's script decides whether to show the app or
    how to log in (metis/dashboard/static/js/auth.js)."""
    return _file_response(request.app[STATE_KEY], "index.html")


@routes.route(
    "GET",
    "/static/{name:.+}",
    public=True,
    errors=("route_not_found",),
    summary="The dashboard's static files (scripts, styles)",
)
async def static(request: web.Request) -> web.Response:
    """One shipped file; anything else is 404."""
    name = request.match_info["name"]
    if name not in _static_files() or name.endswith(".html"):
        raise ApiError("route_not_found", "no such file")
    return _file_response(request.app[STATE_KEY], name)


class RenderRequest(DataModel):
    model_config = ConfigDict(extra="forbid")

    markdown: list[str] = Field(strict=True, max_length=MAX_RENDER_TEXTS)


class RenderResponse(DataModel):
    html: list[str]


@routes.route(
    "POST",
    "/render/markdown",
    body="required",
    request_model=RenderRequest,
    response_model=RenderResponse,
    summary="Render markdown texts to sanitized HTML (as the dashboard shows model output)",
)
async def render(request: web.Request) -> web.Response:
    """Each text rendered by markdown-it, code highlighted, then sanitized by nh3."""
    body = await read_body(request, RenderRequest)
    assert body is not None
    if sum(len(t) for t in body.markdown) > MAX_RENDER_CHARS:
        raise ApiError(
            "validation_error",
            "request validation failed",
            {
                "errors": [
                    {
                        "loc": ["body", "markdown"],
                        "msg": f"at most {MAX_RENDER_CHARS} characters in all",
                        "type": "too_long",
                    }
                ]
            },
        )
    return json_response({"html": [render_markdown(t) for t in body.markdown]})


class CostsQuery(DataModel):
    days: int = Field(default=30, ge=1, le=366)
    tz: str | None = Field(
        default=None,
        max_length=64,
        description="an IANA time zone (the browser's, `Europe/Paris`): days begin at its "
        "midnight; UTC's without it",
    )


class CostRow(DataModel):
    key: str
    cost_usd: str
    turns: int
    input_tokens: int
    output_tokens: int


class SessionCostRow(CostRow):
    title: str | None = Field(description="the session's title (set, else its first prompt's)")


class CostsResponse(DataModel):
    since: str
    total_usd: str
    by_day: list[CostRow]
    by_model: list[CostRow]
    by_session: list[SessionCostRow]


def _zone(name: str | None) -> tzinfo:
    """The time zone whose days the costs are counted in; a name the system's time zone
    database does not know is a validation error, not a silent UTC."""
    if name is None:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ApiError(
            "validation_error",
            "request validation failed",
            {
                "errors": [
                    {
                        "loc": ["query", "tz"],
                        "msg": f"unknown time zone: {name!r}",
                        "type": "unknown_time_zone",
                    }
                ]
            },
        ) from None


@routes.route("GET", "/costs", query_model=CostsQuery, response_model=CostsResponse)
async def costs(request: web.Request) -> web.Response:
    """Spend of the last `days` days (in the browser's time zone, `tz`) by day, model and
    session, from the turns table (whose model is the one that answered: a turn that failed
    over is its fallback's)."""
    query = parse_query(request, CostsQuery)
    zone = _zone(query.tz)
    history = request.app[STATE_KEY].app.history
    today = datetime.fromtimestamp(now_us() / 1_000_000, zone).date()
    window = [today - timedelta(days=n) for n in range(query.days - 1, -1, -1)]
    first = datetime.combine(window[0], time(), zone)
    since_us = int(first.timestamp() * 1_000_000)
    turns = await history.turns_since(since_us)

    def _day(us: int) -> str:
        return datetime.fromtimestamp(us / 1_000_000, zone).strftime("%Y-%m-%d")

    groups: dict[str, dict[str, dict[str, Any]]] = {"day": {}, "model": {}, "session": {}}
    total = Decimal(0)
    for turn in turns:
        total += turn.cost_usd
        day = _day(turn.started_at_us)
        for kind, key in (("day", day), ("model", turn.model), ("session", turn.session_id)):
            bucket = groups[kind].setdefault(
                key, {"cost": Decimal(0), "turns": 0, "input_tokens": 0, "output_tokens": 0}
            )
            bucket["cost"] += turn.cost_usd
            bucket["turns"] += 1
            bucket["input_tokens"] += tokens_in(turn.tokens)
            bucket["output_tokens"] += turn.tokens["output_tokens"]
    for day in (d.isoformat() for d in window):  # every day of the window, zero when nothing ran
        groups["day"].setdefault(
            day, {"cost": Decimal(0), "turns": 0, "input_tokens": 0, "output_tokens": 0}
        )

    def listed(kind: str, order: Literal["key", "cost"]) -> list[dict[str, Any]]:
        items = [
            {
                "key": key,
                "cost_usd": decimal_str(b["cost"]),
                "turns": b["turns"],
                "input_tokens": b["input_tokens"],
                "output_tokens": b["output_tokens"],
            }
            for key, b in groups[kind].items()
        ]
        if order == "key":
            return sorted(items, key=lambda i: i["key"])
        return sorted(items, key=lambda i: (-Decimal(i["cost_usd"]), -i["turns"], i["key"]))

    by_session = listed("session", "cost")[:20]
    for row in by_session:  # a person knows a session by its title, not its id
        row["title"] = await request.app[STATE_KEY].app.sessions.title(row["key"])
    return json_response(
        {
            "since": window[0].isoformat(),
            "total_usd": decimal_str(total),
            "by_day": listed("day", "key"),
            "by_model": listed("model", "cost"),
            "by_session": by_session,
        }
    )
