"""Reading a request's JSON body: a size cap, the content type, RFC 8259-only JSON.

The checks are shared; the wire errors are not: each caller turns a `BodyRefused` reason into
its own surface's code (e.g. `payload_too_large` vs `request_too_large`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic_core import ErrorDetails

from metis.core.canonical.jsontext import parse_client_json

Reason = Literal["too_large", "unreadable", "too_slow", "not_utf8", "malformed", "not_object"]

# What a body read raises when the HTTP parser could not read the body (a chunk-size line that
# is not hex, a bad chunk terminator…): `RequestPayloadError` as aiohttp hands it to handlers,
# or the parser's own error when the reader was already waiting (aiohttp's pure-Python parser).
_UNREADABLE = (web.RequestPayloadError, HttpProcessingError)
UNREADABLE_MESSAGE = "the request body could not be parsed as HTTP/1.1 (bad chunked framing)"


CONTINUE_DUE = web.RequestKey("metis.continue_due", bool)
"""Set on a request whose client waits for `100 Continue` before sending its body
(`metis.http.routes.expect_continue`); cleared once the interim answer is sent."""

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


async def solicit_body(request: web.Request) -> None:
    """Send the interim `100 Continue` a waiting client needs before its body comes: only once
    the body is about to be read, so that a request refused first (no key, too large, a bad
    media type…) is answered before its client uploads anything."""
    if request.get(CONTINUE_DUE):
        request[CONTINUE_DUE] = False
        await request.writer.write(CONTINUE)
        request.writer.output_size = 0  # the interim answer is not part of the response's size


def close_if_unsolicited(request: web.Request, response: web.StreamResponse) -> None:
    """A response to a request whose body was never asked for closes the connection: whether
    its client sends that body next or gives it up is unknown, so no further request on the
    connection could be framed."""
    if request.get(CONTINUE_DUE):
        response.force_close()


class BodyRefused(Exception):
    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def is_json(request: web.Request) -> bool:
    """Whether the declared content type is `application/json` (parameters ignored)."""
    return request.content_type.lower() == "application/json"


def declared_too_large(request: web.Request, max_bytes: int) -> bool:
    return request.content_length is not None and request.content_length > max_bytes


@asynccontextmanager
async def _reading(timeout_s: float | None) -> AsyncIterator[None]:
    """A body read: what the parser could not read is refused `unreadable` (with a fixed message:
    the parser's own quotes the bytes it choked on), what is not whole within `timeout_s`
    `too_slow` (None: no timer, the body is already whole)."""
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except _UNREADABLE:
        raise BodyRefused("unreadable", UNREADABLE_MESSAGE) from None
    except TimeoutError:
        message = f"the request body did not arrive within {timeout_s:g} s"
        raise BodyRefused("too_slow", message) from None


async def read_whole(request: web.Request, timeout_s: float) -> bytes:
    """`request.read()` (capped by the app's `client_max_size`), refused `unreadable` or `too_slow`
    as `_reading` says, never passed on as an unexpected exception.

    A body that came whole with the headers (the usual small JSON body) has nothing to wait
    for: it is read without a timer (one scheduled and cancelled cost ~3 µs of every POST)."""
    await solicit_body(request)
    async with _reading(None if request.content.is_eof() else timeout_s):
        return await request.read()


async def read_capped(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
    """The body, read in chunks and refused as soon as it exceeds `max_bytes` (or `unreadable`
    or `too_slow`, as in `read_whole`)."""
    if declared_too_large(request, max_bytes):
        raise BodyRefused("too_large", f"body exceeds {max_bytes} bytes")
    await solicit_body(request)
    data = bytearray()
    async with _reading(timeout_s):
        while chunk := await request.content.read(65536):
            data += chunk
            if len(data) > max_bytes:
                raise BodyRefused("too_large", f"body exceeds {max_bytes} bytes")
    return bytes(data)


def decode_json(raw: bytes) -> Any:
    """A body's JSON value: UTF-8, RFC 8259 only (no NaN/Infinity, no number overflowing to
    infinity, no escaped lone surrogate)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyRefused("not_utf8", "body is not UTF-8") from None
    try:
        return parse_client_json(text)
    except ValueError as exc:
        raise BodyRefused("malformed", f"malformed JSON: {exc}") from None


def decode_json_object(raw: bytes) -> dict[str, Any]:
    value = decode_json(raw)
    if not isinstance(value, dict):
        raise BodyRefused("not_object", "body must be a JSON object")
    return value


def problem_said(error: ErrorDetails) -> str:
    """What one of pydantic's validation errors says to a client, without what only names our
    code: a nested object's model class ("…or instance of AgentConfig") and the `Value error, `
    put before a validator's own sentence (a Python exception's name, not the problem)."""
    if error["type"] == "model_type":
        return "Input should be an object"
    if error["type"] == "value_error":
        return error["msg"].removeprefix("Value error, ")
    return error["msg"]
