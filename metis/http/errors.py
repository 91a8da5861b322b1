"""The wire-error base class and the JSON error response every surface sends.

Every non-2xx body is `{"error": {"code", "message", "details"}}`. Each surface subclasses
`WireError` with its own closed code → status table, and maps domain errors itself.
"""

from __future__ import annotations

from typing import Any, ClassVar

from aiohttp import web

from metis.http.jsontext import dumps


class WireError(Exception):
    """An error rendered on the wire: a code of `table` (a closed code → status map), a message,
    details and extra headers. Each surface subclasses it with its own closed table."""

    table: ClassVar[dict[str, int]]

    def __init__(
        self,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if code not in self.table:
            raise ValueError(f"{code!r} is not in the closed table of {type(self).__name__}")
        super().__init__(message)
        self.code = code
        self.status = self.table[code]
        self.message = message
        self.details = details or {}
        self.headers = headers or {}


def error_body(error: WireError) -> str:
    body = {"error": {"code": error.code, "message": error.message, "details": error.details}}
    return dumps(body)


def error_response(error: WireError) -> web.Response:
    return web.Response(
        status=error.status,
        text=error_body(error),
        content_type="application/json",
        charset="utf-8",
        headers=error.headers,
    )
