"""`metis chat [WORKSPACE]`: a terminal client of the running daemon.

It uses only the public surfaces, like any other client: REST to create the session, send turns,
answer confirmations and switch models; the session's WebSocket (`preset:chat`) to show the turn
live — token deltas as they arrive, tool calls as they happen. Ctrl-C during a turn sends a
`cancel` frame; Ctrl-C at the prompt (or end of input, or `/quit`) leaves. A dropped socket is
re-attached with `since` = the last event seen; when the daemon cannot replay from there
(`cursor_expired`, `replay_too_large`) the client subscribes with a snapshot instead and shows
what it says about the turn being waited on (docs/api.md, WebSocket, Subscribe).

Every line is labelled (`you>`, `assistant>`, `tool>`, `confirm>`, `turn>`, …) so a transcript
reads unambiguously whether or not the terminal has colours.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from metis.commands.client import (
    REATTACH_FIRST_S,
    REATTACH_MAX_S,
    SESSION_GONE_CODES,
    ApiFailure,
    DaemonApi,
    NotADaemon,
    closed_because,
    failure_text,
    reason_code,
    subscribe_answer,
    turn_outcome,
)
from metis.commands.daemon_client import (
    add_arguments,
    session_id,
    target_from_args,
    unreachable,
)
from metis.commands.failures import error_text
from metis.commands.run import CUT_OFF, DROPPED, UNRUN, retry_note
from metis.core.errors import ConfigError
from metis.core.tools.textutil import visible_controls
from metis.wire import tooldisplay
from metis.wire.counts import counted, turn_totals
from metis.wire.instructions import instructions_note

TERMINAL_TYPES = ("turn.completed", "turn.cancelled", "turn.failed")
# How long the line client keeps re-attaching (see REATTACH_FIRST_S): long enough for a daemon
# restart, short enough for a script reading a pipe.
_RECONNECT_FOR_S = 60.0
# Subscribe errors whose recovery is a snapshot instead of a replay.
_SNAPSHOT_RECOVERY = ("cursor_expired", "replay_too_large")
_REFUSED_CALLS = ("user_denied", "policy_denied", "confirmation_timeout")
"""`tool.failed` classes of a call that never ran: denied, or not answered in time."""
_ANSWERS = {
    "y": ("allow", "once"),
    "yes": ("allow", "once"),
    "a": ("allow", "session"),
    "always": ("allow", "session"),
    "n": ("deny", "once"),
    "no": ("deny", "once"),
}
_HELP = (
    "type a message to start a turn; commands:\n"
    "  /model <ref>   set the session's model (queued behind a running turn)\n"
    "  /model -       clear it (routing decides again)\n"
    "  /model         show the active model\n"
    "  /quit          leave (the session stays open once a turn was sent)\n"
    "Ctrl-C cancels the running turn; at the prompt it leaves."
)


# -- rendering ---------------------------------------------------------------------------------


class Renderer:
    """Labelled terminal output of one session's events (unknown types are skipped)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._open: str | None = None  # the label of the line being streamed, if any
        self.own_model_changes = 0  # PATCHes of this client whose event is still to come
        # confirmation requests this client answered: their `you>` line said it already
        self.own_answers: set[str] = set()
        # the turn's reply stopped at the output limit: its calls are answered, never run
        self._cut_off = False
        self._running: dict[str, str] = {}  # tool_use_id → tool name: `tool.completed` has none
        self._calls: dict[str, str] = {}  # tool_use_id → tool name, of calls whose end is to come

    def _write(self, text: str) -> None:
        self.out.write(visible_controls(text))  # model text must not drive the terminal
        self.out.flush()

    def line(self, label: str, text: str) -> None:
        self.end_stream()
        self._write(f"{label}> {text}\n")

    def stream(self, label: str, text: str) -> None:
        """Append to the labelled line being streamed; continuation lines are indented."""
        if self._open != label:
            self.end_stream()
            self._write(f"{label}> ")
            self._open = label
        self._write(text.replace("\n", "\n" + " " * (len(label) + 2)))

    def prompt(self) -> None:
        self.end_stream()
        self._write("you> ")
        self._open = "prompt"

    def prompted(self) -> None:
        """The user pressed Enter: the terminal's echo already ended the line."""
        if self._open == "prompt":
            self._open = None

    def end_stream(self) -> None:
        if self._open is not None:
            self._write("\n")
            self._open = None

    def event(self, event: dict[str, Any]) -> None:
        handler = getattr(self, "_on_" + event.get("type", "").replace(".", "_"), None)
        if handler is not None:
            handler(event.get("payload") or {})

    # streaming frames
    def _on_text_delta(self, p: dict[str, Any]) -> None:
        self.stream("assistant", p.get("text", ""))

    def _on_thinking_delta(self, p: dict[str, Any]) -> None:
        self.stream("thinking", p.get("text", ""))

    def _on_tool_use_start(self, p: dict[str, Any]) -> None:
        self._calls[str(p.get("tool_use_id"))] = str(p.get("tool_name"))
        self._open_call(str(p.get("tool_name")))

    def _open_call(self, name: str) -> None:
        self.end_stream()
        self._write(f"tool> {name} ")
        self._open = "tool-input"

    def _on_tool_use_end(self, p: dict[str, Any]) -> None:
        name = self._calls.pop(str(p.get("tool_use_id")), None)
        if self._open != "tool-input" and name is not None:
            # a call whose JSON did not parse ends with the message, after what followed it
            self._open_call(name)
        if p.get("dropped"):
            self._write(DROPPED)
        else:
            text = json.dumps(p.get("final_input"), ensure_ascii=False)
            self._write(text if len(text) <= 200 else text[:199] + "…")
        self.end_stream()

    def _on_message_complete(self, p: dict[str, Any]) -> None:
        self.end_stream()
        if p.get("stop_reason") in ("cancelled", "error"):
            self.line("metis", f"the reply was cut short ({p['stop_reason']})")
        elif p.get("stop_reason") == "max_tokens":
            self.line("metis", f"the reply was {CUT_OFF}")
            self._cut_off = True

    # bus events
    def _on_route_decided(self, p: dict[str, Any]) -> None:
        if p.get("chosen_model"):
            self.line("route", str(p["chosen_model"]))

    # the events' codes (`error_class`) are for scripts; a line says what happened in words
    def _on_llm_call_failed(self, p: dict[str, Any]) -> None:
        said = p.get("message") or p.get("error_class")
        if p.get("will_retry"):
            self.line("llm", retry_note(p))
        elif p.get("error_class") != "cancelled":
            self.line("llm", f"call failed: {said}")

    def _on_tool_called(self, p: dict[str, Any]) -> None:
        self._running[str(p.get("tool_use_id"))] = str(p.get("tool_name"))
        self.line("tool", f"running {p.get('tool_name')}")

    def _on_tool_completed(self, p: dict[str, Any]) -> None:
        # a call whose start this client missed (a re-attach) is still said, unnamed
        name = self._running.pop(str(p.get("tool_use_id")), None)
        outcome = "returned an error" if p.get("is_error") else "done"
        self.line(
            "tool",
            f"{name + ' ' if name else ''}{outcome} "
            f"({p.get('duration_ms')} ms, {p.get('output_bytes')} bytes)",
        )

    def _on_tool_failed(self, p: dict[str, Any]) -> None:
        self._running.pop(str(p.get("tool_use_id")), None)
        if self._cut_off and p.get("error_class") == "cancelled":
            self.line("tool", f"{p.get('tool_name')} {UNRUN}")
            return
        # a call someone or the policy refused never ran: it did not fail
        outcome = "not run" if p.get("error_class") in _REFUSED_CALLS else "failed"
        said = p.get("message") or p.get("error_class")
        self.line("tool", f"{p.get('tool_name')} {outcome}: {said}")

    def _on_tool_input_invalid(self, p: dict[str, Any]) -> None:
        errors = "; ".join(e.get("message", "") for e in p.get("errors", [])[:3])
        self.line("tool", f"{p.get('tool_name')} input invalid: {errors}")

    def _on_tool_confirmation_requested(self, p: dict[str, Any]) -> None:
        detail = p.get("command_summary") or p.get("input_summary")
        self.line("confirm", f"{p.get('tool_name')} ({p.get('side_effects')}) wants: {detail}")

    def _on_tool_confirmation_resolved(self, p: dict[str, Any]) -> None:
        if p.get("confirmation_request_id") in self.own_answers:
            self.own_answers.discard(p["confirmation_request_id"])
            return
        scope = " for this session" if p.get("scope") == "session" else ""
        reason = f": {p['reason']}" if p.get("reason") else ""
        self.line("confirm", f"{p.get('decision')}{scope}{reason}")

    def _on_session_model_changed(self, p: dict[str, Any]) -> None:
        if self.own_model_changes:  # already shown from the PATCH answer
            self.own_model_changes -= 1
            return
        model = p.get("active_model") or "routing decides"
        when = " after the running turn" if p.get("queued") else ""
        self.line("model", f"{model}{when} (changed by another client)")

    def _on_session_ended(self, p: dict[str, Any]) -> None:
        self.line("metis", "the session ended")

    def _on_turn_completed(self, p: dict[str, Any]) -> None:
        self._cut_off = False
        seconds = (p.get("wall_time_ms") or 0) / 1000
        self.line("turn", f"completed in {seconds:.1f} s · {turn_totals(p)}")

    def _on_turn_cancelled(self, p: dict[str, Any]) -> None:
        self._cut_off = False
        self.line("turn", turn_outcome("turn.cancelled", p))

    def _on_turn_failed(self, p: dict[str, Any]) -> None:
        self._cut_off = False
        self.line("turn", turn_outcome("turn.failed", p))


# -- the session ---------------------------------------------------------------------------------


class ChatSession:
    """One interactive chat over one daemon session; input arrives as lines on a queue."""

    def __init__(
        self,
        url: str,
        workspace: str | None,
        lines: asyncio.Queue[str | None],
        out: TextIO,
        *,
        session_id: str | None = None,
        model: str | None = None,
        prompt: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = dict(headers or {})  # the daemon key: sent, never shown
        self.workspace = workspace
        self.lines = lines
        self.render = Renderer(out)
        self.session_id = session_id
        self.model = model
        self.prompt = prompt
        self.api: DaemonApi | None = None  # open while `run` is
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.turn_id: str | None = None
        self._finished: set[str] = set()
        self._asked: list[tuple[str, dict[str, Any]]] = []
        self._requests_seen: set[str] = set()  # confirmation_request_ids already queued
        self._complete_messages: set[str] = set()  # ids of messages shown to their end
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Future[Any]] = set()
        self._last_event_id: str | None = None
        self._cancel_sent = False
        self._ended = asyncio.Event()
        # The stream is attached: a turn is sent only then, or its reply would stream while no
        # socket reads it (a re-attach replays bus events, not the reply's text).
        self._attached = asyncio.Event()
        self._created = False  # this chat created the session (not `--session`)
        # the project instruction file the session's turns use (`GET /sessions/{id}`)
        self.instructions: dict[str, Any] | None = None
        self._turns_started = 0

    # REST ------------------------------------------------------------------------------------

    async def call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        assert self.api is not None
        return await self.api.call(method, path, body, params)

    # the socket -------------------------------------------------------------------------------

    async def attach(self, *, snapshot: bool = False) -> dict[str, Any] | None:
        """Fresh token, socket, subscribe. The first attach (or one asked to) takes a snapshot,
        whose event id becomes the resume cursor; a re-attach asks for what it missed with
        `since`. Returns the snapshot frame, if one was taken."""
        assert self.api is not None
        session = await self.call("GET", f"/sessions/{self.session_id}")
        if not session.get("ws_url"):
            ended = (
                f"session {self.session_id} has ended; it cannot be continued "
                f"(`metis sessions export {self.session_id}` shows it)"
            )
            raise ApiFailure(409, {"error": {"code": "session_already_ended", "message": ended}})
        self.instructions = session.get("instructions")
        ws = self.ws = await self.api.ws_connect(session["ws_url"])
        subscribe: dict[str, Any] = {"type": "subscribe", "filter": "preset:chat"}
        if self._last_event_id is None or snapshot:
            subscribe["snapshot"] = True
        else:
            subscribe["since"] = self._last_event_id
        try:
            await ws.send_json(subscribe)
            ack = await subscribe_answer(ws)
            if ack.get("type") != "subscribe_ack":
                raise ApiFailure(409, {"error": ack})
            if not ack["snapshot"]:
                count = ack["replay_event_count"]
                self.render.line("metis", f"re-attached; {counted(count, 'missed event')} follow")
                return None
            frame = await subscribe_answer(ws)
        except BaseException:
            await ws.close()
            raise
        self._last_event_id = frame["snapshot_at_event_id"]
        return frame

    async def reattach(self) -> None:
        """After a dropped stream: replay what was missed; if the daemon cannot (the cursor
        expired, or more was missed than it replays), take a snapshot and catch up from it."""
        try:
            await self.attach()
            return
        except ApiFailure as exc:
            if exc.code not in _SNAPSHOT_RECOVERY:
                raise
            self.render.line(
                "metis", f"cannot replay what was missed ({exc.code}); catching up from a snapshot"
            )
            missed_after = self._last_event_id if exc.code == "replay_too_large" else None
        snapshot = await self.attach(snapshot=True)
        assert snapshot is not None
        await self._catch_up(snapshot, missed_after)

    async def _catch_up(self, snapshot: dict[str, Any], missed_after: str | None) -> None:
        """Show what the snapshot says about the turn being waited on, whose events will not
        all arrive: its replies not seen whole; then, if it runs on, it is followed live (its
        pending confirmations are asked), else its outcome is read over REST from
        `missed_after`."""
        turn_id = self.turn_id
        if turn_id is None or turn_id in self._finished:
            return
        for message in snapshot["messages"]:
            if message.get("turn_id") == turn_id and message.get("role") == "assistant":
                self._show_missed(message)
        session = snapshot["session"]
        if session.get("current_turn_id") == turn_id:
            self.render.line("metis", "the turn is still running")
            for request in session.get("pending_confirmations") or []:
                if request.get("turn_id") == turn_id:
                    self._ask(turn_id, request)
            self._changed.set()
            return
        outcome = await self._terminal_event(turn_id, missed_after)
        if outcome is not None:
            self.render.event(outcome)
        else:
            self.render.line("turn", "ended while the stream was away")
        self._finished.add(turn_id)
        self._changed.set()

    def _show_missed(self, message: dict[str, Any]) -> None:
        """A stored assistant message whose stream this client did not see to its end."""
        if message["id"] in self._complete_messages:
            return
        self._complete_messages.add(message["id"])
        text = "\n".join(b["text"] for b in message.get("content", []) if b.get("type") == "text")
        if text:
            self.render.stream("assistant", text)
            self.render.end_stream()

    async def _terminal_event(self, turn_id: str, after: str | None) -> dict[str, Any] | None:
        """The turn's `turn.*` outcome from `GET …/events`, paged from `after` (else from the
        oldest retained event); None if it cannot be read."""
        query: dict[str, Any] = {"event_types": ",".join(TERMINAL_TYPES), "limit": 1000}
        if after is not None:
            query["since"] = after
        while True:
            try:
                page = await self.call("GET", f"/sessions/{self.session_id}/events", params=query)
            except ApiFailure:
                return None
            found = next((e for e in page["events"] if e.get("turn_id") == turn_id), None)
            if found is not None or page.get("next_cursor") is None:
                return found
            query["cursor"] = page["next_cursor"]

    async def consume(self) -> None:
        """Render every frame; re-attach after an abnormal close; stop when the session ends."""
        while True:
            assert self.ws is not None
            reason = await self._read_until_close(self.ws)
            if self._ended.is_set() or reason in ("session_ended", "session_purged"):
                self._finish_session()
                return
            self.render.line("metis", f"{closed_because(reason)}; re-attaching")
            self._attached.clear()
            if not await self._reattach_with_retries():
                self._finish_session()
                return
            self._attached.set()

    async def _reattach_with_retries(self) -> bool:
        """Attempts further apart each time, for up to `_RECONNECT_FOR_S`; False when the chat
        cannot go on. A failure is shown when its reason changes, not at every attempt."""
        delay, shown = REATTACH_FIRST_S, ""
        deadline = time.monotonic() + _RECONNECT_FOR_S
        while True:
            await asyncio.sleep(delay)
            try:
                await self.reattach()
                return True
            except (ApiFailure, aiohttp.ClientError, TimeoutError) as exc:
                reason = (
                    failure_text(exc, self.url)
                    if isinstance(exc, TimeoutError)
                    else error_text(exc)
                )
                if reason != shown:
                    self.render.line("error", f"re-attach failed: {reason}")
                    shown = reason
                if isinstance(exc, ApiFailure) and exc.code in SESSION_GONE_CODES:
                    return False
            if time.monotonic() >= deadline:
                self.render.line(
                    "error",
                    f"lost the connection to the daemon (retried for {_RECONNECT_FOR_S:g} s)",
                )
                return False
            delay = min(2 * delay, REATTACH_MAX_S)

    async def _read_until_close(self, ws: aiohttp.ClientWebSocketResponse) -> str:
        """Handle frames until the socket closes; returns the close reason's code (empty when
        the connection was lost without one)."""
        while True:
            msg = await ws.receive()
            if msg.type == aiohttp.WSMsgType.TEXT:
                self._on_frame(json.loads(msg.data))
            elif msg.type == aiohttp.WSMsgType.CLOSE:
                return reason_code(msg.extra) or ""
            elif msg.type in (
                aiohttp.WSMsgType.CLOSING,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.ERROR,
            ):
                return ""

    def _on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "ping" and self.ws is not None:
            self._spawn(self.ws.send_json({"type": "pong", "nonce": frame.get("nonce")}))
            return
        if kind != "event":
            return  # pongs and frame types this client does not know
        event = frame["event"]
        if "id" in event:
            self._last_event_id = event["id"]
        self.render.event(event)
        if event["type"] == "tool.confirmation_requested":
            self._ask(event["turn_id"], event["payload"])
        elif event["type"] == "message.complete":
            self._complete_messages.add(event["payload"]["message_id"])
        elif event["type"] in TERMINAL_TYPES:
            self._finished.add(event["turn_id"])
        elif event["type"] == "session.ended":
            self._ended.set()
        self._changed.set()

    def _ask(self, turn_id: str, request: dict[str, Any]) -> None:
        """Queue a confirmation prompt once, whether it came as an event or in a snapshot."""
        request_id = str(request["confirmation_request_id"])
        if request_id in self._requests_seen:
            return
        self._requests_seen.add(request_id)
        self._asked.append((turn_id, request))

    def _spawn(self, coro: Any) -> None:
        """Fire-and-forget sends from sync callbacks, kept referenced until done."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _finish_session(self) -> None:
        self._ended.set()
        self._changed.set()
        self.lines.put_nowait(None)

    async def _until_changed(self, *also: asyncio.Future[Any]) -> None:
        self._changed.clear()
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({changed, *also}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()

    def _turn_over(self, turn_id: str) -> bool:
        return turn_id in self._finished or self._ended.is_set()

    # turns ------------------------------------------------------------------------------------

    async def run_turn(self, text: str) -> None:
        if not await self._until_attached():
            self.render.line("error", "not sent: the chat lost its session's stream")
            return
        try:
            accepted = await self.call(
                "POST",
                f"/sessions/{self.session_id}/turns",
                {"content": [{"type": "text", "text": text}]},
            )
        except ApiFailure as exc:
            self.render.line("error", exc.said)
            return
        # The turn may already be over: its events can arrive before the 202 is read.
        self._turns_started += 1
        turn_id = self.turn_id = accepted["turn_id"]
        self._cancel_sent = False
        try:
            while not self._turn_over(turn_id):
                request = next((p for t, p in self._asked if t == turn_id), None)
                if request is not None:
                    self._asked.remove((turn_id, request))
                    await self.confirm(turn_id, request)
                else:
                    await self._until_changed()
        finally:
            self.turn_id = None

    async def _until_attached(self) -> bool:
        """Wait while the stream is being attached again; False if the session's stream is
        gone for good (the chat is ending)."""
        if self._attached.is_set():
            return True
        attached = asyncio.ensure_future(self._attached.wait())
        try:
            while not attached.done() and not self._ended.is_set():
                await self._until_changed(attached)
        finally:
            attached.cancel()
        return self._attached.is_set()

    async def confirm(self, turn_id: str, request: dict[str, Any]) -> None:
        """Ask y (allow once), a (allow for this session, when the request offers it) or n
        (deny, then an optional reason) in the terminal; the answer goes back over REST.

        Several requests can be pending at once (one per tool call of a message); each prompt
        names the call it is about, and they are asked one after another in arrival order.
        When the input ends first (a pipe, Ctrl-D), no one is left to answer: the call is
        denied, so that the turn can end and the chat with it.
        """
        body = await self._decision(turn_id, request)
        if body is None:
            if self._turn_over(turn_id):  # answered elsewhere, cancelled or withdrawn
                return
            print(
                f"metis: the input ended before `allow {request.get('tool_name')}?` was "
                "answered: denied",
                file=sys.stderr,
                flush=True,
            )
            body = {"decision": "deny", "scope": "once", "reason": "input ended"}
        else:
            self.render.line(
                "you",
                body["decision"]
                + (" for this session" if body["scope"] == "session" else "")
                + (f": {body['reason']}" if body.get("reason") else ""),
            )
        answered = request["confirmation_request_id"]
        typed = body.get("reason") != "input ended"
        if typed:  # its `you>` line says it; its event may come before the call returns
            self.render.own_answers.add(answered)
        try:
            assert self.api is not None and self.session_id is not None
            await self.api.answer_confirmation(self.session_id, turn_id, answered, body)
        except ApiFailure as exc:
            self.render.own_answers.discard(answered)
            if exc.code == "confirmation_already_resolved":  # elsewhere, or the turn ended
                self.render.line("confirm", tooldisplay.already_settled(request, exc.details))
            else:
                self.render.line("error", exc.said)

    async def _decision(self, turn_id: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """The answer typed to one confirmation request, as the REST body; None when the turn
        ended or the input did before it was whole."""
        summary = request.get("command_summary") or request.get("input_summary") or ""
        session_scope = "session" in (request.get("allowed_scopes") or ["once"])
        keys = "y/a/n" if session_scope else "y/n"
        self.render.line("confirm", f"allow {request.get('tool_name')}: {summary}? [{keys}]")
        while True:
            line = await self._answer_line(turn_id)
            if line is None:
                return None
            answer = _ANSWERS.get(line.strip().lower())
            if answer is not None and (answer[1] == "once" or session_scope):
                break
            # anything else is asked again: a stray line must not decide for the user
            choices = "y, a or n" if session_scope else "y or n"
            self.render.line(
                "confirm", f"please answer {choices}: allow {request.get('tool_name')}?"
            )
        decision, scope = answer
        body: dict[str, Any] = {"decision": decision, "scope": scope}
        if decision == "deny":
            self.render.line("confirm", "reason for denying (optional, Enter skips)?")
            reason = await self._answer_line(turn_id)
            if reason is None:
                return None
            if reason.strip():
                body["reason"] = reason.strip()
        return body

    async def _answer_line(self, turn_id: str) -> str | None:
        """The next typed line; None when the turn ended first or the input did."""
        answer = asyncio.ensure_future(self.lines.get())
        while not answer.done() and not self._turn_over(turn_id):
            await self._until_changed(answer)
        if not answer.done():
            answer.cancel()  # the turn ended (cancelled, withdrawn) before an answer came
            return None
        line = answer.result()
        if line is None:
            self.lines.put_nowait(None)  # keep the end of input for the main loop
        return line

    def interrupt(self) -> None:
        """Ctrl-C: cancel the running turn (a `cancel` frame), else leave.

        A turn whose terminal event was already shown counts as over even before `run_turn`
        has noticed: a Ctrl-C right after "cancelled" leaves instead of being swallowed.
        """
        turn_id = self.turn_id
        running = turn_id is not None and not self._turn_over(turn_id)
        if running and self.ws is not None and not self.ws.closed:
            if not self._cancel_sent:
                self._cancel_sent = True
                self.render.line("metis", "cancelling the turn…")
                self._spawn(
                    self.ws.send_json(
                        {"type": "cancel", "turn_id": turn_id, "reason": "user_cancel"}
                    )
                )
            return
        self.lines.put_nowait(None)

    # commands ---------------------------------------------------------------------------------

    async def command(self, line: str) -> bool:
        """Run a `/command`; False means leave."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            for help_line in _HELP.splitlines():
                self.render.line("metis", help_line)
        elif name == "/model":
            await self.set_model(arg)
        else:
            self.render.line("error", f"unknown command {name}; /help lists them")
        return True

    async def set_model(self, arg: str) -> None:
        try:
            if not arg:
                session = await self.call("GET", f"/sessions/{self.session_id}")
                self.render.line("model", str(session.get("active_model") or "routing decides"))
                return
            reference = None if arg == "-" else arg
            # counted before the call: the event can arrive before the answer is read
            self.render.own_model_changes += 1
            try:
                change = await self.call(
                    "PATCH", f"/sessions/{self.session_id}", {"active_model": reference}
                )
            except ApiFailure:
                self.render.own_model_changes -= 1
                raise
        except ApiFailure as exc:
            self.render.line("error", exc.said)
            return
        model = change.get("active_model") or "none"
        how = " (routing decides)" if reference is None else ""
        when = (
            f" after turn {change['swap_queued_until_turn']}" if change.get("swap_queued") else ""
        )
        self.render.line("model", f"{model}{how}{when}")

    # main loop --------------------------------------------------------------------------------

    async def run(self) -> int:
        async with DaemonApi(self.url, self.headers) as api:
            self.api = api
            try:
                if self.session_id is None:
                    body: dict[str, Any] = {"workspace_path": self.workspace or str(Path.cwd())}
                    if self.model is not None:
                        body["initial_active_model"] = self.model
                    self.session_id = (await self.call("POST", "/sessions", body))["id"]
                    self._created = True
                snapshot = await self.attach()
            except aiohttp.ClientConnectionError:
                self.render.line("error", unreachable(self.url))
                return 1
            except ApiFailure as exc:
                self.render.line("error", exc.said)
                return 1
            assert snapshot is not None
            session = snapshot["session"]
            self.render.line(
                "metis",
                f"session {self.session_id} on {session['workspace_path']} "
                f"(model: {session.get('active_model') or 'routing decides'})"
                f"{instructions_note(self.instructions)}; /help for commands",
            )
            self._attached.set()
            consumer = asyncio.ensure_future(self.consume())
            try:
                await self._loop()
            finally:
                consumer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer
                if self.ws is not None:
                    await self.ws.close()
            if await self._end_if_unused():
                self.render.line("metis", f"bye; session {self.session_id} was never used: ended")
            else:
                self.render.line(
                    "metis", f"bye; `metis chat --session {self.session_id}` continues it"
                )
        return 0

    async def _end_if_unused(self) -> bool:
        """A session this chat created and sent no turn to is ended (DELETE, data kept), so
        quitting at once leaves no idle active session behind. True when it was ended."""
        if not self._created or self._turns_started or self._ended.is_set():
            return False
        try:
            await self.call("DELETE", f"/sessions/{self.session_id}")
        except (ApiFailure, aiohttp.ClientError, TimeoutError):
            return False
        return True

    async def _loop(self) -> None:
        while not self._ended.is_set():
            # A line typed while a turn was streaming is already queued: its terminal echo was
            # mixed into the reply, so it is shown again, labelled, when its turn comes.
            typed_ahead = not self.lines.empty()
            if self.prompt and not typed_ahead:
                self.render.prompt()
            line = await self.lines.get()
            if line is None:
                return
            line = line.strip()
            if self.prompt and not typed_ahead:
                self.render.prompted()
            elif line:
                self.render.line("you", line)  # a piped transcript still shows who said what
            if not line:
                continue
            if line.startswith("/"):
                if not await self.command(line):
                    return
                continue
            await self.run_turn(line)


# -- the command ---------------------------------------------------------------------------------


def _stdin_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str | None]) -> None:
    """Blocking reads belong in a thread; each line is handed to the loop."""

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, line)
        loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read, name="metis-chat-stdin", daemon=True).start()


async def _resolve_session(args: argparse.Namespace, url: str, headers: Mapping[str, str]) -> str:
    """`--session ID` as given; `--continue`: the active session of the workspace used last."""
    if not args.continue_:
        return str(args.session) if args.session else ""
    workspace = str(Path(args.workspace or ".").expanduser().resolve())
    try:
        async with DaemonApi(url, headers) as api:
            found = await api.last_used_session(workspace)
    except aiohttp.ClientError:  # unreachable: said when the chat connects
        found = None
    return found or ""


async def _chat(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    workspace = str(Path(args.workspace).expanduser().resolve()) if args.workspace else None
    try:
        target = target_from_args(args)
    except ConfigError as exc:
        print(f"metis: configuration error:\n{exc.message}", file=sys.stderr)
        return 2
    try:
        session_id = await _resolve_session(args, target.url, target.headers())
    except (ApiFailure, NotADaemon) as exc:  # a wrong key, say: not "no session to continue"
        print(f"error> {exc.said if isinstance(exc, ApiFailure) else exc}")
        return 1
    if args.continue_ and not session_id:
        print("metis> no active session on this workspace to continue; starting a new one")
    chat = ChatSession(
        target.url,
        workspace,
        lines,
        sys.stdout,
        session_id=session_id or None,
        model=args.model,
        prompt=sys.stdin.isatty() and sys.stdout.isatty(),
        headers=target.headers(),
    )
    _stdin_lines(loop, lines)
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGINT, chat.interrupt)
    return await chat.run()


def use_tui(args: argparse.Namespace) -> bool:
    """The full-screen app when both ends are a terminal, unless `--plain`."""
    return not args.plain and sys.stdin.isatty() and sys.stdout.isatty()


def chat_command(args: argparse.Namespace) -> int:
    if use_tui(args):
        from metis.commands.tui.app import run_app  # Textual loads only for the app

        return run_app(args)
    try:
        return asyncio.run(_chat(args))
    except KeyboardInterrupt:  # pragma: no cover - only without a signal handler
        return 130


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat with the running daemon in this terminal",
        description="Start a session on WORKSPACE (default: the current directory) and chat. "
        "At a terminal this opens a full-screen app (docs/tui.md); --plain, or a pipe, keeps "
        "a line-by-line client.",
    )
    parser.add_argument("workspace", nargs="?", help="workspace directory (default: .)")
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument(
        "--session",
        type=session_id,
        help="continue an existing session instead of creating one",
    )
    resume.add_argument(
        "--continue",
        dest="continue_",
        action="store_true",
        help="continue the active session of this workspace used last",
    )
    parser.add_argument("--model", help="initial model reference (default: routing decides)")
    parser.add_argument(
        "--plain", action="store_true", help="line-by-line client, even at a terminal"
    )
    add_arguments(parser)
    parser.set_defaults(func=chat_command)
