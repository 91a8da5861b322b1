"""The SSE writer of the AAP stream modes.

One writer per response; every write is awaited in order, so `turn_stop` can never overtake an
earlier frame or get lost behind an unawaited write. Frames are `event: <name>` plus one compact
JSON `data:` line; comments (`: keepalive`) keep idle connections open. A write to a client that
went away raises `ClientGone`, which the caller turns into a `client_disconnect` cancel.
"""

from __future__ import annotations

import contextlib
from typing import Any

from aiohttp import web

from metis.http.jsontext import dumps


class ClientGone(Exception):
    """The client closed the connection; nothing more can be written."""


def frame(event: str, data: dict[str, Any]) -> bytes:
    payload = dumps(data)
    return f"event: {event}\ndata: {payload}\n\n".encode()


class SseWriter:
    def __init__(self, request: web.Request, headers: dict[str, str] | None = None) -> None:
        self.request = request
        self.response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                **(headers or {}),
            },
        )
        self.events_written = 0

    def client_gone(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()

    async def start(self) -> None:
        try:
            await self.response.prepare(self.request)
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone() from exc

    async def _write(self, data: bytes) -> None:
        if self.client_gone():
            raise ClientGone()
        try:
            await self.response.write(data)
        except (ConnectionError, RuntimeError) as exc:  # aiohttp: closing transport
            raise ClientGone() from exc

    async def event(self, name: str, data: dict[str, Any]) -> None:
        await self._write(frame(name, data))
        self.events_written += 1

    async def comment(self, text: str) -> None:
        await self._write(f": {text}\n\n".encode())

    async def finish(self) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.response.write_eof()
