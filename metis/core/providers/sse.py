"""The streamed body of a provider call, decoded from raw `text/event-stream` bytes.

The SDKs' own stream objects build one pydantic model per server event (about 100 µs each on
a small machine — more than everything else a delta costs). The adapters therefore ask the SDK
for the raw HTTP response (request building, auth, status errors and transport stay the SDK's)
and decode the body here: one pass over each network chunk, handing the translator every
complete event of the chunk at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, NamedTuple


class ServerEvent(NamedTuple):
    """One dispatched event: its `event:` name (None when absent) and its joined `data:` lines,
    left as bytes so the JSON parser reads them without a decode step."""

    event: str | None
    data: bytes


class SseDecoder:
    """Incremental parser of the WHATWG event-stream format, fed arbitrary byte chunks.

    Lines may end in CRLF, LF or CR; a blank line dispatches the event; comment lines (`:`) and
    the `id`/`retry` fields are ignored (a provider stream never reconnects). A block with no
    `data:` line dispatches nothing, and a body that ends without the final blank line loses its
    last event, as the format specifies.
    """

    __slots__ = ("_after_cr", "_pending")

    def __init__(self) -> None:
        self._pending = b""
        self._after_cr = False  # the last chunk ended in CR: an LF opening the next one is its pair

    def feed(self, chunk: bytes) -> list[ServerEvent]:
        """The events completed by `chunk`; an unfinished event is kept for the next chunk, and a
        CRLF split across two chunks counts once."""
        if not chunk:
            return []
        if self._after_cr and chunk[0] == 0x0A:
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer = self._pending + chunk if self._pending else chunk
        blocks = buffer.split(b"\n\n")
        self._pending = blocks.pop()
        events: list[ServerEvent] = []
        append = events.append
        new = tuple.__new__  # the tuple made directly: `ServerEvent(...)` costs a Python call
        for block in blocks:
            # Inline fast path for the shape every provider sends: `event: NAME` then one
            # `data: JSON` line (this loop runs once per streamed delta).
            end = block.find(b"\n")
            if (
                end > 7
                and block.startswith(b"event: ")
                and block.startswith(b"data: ", end + 1)
                and block.find(b"\n", end + 1) < 0
            ):
                raw_name = block[7:end]
                name = _NAMES.get(raw_name)
                if name is None:
                    name = raw_name.decode("utf-8", "replace")
                append(new(ServerEvent, (name, block[end + 7 :])))
            else:
                event = _parse_block(block)
                if event is not None:
                    append(event)
        return events


# The event names of both wire formats, decoded once.
_NAMES = {
    name.encode(): name
    for name in (
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    )
}


def _parse_block(block: bytes) -> ServerEvent | None:
    """Any block the fast path in `feed` does not take, per the format's general rules."""
    if block.startswith(b"data: ") and b"\n" not in block:
        return ServerEvent(None, block[6:])
    name: str | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if not line or line[0] == 0x3A:  # empty, or a `:` comment
            continue
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value.decode("utf-8", "replace")
    if not data:
        return None
    return ServerEvent(name, b"\n".join(data))


class SseBody:
    """The `WireStream` of one call: batches of server events, then the response closed.

    Iterating yields one non-empty list per network chunk that completed at least one event,
    so the per-chunk costs of the transport are shared by every event the chunk carried.
    """

    __slots__ = ("_batches", "_decoder", "_response")

    def __init__(self, response: Any) -> None:
        self._response = response  # an httpx2.Response whose body has not been read yet
        self._decoder = SseDecoder()
        self._batches: AsyncGenerator[list[ServerEvent], None] | None = None

    def __aiter__(self) -> AsyncIterator[list[ServerEvent]]:
        if self._batches is None:
            self._batches = self._read()
        return self._batches

    async def _read(self) -> AsyncGenerator[list[ServerEvent], None]:
        feed = self._decoder.feed
        async with contextlib.aclosing(self._response.aiter_bytes()) as chunks:
            async for chunk in chunks:
                events = feed(chunk)
                if events:
                    yield events

    async def close(self) -> None:
        """Close the reading, then the response. A stream is left once its last event is in,
        before its body ends: its generators are closed here, not by the garbage collector,
        whose asyncio hook costs a wake-up of the loop and a task per generator."""
        if self._batches is not None:
            await self._batches.aclose()
        await self._response.aclose()
