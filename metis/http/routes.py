"""Route tables: every route of a surface declared once, with the wire models and error codes
that also feed its OpenAPI operations, so the document cannot drift from the router."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BodyPolicy = Literal["none", "optional", "required"]

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
    tag: str = ""
    websocket: bool = False
    # served without the daemon's key (each surface's auth decides what that allows)
    public: bool = False
    streams: bool = False  # may answer with text/event-stream

    @property
    def needs_key(self) -> bool:
        return not (self.public or self.websocket)

    @property
    def origin_checked(self) -> bool:
        """A foreign Origin is refused on state-changing methods and WebSocket upgrades."""
        return self.method in STATE_CHANGING_METHODS or self.websocket


@dataclass
class RouteTable:
    """Routes declared with `@table.route(...)`; `tag` is the default OpenAPI tag."""

    specs: list[RouteSpec] = field(default_factory=list)
    tag: str = ""

    def route(self, method: str, path: str, **kwargs: Any) -> Callable[[Handler], Handler]:
        def decorator(handler: Handler) -> Handler:
            summary = kwargs.pop("summary", None) or (handler.__doc__ or "").strip().split("\n")[0]
            kwargs.setdefault("tag", self.tag)
            self.specs.append(RouteSpec(method, path, handler, summary, **kwargs))
            return handler

        return decorator


ROUTE_SPEC_KEY = web.AppKey("metis.route_specs", dict)


def add_routes(app: web.Application, specs: Iterable[RouteSpec]) -> dict[Any, RouteSpec]:
    """Register `specs` on `app`; `spec_of` finds a request's spec again."""
    mapping: dict[Any, RouteSpec] = {}
    for spec in specs:
        mapping[app.router.add_route(spec.method, spec.path, spec.handler)] = spec
    app[ROUTE_SPEC_KEY] = mapping
    return mapping


def spec_of(request: web.Request) -> RouteSpec | None:
    """The spec of the route a request matched, in the (sub-)app handling it; None for none."""
    specs = request.match_info.current_app.get(ROUTE_SPEC_KEY)
    if specs is None:
        return None
    return specs.get(request.match_info.route)


def loopback_origins(port: int) -> tuple[str, ...]:
    """The daemon's own browser origins (its pages are served from these)."""
    return (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}")
