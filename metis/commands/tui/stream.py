"""The shown session's live stream: the WebSocket the transcript is drawn from.

The daemon may restart mid-turn, drop the socket, or no longer replay all that was missed; the
chat should carry on through each without the user doing anything, and say meanwhile that it is
disconnected. This class owns the socket, the cursor (the last event seen) and the task that
reads frames; it re-attaches from the cursor with a growing backoff (a send cuts it short), and
when the gap cannot be replayed shows the session afresh. What a frame means for the transcript
is `TranscriptRenderer`'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, Protocol

import aiohttp
from textual import Logger
from textual.containers import VerticalScroll

from metis.commands.client import (
    CALL_FAILURES,
    REATTACH_FIRST_S,
    REATTACH_MAX_S,
    SESSION_GONE_CODES,
    ApiFailure,
    DaemonApi,
    closed_because,
    reason_code,
    subscribe_answer,
)
from metis.commands.tui.confirmations import ConfirmationQueue
from metis.commands.tui.transcript import TranscriptRenderer
from metis.commands.tui.turn import RunningTurn
from metis.commands.tui.widgets import StatusBar

READ_SLICE_S = 0.004  # at most this long handling frames before the app's other work runs
CLOSE_WAIT_S = 1.0  # a daemon that does not answer the close must not hold the app up


class StreamHost(Protocol):
    """What of the app attaching, reading and recovering the stream uses."""

    api: DaemonApi
    session_id: str | None
    session: dict[str, Any]
    ended: bool
    renderer: TranscriptRenderer
    turn: RunningTurn
    confirmations: ConfirmationQueue

    @property
    def transcript(self) -> VerticalScroll: ...

    @property
    def status(self) -> StatusBar: ...

    @property
    def log(self) -> Logger: ...

    async def note(self, text: str, *, error: bool = False) -> object: ...

    async def refresh_status(self, *, fetch: bool = True) -> None: ...


class SessionStream:
    """One subscription at a time, to the session the app shows. It takes every event
    (`preset:full`), as the dashboard does: the transcript draws the chat events and says when
    the project instructions change (`session.instructions_loaded`, which `preset:chat` leaves
    out); the others pass by."""

    def __init__(self, host: StreamHost) -> None:
        self.host = host
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.reader: asyncio.Task[None] | None = None
        self.connected = False  # the session's stream is attached; sends wait for it
        self._retry_now = asyncio.Event()  # cuts a re-attach backoff short (a send is waiting)
        self.last_event_id: str | None = None

    async def attach(
        self, session_id: str, *, since: str | None
    ) -> tuple[aiohttp.ClientWebSocketResponse, dict[str, Any], dict[str, Any]]:
        """Token, socket, subscribe to a session: with a snapshot (`since` None) or the events
        after `since`. Returns the socket, the snapshot frame (or the ack) and the session as
        REST showed it; changes nothing of the app's."""
        session = await self.host.api.call("GET", f"/sessions/{session_id}")
        if not session.get("ws_url"):
            raise ApiFailure(
                409,
                {
                    "error": {
                        "code": "session_already_ended",
                        "message": f"session {session_id} has ended; it cannot be continued "
                        f"(`metis sessions export {session_id}` shows it)",
                    }
                },
            )
        ws = await self.host.api.ws_connect(session["ws_url"])
        subscribe: dict[str, Any] = {"type": "subscribe", "filter": "preset:full"}
        if since is None:
            subscribe["snapshot"] = True
        else:
            subscribe["since"] = since
        try:
            await ws.send_json(subscribe)
            ack = await subscribe_answer(ws)
            if ack.get("type") != "subscribe_ack":
                raise ApiFailure(409, {"error": ack})
            frame = await subscribe_answer(ws) if ack["snapshot"] else ack
        except BaseException:
            await ws.close()
            raise
        return ws, frame, session

    async def replace(self, ws: aiohttp.ClientWebSocketResponse, cursor: str) -> None:
        """Read from `ws` (attached by `attach`) instead: the old socket and its reader stop.
        `start_reading` starts reading it, once the session is shown."""
        await self.close()
        self.ws = ws
        self._set_connected(True)  # also ends a "disconnected" left by the session before
        self.last_event_id = cursor

    def start_reading(self) -> None:
        self.reader = asyncio.create_task(self._read())

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader
            self.reader = None
        ws, self.ws = self.ws, None
        if ws is not None:
            with contextlib.suppress(Exception):  # a timeout too: the socket is dropped anyway
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await ws.close()

    def retry_now(self) -> None:
        """Re-attach without waiting out the backoff: a send is waiting for the stream."""
        self._retry_now.set()

    async def _subscribe(self, *, snapshot: bool) -> dict[str, Any]:
        """Attach this session's stream again: a snapshot (whose event id becomes the cursor)
        or the events after the cursor. Returns the snapshot frame (or the ack)."""
        host = self.host
        assert host.session_id is not None
        since = None if snapshot else self.last_event_id
        ws, frame, session = await self.attach(host.session_id, since=since)
        self.ws = ws
        self._set_connected(True)  # now, not after a reload's redraw: a send may come first
        host.session = session
        if "snapshot_at_event_id" in frame:
            self.last_event_id = frame["snapshot_at_event_id"]
        return frame

    async def _read(self) -> None:
        """Handle frames until the session ends; re-attach after an abnormal close, for as long
        as that takes (the status bar says the app is disconnected meanwhile)."""
        host = self.host
        while True:
            ws = self.ws
            assert ws is not None
            reason = ""
            slice_started = time.perf_counter()
            while True:
                msg = await ws.receive()
                if msg.type == aiohttp.WSMsgType.TEXT:
                    try:
                        await self._handle(json.loads(msg.data))
                    except Exception as exc:  # one bad frame must not stop the stream
                        host.log.error(f"frame failed: {exc!r}")
                    if time.perf_counter() - slice_started > READ_SLICE_S:
                        # frames already buffered are read without waiting: let keys and
                        # screen updates in between
                        await asyncio.sleep(0)
                        slice_started = time.perf_counter()
                    continue
                if msg.type == aiohttp.WSMsgType.CLOSE:
                    reason = reason_code(msg.extra) or ""
                break
            if host.ended or reason in ("session_ended", "session_purged"):
                await self._session_over()
                return
            self._set_connected(False)
            await host.note(f"{closed_because(reason)}: re-attaching…")
            if not await self._reattach():
                await self._session_over()
                return
            await host.note("re-attached to the session")
            if host.turn.id is not None and not host.session.get("current_turn_id"):
                # e.g. the daemon restarted: the turn is over, whether or not its end was stored
                host.turn.mark_over()
                host.renderer.interrupt_open_calls()  # a replayed end of a call says otherwise
                await host.note("the turn is no longer running")
            for request in host.session.get("pending_confirmations") or []:
                host.confirmations.add(request)
            await host.renderer.fill_missing_results()  # those the stop kept from being read
            await host.refresh_status(fetch=False)

    async def _handle(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "ping" and self.ws is not None:
            await self.ws.send_json({"type": "pong", "nonce": frame.get("nonce")})
            return
        if kind != "event":
            return
        event = frame["event"]
        if "id" in event:
            self.last_event_id = event["id"]
        await self.host.renderer.render(event)

    def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        self.host.status.show(connection="" if connected else "disconnected: re-attaching…")

    async def _reattach(self) -> bool:
        """Subscribe again from the cursor, waiting longer between tries each time (until a
        send cuts the wait short); False when the session is gone."""
        delay = REATTACH_FIRST_S
        while True:
            self._retry_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry_now.wait(), delay)
            delay = min(2 * delay, REATTACH_MAX_S)
            try:
                await self._subscribe(snapshot=False)
                return True
            except ApiFailure as exc:
                if exc.code in ("cursor_expired", "replay_too_large"):
                    with contextlib.suppress(*CALL_FAILURES):
                        await self._reload_in_place()
                        return True
                if exc.code in SESSION_GONE_CODES:
                    return False
            except (aiohttp.ClientError, TimeoutError):
                pass

    async def _reload_in_place(self) -> None:
        """After missing more than the daemon replays: show the session afresh."""
        host = self.host
        if self.ws is not None:
            await self.ws.close()
            self.ws = None
        await host.transcript.remove_children()
        snapshot = await self._subscribe(snapshot=True)
        host.session = snapshot["session"]
        host.renderer.clear()
        await host.renderer.show_history()
        await host.note("missed more of the stream than the daemon replays: reloaded the session")
        current = host.session.get("current_turn_id")
        if current and current != host.turn.id:
            started = host.renderer.started_at.get(current)
            host.turn.mark_running(current, host.session.get("active_model"), started)
        elif not current and host.turn.id:
            host.turn.mark_over()
        for request in host.session.get("pending_confirmations") or []:
            host.confirmations.add(request)
        await host.refresh_status()

    async def _session_over(self) -> None:
        self.host.ended = True
        # not re-attaching: there is nothing to attach to, and the bar says so until another
        # session is shown (it read on as if this one were live)
        self.host.status.show(connection="session ended")
        self.host.turn.mark_over()
        await self.host.note("the session ended; /new starts another, /sessions picks one")
