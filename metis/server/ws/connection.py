"""One WebSocket connection: AWAIT_SUBSCRIBE → SEAM → LIVE → CLOSING.

Two tasks per socket. The reader parses client frames (subscribe, cancel, ping, pong) and never
sends anything itself. The writer is the only task that sends: it waits for the subscribe, runs
the hand-off, sends the preamble, then drains the hub queue, with control frames (pings, pongs)
jumping ahead of queued events. Closes come in two kinds: in-band (a marker at the end of the
queue, so everything before it is delivered) and out-of-band (queue discarded, writer
cancelled, close frame written at once) — a stalled client must learn it was dropped without
waiting behind the backlog that stalled it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections import deque
from typing import Any

from aiohttp import WSMsgType, web
from aiohttp.http import StreamWriter

from metis.core.application import Application, CloseMarker, HubClient, SharedEvent
from metis.core.errors import DomainError
from metis.core.events.envelope import AnyEvent
from metis.server.ws.framing import batches, text_frame, text_frames
from metis.server.ws.handoff import open_stream
from metis.server.ws.protocol import (
    CLOSE_MESSAGES,
    ProtocolViolation,
    Subscribe,
    SubscribeError,
    close_reason,
    dumps,
    event_frame,
    nonce_of,
    parse_frame,
    parse_subscribe,
)

log = logging.getLogger(__name__)

_connection_ids = itertools.count(1)

# One socket write carries the queued events up to this many bytes of payload (at least one
# event): large enough that a burst of deltas costs one system call, small enough that a
# control frame (a pong) never waits behind much.
WRITE_BATCH_BYTES = 64 * 1024


def _reject_all(_event: AnyEvent) -> bool:
    """The filter until subscribe: attached (so closes reach it) but receiving nothing."""
    return False


class Connection:
    def __init__(
        self,
        app: Application,
        ws: web.WebSocketResponse,
        session_id: str,
    ) -> None:
        self.app = app
        self.ws = ws
        self.settings = app.settings.websocket
        self.name = f"ws{next(_connection_ids)}"
        self.client = HubClient(
            session_id,
            maxsize=self.settings.queue_max_events,
            accept=_reject_all,
            on_overflow=self._on_overflow,
            name=self.name,
            shared=True,
            on_close_marker=self._on_close_marker,
        )
        self._control: deque[str] = deque()
        self._subscribe: Subscribe | None = None
        self._closing = False
        self._closer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._transport: asyncio.Transport | None = None
        self._flow: StreamWriter | None = None  # waits while the socket's buffer is full
        # heartbeat
        self._last_rx = 0.0
        self._pinged = False
        self._misses = 0

    @property
    def session_id(self) -> str:
        return self.client.session_id

    # -- lifecycle ----------------------------------------------------------------------------

    def attach(self) -> None:
        """Called right after the token is consumed, before the upgrade: a session end or a
        shutdown from now on reaches this socket even before it subscribes."""
        self.app.streams.attach(self.client)

    def detach(self) -> None:
        self.app.streams.detach(self.client)
        self.client.queue.clear()
        self.client.closed.set()

    async def run(self, request: web.Request) -> None:
        loop = asyncio.get_running_loop()
        self._transport = request.transport
        self._flow = StreamWriter(request.protocol, loop)
        self._reader = loop.create_task(self._read(), name=f"{self.name}:reader")
        self._writer = loop.create_task(self._write(), name=f"{self.name}:writer")
        self._timers["subscribe"] = loop.call_later(
            self.settings.subscribe_timeout_s, self._on_subscribe_timeout
        )
        try:
            done, _ = await asyncio.wait(
                {self._reader, self._writer}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                exc = None if task.cancelled() else task.exception()
                if exc is not None and not isinstance(exc, ConnectionError):
                    log.error("connection %s failed", self.name, exc_info=exc)
                    self.close_out_of_band(1011, "internal_error")
            if self._closer is not None:
                await self._closer
        finally:
            for task in (self._reader, self._writer):
                task.cancel()
            self._cancel_timers()
            self.detach()
            log.debug("connection %s of %s detached", self.name, self.session_id)

    # -- closing ------------------------------------------------------------------------------

    def _begin_close(self) -> bool:
        """Enter CLOSING once: detach and drop everything not yet sent."""
        if self._closing:
            return False
        self._closing = True
        self.app.streams.detach(self.client)
        self.client.queue.clear()
        self._control.clear()
        self._cancel_timers()
        return True

    def close_out_of_band(
        self, ws_code: int, code: str, message: str | None = None, *, first: str | None = None
    ) -> None:
        """Close now, not behind the backlog: cancel the writer and write `first` (a
        subscribe_error) and the close frame directly. Safe from any callback."""
        if not self._begin_close():
            return
        writer = self._writer
        if writer is not None and writer is not asyncio.current_task():
            writer.cancel()
        self._closer = asyncio.get_running_loop().create_task(
            self._send_close(ws_code, code, message, first), name=f"{self.name}:close"
        )

    async def _send_close(
        self, ws_code: int, code: str, message: str | None = None, first: str | None = None
    ) -> None:
        """The close handshake: `first`, the close frame, then the client's reply, all
        within the close timeout, else abort. The reader is stopped first: aiohttp's close()
        beside a pending receive() drops the connection without reading the reply, and the
        client then records 1006 instead of our code."""
        reason = close_reason(code, message or CLOSE_MESSAGES.get(code, code))
        try:
            async with asyncio.timeout(self.settings.close_timeout_s):
                reader = self._reader
                if reader is not None and not reader.done():
                    reader.cancel()
                    await asyncio.wait({reader})
                if first is not None:
                    await self.ws.send_str(first)
                self.client.closed.set()  # a session end waits for our last frame, not the reply
                await self.ws.close(code=ws_code, message=reason)
        except (TimeoutError, ConnectionError):
            self._abort()
        log.debug("connection %s closed %d %s", self.name, ws_code, code)
        transport = self._transport
        if transport is not None and transport.get_write_buffer_size() > 0:
            # A peer that stopped reading never takes the rest: give it the grace, then abort.
            asyncio.get_running_loop().call_later(self.settings.close_timeout_s, transport.abort)

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _on_overflow(self) -> None:
        """Hub callback (inside `bus.emit`): the hub already detached us and dropped the queue."""
        self.close_out_of_band(1008, "client_too_slow")

    def _on_close_marker(self, marker: CloseMarker) -> None:
        """An in-band close was queued: it must complete within the grace, else abort."""
        loop = asyncio.get_running_loop()
        if "abort" not in self._timers:
            self._timers["abort"] = loop.call_later(self.settings.close_timeout_s, self._abort)

    def _on_subscribe_timeout(self) -> None:
        if self._subscribe is None:
            self.close_out_of_band(1008, "subscribe_timeout")

    def _cancel_timers(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    # -- the writer ---------------------------------------------------------------------------

    async def _write(self) -> None:
        client = self.client
        while self._subscribe is None and not client.queue:
            client.wake.clear()
            await client.wake.wait()
        if self._subscribe is None:
            # Ended, purged or shut down before subscribing: only a close marker can be queued.
            item = client.queue.popleft()
            if isinstance(item, CloseMarker):
                self._close_in_band(item)
            return
        try:
            preamble = await open_stream(self.app, client, self._subscribe)
        except SubscribeError as exc:
            self.close_out_of_band(1008, exc.code, exc.message, first=dumps(exc.frame()))
            return
        for batch in batches(preamble.frames, WRITE_BATCH_BYTES):
            await self._send(text_frames(batch))
        self._start_heartbeat()
        await self._drain(preamble.last_sent_seq)

    async def _drain(self, last_sent_seq: int) -> None:
        """LIVE: control frames first, then queued events in hub order, every
        event queued at that moment (up to a batch) in one socket write."""
        client, control, ws = self.client, self._control, self.ws
        wake = client.wake
        while True:
            if control:
                await ws.send_str(control.popleft())
                continue
            queue = client.queue
            if not queue:
                wake.clear()
                await wake.wait()
                continue
            frames: list[bytes] = []
            size = 0
            while queue and size < WRITE_BATCH_BYTES:
                item = queue[0]
                if type(item) is not SharedEvent:
                    break  # the close marker: after what is taken so far
                queue.popleft()
                event = item.event
                if not event.transient and event.seq <= last_sent_seq:  # type: ignore[union-attr]
                    continue  # defensive (cannot fire): already replayed or in the snapshot
                data = item.data
                if data is None:  # the first socket to send it frames it for all of them
                    data = item.data = text_frame(event_frame(event))
                frames.append(data)
                size += len(data)
            client.taken()
            if frames:
                await self._send(b"".join(frames))
            elif queue:
                marker = queue.popleft()
                assert isinstance(marker, CloseMarker)  # a shared client queues nothing else
                self._close_in_band(marker)
                return

    async def _send(self, frames: bytes) -> None:
        """Whole frames in one socket write, then wait while the peer is not taking them (that
        wait is what lets the hub queue fill up behind a stalled client)."""
        transport = self._transport
        if self.ws.closed or transport is None or transport.is_closing():
            raise ConnectionResetError("the WebSocket is closing")
        transport.write(frames)
        assert self._flow is not None
        await self._flow.drain()

    def _close_in_band(self, marker: CloseMarker) -> None:
        """Everything before the marker is sent: hand the close to a task that `run` awaits,
        as out-of-band closes do, since `run` cancels this writer once the reader ends."""
        self._closing = True
        self.app.streams.detach(self.client)
        self._closer = asyncio.get_running_loop().create_task(
            self._send_close(marker.ws_code, marker.code), name=f"{self.name}:close"
        )

    def _send_control(self, frame: dict[str, Any]) -> None:
        if self._closing:
            return
        if len(self._control) >= self.settings.queue_max_events:
            # A client that keeps pinging but never reads would grow this queue without
            # bound (control frames are outside the event queue's bound): same remedy.
            self.close_out_of_band(1008, "client_too_slow")
            return
        self._control.append(dumps(frame))
        self.client.wake.set()

    # -- heartbeat ----------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        self._last_rx = loop.time()
        self._schedule_ping(self._last_rx + self.settings.ping_interval_s)

    def _schedule_ping(self, when: float) -> None:
        if not self._closing:
            self._timers["ping"] = asyncio.get_running_loop().call_at(when, self._on_ping_due)

    def _on_ping_due(self) -> None:
        if self._closing:
            return
        now = asyncio.get_running_loop().time()
        interval = self.settings.ping_interval_s
        if now - self._last_rx < interval * 0.999:
            self._schedule_ping(self._last_rx + interval)  # a frame arrived: silence restarts
            return
        if self._pinged:
            self._misses += 1
            if self._misses >= self.settings.ping_missed_max:
                self.close_out_of_band(1008, "heartbeat_timeout")
                return
        self._send_control({"type": "ping", "nonce": secrets.token_hex(8)})
        self._pinged = True
        self._schedule_ping(now + interval)

    def _touch(self) -> None:
        self._last_rx = asyncio.get_running_loop().time()
        self._pinged = False
        self._misses = 0

    # -- the reader ---------------------------------------------------------------------------

    async def _read(self) -> None:
        while True:
            msg = await self.ws.receive()
            if msg.type is WSMsgType.TEXT:
                self._touch()
                if not await self._on_text(msg.data):
                    return
            elif msg.type is WSMsgType.BINARY:
                self.close_out_of_band(1003, "unsupported_data")
                return
            else:  # CLOSE, CLOSING, CLOSED, ERROR: the client left, or aiohttp refused a frame
                if msg.type is WSMsgType.CLOSE:
                    log.debug("connection %s closed by the client (%s)", self.name, msg.data)
                return

    async def _on_text(self, data: str) -> bool:
        """Handle one client frame; False once the connection is closing."""
        try:
            frame = parse_frame(data)
        except ProtocolViolation as exc:
            self.close_out_of_band(1008, "protocol_error", str(exc))
            return False
        if self._subscribe is None:
            try:
                self._subscribe = parse_subscribe(frame)
            except SubscribeError as exc:
                self.close_out_of_band(1008, exc.code, exc.message, first=dumps(exc.frame()))
                return False
            self.client.wake.set()  # the writer runs the hand-off
            return True
        kind = frame["type"]
        if kind == "subscribe":
            self.close_out_of_band(1008, "protocol_error", "subscribe may be sent only once")
            return False
        if kind == "cancel":
            await self._cancel(frame)
        elif kind == "ping":
            self._send_control({"type": "pong", "nonce": nonce_of(frame)})
        elif kind != "pong":
            log.debug("connection %s ignored an unknown frame type %r", self.name, kind)
        return True

    async def _cancel(self, frame: dict[str, Any]) -> None:
        """The REST cancel's core call; any reason becomes `user_cancel`, failures are ignored
        (there is no reply channel; the outcome is the turn's events)."""
        turn_id = frame.get("turn_id")
        if not isinstance(turn_id, str):
            log.debug("connection %s: cancel without a turn_id ignored", self.name)
            return
        try:
            await self.app.turns.cancel(self.session_id, turn_id, "user_cancel")
        except DomainError as exc:
            log.debug("connection %s: cancel of %s ignored (%s)", self.name, turn_id, exc.message)
