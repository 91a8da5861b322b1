"""One AAP turn response: subscribe, start the turn, render and relay it, end it.

Three parts, in the order a turn's events pass through them: the renderer (a turn's core
events → AAP stream events and stop reasons), the SSE writer (every write awaited, a client
gone noticed at once), and the relay that ties the two to the session hub.

The response subscribes to the session hub *before* the turn starts (so `turn.started` and
every delta are seen, in order), then starts it, then renders it in the requested mode. An AAP
turn lives only as long as its response: a client that goes away, or reads too slowly for the
bounded queue, gets its turn cancelled with `client_disconnect` — nobody is left to approve
a tool or read the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from metis.aap.http import AapState
from metis.aap.mapping import render_content, render_history
from metis.core.application import (
    Application,
    CloseMarker,
    History,
    HubClient,
    SharedEvent,
    TurnAccepted,
)
from metis.core.canonical.content import (
    CONTENT_LIST_ADAPTER,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    interrupted_form,
)
from metis.core.events.envelope import AnyEvent
from metis.http.jsontext import dumps

# ---------------------------------------------------------------------------------------------
# Core events of one turn → AAP stream events and stop reasons.
# ---------------------------------------------------------------------------------------------

Mode = Literal["delta", "message"]
TERMINAL = frozenset({"turn.completed", "turn.failed", "turn.cancelled"})
TOOL_OUTCOMES = frozenset({"tool.completed", "tool.failed", "tool.input_invalid"})
_COMPLETED_STOP = {
    "end_turn": "end_turn",
    "stop_sequence": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "refusal": "refusal",
}


def stop_reason_of(event_type: str, payload: dict[str, Any]) -> str:
    """The AAP stopReason of a turn's terminal event; anything unlisted is `error`."""
    if event_type == "turn.completed":
        return _COMPLETED_STOP.get(payload.get("stop_reason", ""), "error")
    if event_type == "turn.failed" and payload.get("error_class") == "context_overflow":
        return "max_tokens"
    return "error"


class Renderer:
    def __init__(
        self,
        history: History,
        mode: Mode,
        client_tool_names: frozenset[str],
        answered_application_ids: frozenset[str],
    ) -> None:
        self.history = history
        self.mode = mode
        self.client_tool_names = client_tool_names
        self.application_ids: set[str] = set(answered_application_ids)

    async def render(self, event: AnyEvent) -> list[tuple[str, dict[str, Any]]]:
        kind, payload = event.type, event.payload
        if kind == "text.delta":
            if self.mode == "delta" and payload["text"]:
                return [("text_delta", {"delta": payload["text"]})]
            return []
        if kind == "thinking.delta":
            if self.mode == "delta" and payload["text"]:
                return [("thinking_delta", {"delta": payload["text"]})]
            return []
        if kind == "message.complete":
            return self._complete(payload)
        if kind in TOOL_OUTCOMES:
            return await self._tool_result(payload)
        if kind in TERMINAL:
            return [("turn_stop", {"stopReason": stop_reason_of(kind, payload)})]
        return []

    def _complete(self, payload: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        blocks = CONTENT_LIST_ADAPTER.validate_python(payload["final_content"])
        interrupted = payload["stop_reason"] in ("cancelled", "error")
        if interrupted:
            blocks = interrupted_form(blocks)  # what is stored for an interrupted call
        out: list[tuple[str, dict[str, Any]]] = []
        for block in blocks:
            if isinstance(block, ToolUseBlock):
                if block.name in self.client_tool_names:
                    self.application_ids.add(block.id)
                out.append(
                    (
                        "tool_call",
                        {"toolCallId": block.id, "name": block.name, "input": block.input},
                    )
                )
            elif self.mode == "message" and isinstance(block, ThinkingBlock):
                out.append(("thinking", {"thinking": block.thinking}))
            elif self.mode == "message" and isinstance(block, TextBlock) and block.text:
                out.append(("text", {"text": block.text}))
        return out

    async def _tool_result(self, payload: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        tool_use_id = payload["tool_use_id"]
        if tool_use_id in self.application_ids:
            return []
        message = await self.history.message(payload["result_message_id"])
        block = message.content[0] if message is not None and message.content else None
        if not isinstance(block, ToolResultBlock):
            return []
        return [
            (
                "tool_result",
                {"toolCallId": tool_use_id, "content": render_content(block.content, None)},
            )
        ]


# ---------------------------------------------------------------------------------------------
# The SSE writer of the AAP stream modes.
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# One AAP turn response: subscribe, start the turn, relay it, end it.
# ---------------------------------------------------------------------------------------------

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often an idle response checks that its client is still there
RELEASE_WAIT_S = 30.0
_SSE_TYPES = (
    frozenset({"text.delta", "thinking.delta", "message.complete"}) | TOOL_OUTCOMES | TERMINAL
)


def cancel_turn(app: Application, session_id: str, turn_id: str | None) -> None:
    """Nobody reads the turn any more: a synchronous cancel request (safe from hub
    callbacks) with reason `client_disconnect`; repeats are no-ops."""
    app.turns.cancel_soon(session_id, turn_id, "client_disconnect")


class Subscription:
    """A bounded, lossless view of the session channel for one response."""

    def __init__(
        self, app: Application, session_id: str, limit: int, types: frozenset[str]
    ) -> None:
        self.app = app
        self.session_id = session_id
        self.turn_id: str | None = None
        self.overflowed = False
        self.client = HubClient(
            session_id,
            maxsize=limit,
            accept=lambda e: e.type in types,
            on_overflow=self._overflow,
            name="aap",
        )
        app.streams.attach(self.client)

    def _overflow(self) -> None:
        self.overflowed = True
        self.client.wake.set()
        cancel_turn(self.app, self.session_id, self.turn_id)

    async def next(self, timeout: float) -> AnyEvent | CloseMarker | None:
        if self.client.queue:
            item = self.client.queue.popleft()
            self.client.taken()
        elif self.overflowed:
            return None
        else:
            try:
                item = await asyncio.wait_for(self.client.get(), timeout)
            except TimeoutError:
                return None
        assert not isinstance(item, SharedEvent)  # an unshared client queues the events themselves
        return item

    def close(self) -> None:
        self.app.streams.detach(self.client)
        self.client.closed.set()

    async def settled(self) -> None:
        """After the terminal event: wait until the turn's events are flushed and its slot
        released, so whatever the client does next sees the turn's final state."""
        if self.turn_id is None:
            return
        if not await self.app.turns.settled(self.session_id, self.turn_id, RELEASE_WAIT_S):
            log.warning("turn %s did not release its slot in time", self.turn_id)


@dataclass(frozen=True)
class TurnPlan:
    """What a handler decided; `start` submits the turn to core (raises before any byte)."""

    session_id: str
    mode: str
    start: Callable[[], Awaitable[TurnAccepted]]
    renderer: Renderer
    answered_application_ids: frozenset[str]
    cors_headers: dict[str, str]
    session_start: str | None = None  # v1 PUT: emitted before turn_start / returned in JSON
    status_json: int = 200


async def respond(request: web.Request, state: AapState, plan: TurnPlan) -> web.StreamResponse:
    """Subscribe, start the turn (errors before this point are plain JSON errors), relay it."""
    app = state.app
    settings = state.settings
    types = TERMINAL if plan.mode == "none" else _SSE_TYPES
    sub = Subscription(app, plan.session_id, settings.stream_queue_limit, types)
    try:
        accepted = await plan.start()
    except BaseException:
        sub.close()
        raise
    sub.turn_id = accepted.turn_id
    try:
        if plan.mode == "none":
            return await _respond_json(request, state, plan, sub)
        return await _respond_sse(request, state, plan, sub)
    except asyncio.CancelledError:
        # The server dropped the handler (connection lost, shutdown): nobody reads the turn.
        cancel_turn(app, plan.session_id, accepted.turn_id)
        raise
    finally:
        sub.close()


async def _respond_json(
    request: web.Request, state: AapState, plan: TurnPlan, sub: Subscription
) -> web.StreamResponse:
    app, turn_id = state.app, sub.turn_id
    stop: str | None = None
    while stop is None:
        transport = request.transport
        if transport is None or transport.is_closing():
            cancel_turn(app, plan.session_id, turn_id)
            return web.Response(status=204)  # nobody reads it
        item = await sub.next(POLL_S)
        if item is None:
            continue
        if isinstance(item, CloseMarker):
            stop = "error"
        elif item.turn_id == turn_id and item.type in TERMINAL:
            stop = stop_reason_of(item.type, item.payload)
    await sub.settled()
    body: dict[str, Any] = {}
    if plan.session_start is not None:
        body["sessionId"] = plan.session_start
    body["stopReason"] = stop
    body["messages"] = await turn_messages(
        app, plan.session_id, turn_id, plan.answered_application_ids
    )
    return web.json_response(body, status=plan.status_json, headers=plan.cors_headers, dumps=dumps)


async def turn_messages(
    app: Application, session_id: str, turn_id: str | None, client_ids: frozenset[str]
) -> list[dict[str, Any]]:
    """What this turn appended, in storage order, minus the client's own inputs."""
    messages = await app.history.turn_messages(session_id, turn_id)
    kept = [
        m
        for m in messages
        if m.role != "user" and not (m.role == "tool" and m.metadata.tool_use_id in client_ids)
    ]
    return render_history(kept, {})


async def _respond_sse(
    request: web.Request, state: AapState, plan: TurnPlan, sub: Subscription
) -> web.StreamResponse:
    app, turn_id = state.app, sub.turn_id
    settings = state.settings
    writer = SseWriter(request, plan.cors_headers)
    stop: str | None = None
    gone = False
    try:
        await writer.start()
        if plan.session_start is not None:
            await writer.event("session_start", {"sessionId": plan.session_start})
        await writer.event("turn_start", {})
        last = time.monotonic()
        while stop is None:
            item = await sub.next(min(POLL_S, settings.sse_heartbeat_seconds))
            if item is None and sub.overflowed:
                break  # the turn is being cancelled; its events are gone
            if isinstance(item, CloseMarker):
                break
            if item is not None and item.turn_id == turn_id:
                for name, data in await plan.renderer.render(item):
                    if name == "turn_stop":
                        stop = data["stopReason"]
                    else:
                        await writer.event(name, data)
                        last = time.monotonic()
            if stop is not None:
                break
            # Checked after every event, not only when none came: most events write nothing
            # (message mode's deltas, other turns'), and a model writing a long message in
            # message mode would otherwise leave the wire silent and a departed client unseen.
            if writer.client_gone():
                raise ClientGone()
            if time.monotonic() - last >= settings.sse_heartbeat_seconds:
                await writer.comment("keepalive")
                last = time.monotonic()
    except ClientGone:
        gone = True
        cancel_turn(app, plan.session_id, turn_id)
    except Exception:
        log.exception("rendering turn %s failed; cancelling it", turn_id)
        cancel_turn(app, plan.session_id, turn_id)
    if not gone:
        await sub.settled()
        try:
            await writer.event("turn_stop", {"stopReason": stop or "error"})
        except ClientGone:
            cancel_turn(app, plan.session_id, turn_id)
        await writer.finish()
    return writer.response
