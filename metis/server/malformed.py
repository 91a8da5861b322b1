"""Requests aiohttp's parser refuses, answered with the JSON error envelope.

A bad request line, a header with a forbidden character, a bad chunked body, a line over the
parser's limit, or bytes that are not HTTP at all (TLS sent to the plain port) never reach the
app, its middleware or a route: aiohttp answers them itself, from
`RequestHandler.handle_error`, with a plain-text body quoting the bytes it choked on. aiohttp
has no public hook for that answer, so the daemon's `AppRunner` makes its `Server` build
connection handlers of a subclass that overrides `handle_error` for client errors (status
< 500): same status (400 in aiohttp 3.14), same closed connection, but the envelope
`{"error": {"code": "malformed_request", …}}` every other error of the daemon has, and a message
that never repeats what the client sent (a header line may carry a credential). The path may
not have been read, so the surface is unknown: the metis envelope serves both.

5xx answers stay aiohttp's: `metis_middleware` answers every exception a handler raises with
`internal_error`, so aiohttp's 500 means an exception outside the app's middleware, a bug that
aiohttp's own path logs with its traceback.
"""

from __future__ import annotations

from typing import ClassVar

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from metis.http.errors import WireError, error_response

MALFORMED_MESSAGE = (
    "the request could not be parsed as HTTP/1.1 and was refused before routing "
    "(this port speaks plain HTTP, not TLS)"
)

# What `add_security_headers` (metis/server/middleware.py) puts on every response: aiohttp runs
# the app's on_response_prepare only for a request that was routed, and this one was not.
SECURITY_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


class MalformedRequest(WireError):
    """The wire error of a request the HTTP parser refused (its own table: no route sends it)."""

    table: ClassVar[dict[str, int]] = {"malformed_request": 400}


class _EnvelopeRequestHandler(RequestHandler):
    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's path first: it logs (through the runner's filter, which drops the bytes),
        # refuses to answer once output has started, and closes the connection
        plain = super().handle_error(request, status, exc, message)
        if status >= 500:
            return plain
        error = MalformedRequest("malformed_request", MALFORMED_MESSAGE, headers=SECURITY_HEADERS)
        response = error_response(error)
        response.set_status(status)
        response.force_close()
        return response


class _EnvelopeServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _EnvelopeRequestHandler(self, loop=self._loop, **self._kwargs)


class EnvelopeAppRunner(web.AppRunner):
    """An `AppRunner` whose connections answer parser refusals with the JSON envelope."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The app builds its Server in aiohttp's own code (`Application._make_handler`), with
        # arguments of aiohttp's choosing; changing its class keeps every one of them and
        # changes only which connection handler it creates.
        server.__class__ = _EnvelopeServer
        return server
