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

A parser error in a body whose head was already handed to a route (a bad chunk arriving after
the headers) is that request's: aiohttp's C parser queues it as a refusal of the *next* request
and leaves the body open, so the handler's read would wait until the client gave up. The
connection handler gives it to the body instead (the read raises `RequestPayloadError` at once,
which `read_body` answers 400 `malformed_request`), answers nothing more, and closes the
connection after that request's response: nothing after the break can be parsed.

An `Expect` other than `100-continue` is refused by the route's expect handler, before any
middleware: a route of a surface naming its wire error answers 417 `expectation_failed` in that
surface's envelope (metis/http/routes.py). aiohttp's own handler answers the others — a path no
route matches (404/405), a route whose table names no wire error — with a plain-text 417 quoting
the header; the server's request handler answers those the same way in the metis envelope, as
it does the parser's refusals.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, _ErrInfo

from metis.http.errors import error_response
from metis.http.routes import EXPECTATION_FAILED_MESSAGE
from metis.server.errors import ApiError
from metis.server.middleware import SECURITY_HEADERS
from metis.server.yielding import YieldingRequestHandler

MALFORMED_MESSAGE = (
    "the request could not be parsed as HTTP/1.1 and was refused before routing "
    "(this port speaks plain HTTP, not TLS)"
)


class _EnvelopeRequestHandler(YieldingRequestHandler):
    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        queued = len(self._messages)
        super().data_received(data)
        if len(self._messages) > queued:
            info = self._messages[-1][0]
            if isinstance(info, _ErrInfo) and self._refuse_body_in_flight(info.exc):
                self._messages.pop()  # the refusal is the body's, not a request of its own

    def _refuse_body_in_flight(self, exc: BaseException) -> bool:
        """Hand a parser error to the body the parser was reading, if one was open; whether
        there was one. Only the latest request's body can be open (the parser reads a
        connection's requests in order)."""
        if len(self._messages) > 1:
            body: StreamReader | None = self._messages[-2][1]
        else:
            current = self._current_request
            body = current.content if current is not None else None
        if body is None or body.is_eof():
            return False  # the error opened a new request: `handle_error` answers it
        if body.exception() is None:  # aiohttp's pure-Python parser has set its own already
            body.set_exception(web.RequestPayloadError("bad request body"), exc)
        # ended, so that nothing lingers over it once its request is answered
        body.feed_eof()
        self.close()  # after the response under way: the rest of the stream is unparseable
        code = exc.code if isinstance(exc, HttpProcessingError) else 400
        self.logger.warning(
            "refused an HTTP request body its parser could not read (%d, %s)",
            code,
            type(exc).__name__,
        )
        return True

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
        error = ApiError("malformed_request", MALFORMED_MESSAGE, headers=SECURITY_HEADERS)
        response = error_response(error)
        response.set_status(status)
        response.force_close()
        return response


Handle = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def _answering_unmet_expectations(handle: Handle) -> Handle:
    """`handle` (the app's), with the 417 aiohttp's default expect handler raises answered in
    the envelope. Only code before the middleware can raise it: the middlewares of both
    surfaces turn any exception into an error of their own."""

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await handle(request)
        except web.HTTPExpectationFailed:
            error = ApiError(
                "expectation_failed", EXPECTATION_FAILED_MESSAGE, headers=SECURITY_HEADERS
            )
            response = error_response(error)
            response.force_close()
            return response

    return handler


class _EnvelopeServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _EnvelopeRequestHandler(self, loop=self._loop, **self._kwargs)


class EnvelopeAppRunner(web.AppRunner):
    """An `AppRunner` whose connections answer parser refusals and aiohttp's own 417 with the
    JSON envelope (and yield the CPU after each response, metis/server/yielding.py)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The app builds its Server in aiohttp's own code (`Application._make_handler`), with
        # arguments of aiohttp's choosing; changing its class keeps every one of them and
        # changes only which connection handler it creates.
        server.__class__ = _EnvelopeServer
        server.request_handler = _answering_unmet_expectations(server.request_handler)
        return server
