"""Route tables: every route of a surface declared once, with the wire models and error codes
that also feed its OpenAPI operations, so the document cannot drift from the router."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import HttpVersion11, hdrs, web
from pydantic import BaseModel

from metis.http.body import CONTINUE_DUE
from metis.http.errors import WireError, error_response

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
    # answers a text document in one of these media types instead of JSON (an export)
    documents: tuple[str, ...] = ()
    # the surface's wire-error class: renders what is refused on this route before the surface's
    # middleware runs (an unmet `Expect`); None keeps aiohttp's own answer
    wire_error: type[WireError] | None = None
    # a GET route also answers HEAD, through the same handler and checks (aiohttp sends the
    # head of the GET's answer without its body); False where running the GET spends what a
    # HEAD must leave alone (a one-time token): such a HEAD is refused 405
    head: bool = True

    @property
    def answers_head(self) -> bool:
        return self.method == "GET" and self.head

    @property
    def needs_key(self) -> bool:
        return not (self.public or self.websocket)

    @property
    def origin_checked(self) -> bool:
        """A foreign Origin is refused on state-changing methods and WebSocket upgrades."""
        return self.method in STATE_CHANGING_METHODS or self.websocket


@dataclass
class RouteTable:
    """Routes declared with `@table.route(...)`; `tag` is the default OpenAPI tag and
    `wire_error` the surface's wire-error class given to every route."""

    specs: list[RouteSpec] = field(default_factory=list)
    tag: str = ""
    wire_error: type[WireError] | None = None

    def route(self, method: str, path: str, **kwargs: Any) -> Callable[[Handler], Handler]:
        def decorator(handler: Handler) -> Handler:
            summary = kwargs.pop("summary", None) or (handler.__doc__ or "").strip().split("\n")[0]
            kwargs.setdefault("tag", self.tag)
            kwargs.setdefault("wire_error", self.wire_error)
            self.specs.append(RouteSpec(method, path, handler, summary, **kwargs))
            return handler

        return decorator


ROUTE_SPEC_KEY = web.AppKey("metis.route_specs", dict)


EXPECTATION_FAILED_MESSAGE = "the only expectation this server meets is 100-continue"


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """The expect handler of every route: aiohttp calls it, before any middleware, for a
    request carrying `Expect`.

    `100-continue` on HTTP/1.1 is met when the body is about to be read (`solicit_body`), not
    here: a request its surface refuses before reading the body (no key, declared too large,
    not JSON…) is answered at once, and its client never uploads the body (the answer closes
    the connection: `close_if_unsolicited`). HTTP/1.0 has no expectations, so there it is
    ignored. Anything else is refused 417 `expectation_failed` in the route's surface envelope
    with a fixed message: aiohttp's default answer is text/plain quoting the header, and a
    header may carry anything. The connection is closed after it, since whether the client
    sends the body it announced is unknown."""
    if request.version != HttpVersion11:
        return None
    if request.headers.get(hdrs.EXPECT, "").lower() == "100-continue":
        if request.body_exists:
            request[CONTINUE_DUE] = True
        return None
    spec = spec_of(request)
    if spec is None or spec.wire_error is None:  # a surface without a metis envelope here
        raise web.HTTPExpectationFailed()
    response = error_response(spec.wire_error("expectation_failed", EXPECTATION_FAILED_MESSAGE))
    response.force_close()
    return response


def add_routes(app: web.Application, specs: Iterable[RouteSpec]) -> dict[Any, RouteSpec]:
    """Register `specs` on `app`, each answering `Expect` with `expect_continue`; `spec_of`
    finds a request's spec again.

    A GET route (`answers_head`) is registered for HEAD too, mapped to the same spec: HTTP
    asks a general-purpose server to answer HEAD wherever it answers GET, and one handler
    keeps the two answers' status and headers the same. The mapping's values may therefore
    repeat a spec (`unique_specs`)."""
    mapping: dict[Any, RouteSpec] = {}
    for spec in specs:
        methods = (spec.method, hdrs.METH_HEAD) if spec.answers_head else (spec.method,)
        for method in methods:
            route = app.router.add_route(
                method, spec.path, spec.handler, expect_handler=expect_continue
            )
            mapping[route] = spec
    app[ROUTE_SPEC_KEY] = mapping
    return mapping


def unique_specs(mapping: dict[Any, RouteSpec]) -> list[RouteSpec]:
    """The specs `add_routes` registered, each once (a GET's HEAD route shares its spec)."""
    return list({id(spec): spec for spec in mapping.values()}.values())


def spec_of(request: web.Request) -> RouteSpec | None:
    """The spec of the route a request matched, in the (sub-)app handling it; None for none."""
    specs = request.match_info.current_app.get(ROUTE_SPEC_KEY)
    if specs is None:
        return None
    return specs.get(request.match_info.route)


def loopback_origins(port: int) -> tuple[str, ...]:
    """The daemon's own browser origins (its pages are served from these)."""
    return (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}")
