"""`metis chat` at a terminal: a full-screen Textual app over the daemon's public surfaces.

REST creates or resumes the session, sends turns, answers confirmations and changes the model;
the session's WebSocket (`preset:chat`) streams the turn into the transcript. A resumed session
shows its earlier conversation (GET messages). docs/tui.md is the user guide.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
from rich.text import Text
from textual.app import App
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from metis.commands import export as exporter
from metis.commands import tooldisplay
from metis.commands.client import (
    ApiFailure,
    DaemonApi,
    reason_code,
    text_of,
    tool_result_text,
)
from metis.commands.daemon_client import target_from_args
from metis.commands.tui.history import InputHistory
from metis.commands.tui.screens import ConfirmScreen, Decision, SessionPicker
from metis.commands.tui.widgets import (
    AssistantMessage,
    Note,
    PromptInput,
    StatusBar,
    ThinkingBlock,
    ToolCard,
    UserMessage,
    short_path,
    warm_up_markdown,
)
from metis.core.errors import ConfigError
from metis.private_file import write_private

TERMINAL_TYPES = ("turn.completed", "turn.cancelled", "turn.failed")
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
QUIT_WINDOW_S = 2.0
RETRY_FIRST_S = 0.2  # re-attaching waits this long first, then twice as long each time
RETRY_MAX_S = 5.0  # a daemon restart takes seconds: keep trying, at most this far apart
GONE_CODES = ("session_not_found", "session_already_ended")
TURN_GONE_CODES = (*GONE_CODES, "turn_not_found", "turn_already_completed")
MAX_HINTS = 12  # completions listed under the prompt
READ_SLICE_S = 0.004  # at most this long handling frames before the app's other work runs
COMMANDS = {
    "/model": "/model [alias|-]  pin a model (- : routing decides); no argument shows it",
    "/models": "/models  the configured models and their context windows",
    "/cost": "/cost  this session's cost and tokens",
    "/sessions": "/sessions  pick an active session of this workspace to switch to",
    "/new": "/new  start a new session on this workspace",
    "/title": "/title TEXT  rename this session",
    "/export": "/export [md|json] [FILE]  write this session to a file",
    "/help": "/help  this list",
    "/quit": "/quit  leave (Ctrl-C twice when idle does too)",
}


class ChatApp(App[int]):
    """One chat over one daemon session at a time (`/sessions` and `/new` switch)."""

    TITLE = "metis chat"
    # its Quit would skip ending an unused session; the app's own keys and /commands suffice
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #transcript { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    #spinner { height: 1; padding: 0 1; color: $accent; display: none; }
    #spinner.running { display: block; }
    #hints {
        height: auto; padding: 0 2; color: $text-muted; background: $surface; display: none;
    }
    #hints.shown { display: block; }
    """
    BINDINGS = [
        Binding("ctrl+c", "interrupt", "cancel / quit", priority=True, show=False),
        Binding("escape", "cancel_turn", "cancel the turn", show=False),
        Binding("ctrl+q", "quit_chat", "quit", priority=True, show=False),
        Binding("ctrl+o", "open_confirmation", "answer a pending confirmation", show=False),
    ]

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        *,
        workspace: str | None,
        home: Path,
        session_id: str | None = None,
        continue_latest: bool = False,
        model: str | None = None,
        freeze_heap: bool = False,
    ) -> None:
        super().__init__()
        self.freeze_heap = freeze_heap
        self.api = DaemonApi(url, headers)
        self.workspace = workspace or str(Path.cwd())
        self.home = home
        self.session_id = session_id
        self.continue_latest = continue_latest
        self.initial_model = model
        self.history = InputHistory(home, self.workspace)
        self.session: dict[str, Any] = {}
        self.models: dict[str, dict[str, Any]] = {}
        self.aliases: list[str] = []
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.reader: asyncio.Task[None] | None = None
        self.connected = False  # the session's stream is attached; sends wait for it
        self._retry_now = asyncio.Event()  # cuts a re-attach backoff short (a send is waiting)
        self.last_event_id: str | None = None
        self.turn_id: str | None = None
        self.finished: set[str] = set()  # turns whose end was shown
        self.turn_started = 0.0
        self.turn_model: str | None = None
        self.replies: dict[str, AssistantMessage] = {}
        self.thinking: dict[str, ThinkingBlock] = {}
        self.cards: dict[str, ToolCard] = {}
        self.tool_inputs: dict[str, dict[str, Any]] = {}
        self.pending: dict[str, dict[str, Any]] = {}  # confirmation requests not yet answered
        self.confirm_screen: ConfirmScreen | None = None
        self.last_call: dict[str, Any] | None = None
        self.created = False
        self.turns_sent = 0
        self.ended = False
        self._last_ctrl_c = 0.0
        self._tick = 0
        # held, not queried: the spinner's timer may fire once more while the app shuts down
        self.spinner = Static("", id="spinner")
        self.exit_code = 0

    # layout -----------------------------------------------------------------------------------

    def compose(self) -> Any:
        yield VerticalScroll(id="transcript")
        yield self.spinner
        yield Static("", id="hints")
        yield PromptInput(id="prompt", placeholder="message, /help for commands")
        yield StatusBar()

    @property
    def transcript(self) -> VerticalScroll:
        return self.query_one("#transcript", VerticalScroll)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    async def add(self, widget: Any) -> Any:
        await self.transcript.mount(widget)
        self.transcript.scroll_end(animate=False)
        return widget

    async def note(self, text: str, *, error: bool = False) -> None:
        await self.add(Note(Text(text), classes="error" if error else ""))

    # start and stop ---------------------------------------------------------------------------

    async def on_mount(self) -> None:
        self.transcript.anchor()
        self.prompt.focus()
        self.set_interval(0.1, self._spin)
        await self.api.__aenter__()
        try:
            await self._load_models()
            if self.session_id is None and self.continue_latest:
                self.session_id = await self.api.last_used_session(self.workspace)
                if self.session_id is None:
                    await self.note("no active session on this workspace; starting a new one")
            if self.session_id is None:
                self.session_id = await self._create_session()
                self.created = True  # set first: a session that fails to open is ended too
            await self.open_session(self.session_id)
        except aiohttp.ClientConnectionError:
            await self._fatal(
                f"cannot reach the daemon at {self.api.url}; is `metis serve` running?"
            )
        except ApiFailure as exc:
            await self._fatal(_failure_text(exc))
        warm_up_markdown(self.console)
        if self.freeze_heap:
            # what start-up left (Textual, Rich, aiohttp, pygments) lives as long as the app:
            # out of the collector's reach, full collections stop pausing a stream for ~100 ms
            gc.collect()
            gc.freeze()

    async def _fatal(self, text: str) -> None:
        """Start-up failed: no session is open, so the prompt has nothing to send to."""
        self.exit_code = 1
        await self.note(text, error=True)
        await self.note("press Ctrl-C or Ctrl-Q to leave")
        self.prompt.placeholder = "no session is open: Ctrl-Q leaves"
        self.prompt.disabled = True
        self.status.show(connection="no session")

    async def on_unmount(self) -> None:
        await self._unsubscribe()
        await self.api.__aexit__()

    async def _load_models(self) -> None:
        with contextlib.suppress(ApiFailure, aiohttp.ClientError):
            listing = await self.api.call("GET", "/models")
            self.models = {m["id"]: m for m in listing.get("models", [])}
            self.aliases = sorted({a for m in self.models.values() for a in m.get("aliases", [])})

    async def _create_session(self) -> str:
        body: dict[str, Any] = {"workspace_path": self.workspace}
        if self.initial_model is not None:
            body["initial_active_model"] = self.initial_model
        return str((await self.api.call("POST", "/sessions", body))["id"])

    async def open_session(self, session_id: str) -> None:
        """Show a session: its earlier conversation, then its live stream. Nothing changes
        until its stream is attached: a session that cannot be (ended, unknown) leaves the
        one shown as it was."""
        ws, snapshot, _ = await self._attach_stream(session_id, since=None)
        await self._unsubscribe()
        self.ws = ws
        self._set_connected(True)  # also ends a "disconnected" left by the session before
        self.last_event_id = snapshot["snapshot_at_event_id"]
        self.session_id = session_id
        self.replies.clear()
        self.thinking.clear()
        self.cards.clear()
        self.pending.clear()
        self._turn_over()
        self.ended = False
        self.last_call = None
        await self.transcript.remove_children()
        session = snapshot["session"]
        self.session = session
        self.workspace = session["workspace_path"]
        await self._show_history()
        earlier = int(session.get("turn_count") or 0)
        if earlier:
            await self.add(
                Note(Text(f"── resumed: {earlier} earlier turn(s) ──"), classes="marker")
            )
        where = short_path(session["workspace_path"], 60)
        await self.note(f"session {session_id} on {where}; /help for commands")
        current = session.get("current_turn_id")
        if current:
            self._turn_running(current, session.get("active_model"))
        for request in session.get("pending_confirmations") or []:
            self._queue_confirmation(request)
        await self.refresh_status()
        self.reader = asyncio.create_task(self._read())

    async def _show_history(self) -> None:
        """The stored conversation: messages, tool cards with their results and durations."""
        assert self.session_id is not None
        messages = await self.api.all_messages(self.session_id)
        events = await self.api.all_events(
            self.session_id,
            "tool.completed,tool.failed,llm.call_completed,tool.confirmation_resolved",
        )
        done = {
            e["payload"]["tool_use_id"]: e["payload"]
            for e in events
            if e["type"] in ("tool.completed", "tool.failed")
        }
        denied = {
            e["payload"]["tool_use_id"]: e["payload"]
            for e in events
            if e["type"] == "tool.confirmation_resolved" and e["payload"].get("decision") == "deny"
        }
        calls = [e["payload"] for e in events if e["type"] == "llm.call_completed"]
        self.last_call = calls[-1] if calls else None
        for m in messages:
            if m["role"] == "user":
                await self.add(UserMessage(text_of(m)))
            elif m["role"] == "assistant":
                await self._show_stored_reply(m)
            elif m["role"] == "tool":
                for block in m.get("content") or []:
                    if block.get("type") != "tool_result":
                        continue
                    card = self.cards.get(block["tool_use_id"])
                    if card is None:
                        continue
                    info = done.get(block["tool_use_id"], {})
                    if block["tool_use_id"] in denied:  # as it read live: denied, not failed
                        card.set_state(_resolved_label(denied[block["tool_use_id"]]))
                    else:
                        card.set_state(card.state, info.get("duration_ms"))
                    await card.set_result(
                        tool_result_text(block),
                        is_error=bool(block.get("is_error")),
                        exit_code=info.get("exit_code"),
                    )

    async def _show_stored_reply(self, m: dict[str, Any]) -> None:
        text = ""
        for block in m.get("content") or []:
            kind = block.get("type")
            if kind == "thinking":
                await self.add(ThinkingBlock(block.get("thinking", "")))
            elif kind == "text":
                text += block.get("text", "")
            elif kind == "tool_use":
                if text:
                    await self.add(AssistantMessage(m["id"], text))
                    text = ""
                card = ToolCard(block["id"], block.get("name", ""), self.workspace)
                self.cards[block["id"]] = card
                self.tool_inputs[block["id"]] = block.get("input") or {}
                await self.add(card)
                card.set_input(block.get("input") or {}, live=False)
        if text:
            self.replies[m["id"]] = await self.add(AssistantMessage(m["id"], text))

    async def _attach_stream(
        self, session_id: str, *, since: str | None
    ) -> tuple[aiohttp.ClientWebSocketResponse, dict[str, Any], dict[str, Any]]:
        """Token, socket, subscribe to a session: with a snapshot (`since` None) or the events
        after `since`. Returns the socket, the snapshot frame (or the ack) and the session as
        REST showed it; changes nothing of the app's."""
        session = await self.api.call("GET", f"/sessions/{session_id}")
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
        ws = await self.api.ws_connect(session["ws_url"])
        subscribe: dict[str, Any] = {"type": "subscribe", "filter": "preset:chat"}
        if since is None:
            subscribe["snapshot"] = True
        else:
            subscribe["since"] = since
        try:
            await ws.send_json(subscribe)
            ack = await self._frame(ws)
            if ack.get("type") != "subscribe_ack":
                raise ApiFailure(409, {"error": ack})
            frame = await self._frame(ws) if ack["snapshot"] else ack
        except BaseException:
            await ws.close()
            raise
        return ws, frame, session

    async def _subscribe(self, *, snapshot: bool) -> dict[str, Any]:
        """Attach this session's stream again: a snapshot (whose event id becomes the cursor)
        or the events after the cursor. Returns the snapshot frame (or the ack)."""
        assert self.session_id is not None
        since = None if snapshot else self.last_event_id
        ws, frame, session = await self._attach_stream(self.session_id, since=since)
        self.ws = ws
        self._set_connected(True)  # now, not after a reload's redraw: a send may come first
        self.session = session
        if "snapshot_at_event_id" in frame:
            self.last_event_id = frame["snapshot_at_event_id"]
        return frame

    @staticmethod
    async def _frame(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
        msg = await ws.receive(timeout=10)
        if msg.type == aiohttp.WSMsgType.TEXT:
            frame: dict[str, Any] = json.loads(msg.data)
            return frame
        code = reason_code(msg.extra) or f"closed_{ws.close_code}"
        raise ApiFailure(409, {"error": {"code": code, "message": "closed while attaching"}})

    async def _unsubscribe(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader
            self.reader = None
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
            self.ws = None

    async def _read(self) -> None:
        """Handle frames until the session ends; re-attach after an abnormal close, for as long
        as that takes (the status bar says the app is disconnected meanwhile)."""
        while True:
            ws = self.ws
            assert ws is not None
            reason = ""
            slice_started = time.perf_counter()
            while True:
                msg = await ws.receive()
                if msg.type == aiohttp.WSMsgType.TEXT:
                    try:
                        await self.on_frame(json.loads(msg.data))
                    except Exception as exc:  # one bad frame must not stop the stream
                        self.log.error(f"frame failed: {exc!r}")
                    if time.perf_counter() - slice_started > READ_SLICE_S:
                        # frames already buffered are read without waiting: let keys and
                        # screen updates in between
                        await asyncio.sleep(0)
                        slice_started = time.perf_counter()
                    continue
                if msg.type == aiohttp.WSMsgType.CLOSE:
                    reason = reason_code(msg.extra) or ""
                break
            if self.ended or reason in ("session_ended", "session_purged"):
                await self._session_over()
                return
            self._set_connected(False)
            await self.note(f"stream closed ({reason or ws.close_code}); re-attaching")
            if not await self._reattach():
                await self._session_over()
                return
            await self.note("re-attached to the session")
            if self.turn_id is not None and not self.session.get("current_turn_id"):
                # e.g. the daemon restarted: the turn is over, whether or not its end was stored
                self._turn_over()
                await self.note("the turn is no longer running")
            for request in self.session.get("pending_confirmations") or []:
                self._queue_confirmation(request)
            await self.refresh_status(fetch=False)

    def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        self.status.show(connection="" if connected else "disconnected: re-attaching…")

    async def _reattach(self) -> bool:
        """Subscribe again from the cursor, waiting longer between tries each time (until a
        send cuts the wait short); False when the session is gone."""
        delay = RETRY_FIRST_S
        while True:
            self._retry_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry_now.wait(), delay)
            delay = min(2 * delay, RETRY_MAX_S)
            try:
                await self._subscribe(snapshot=False)
                return True
            except ApiFailure as exc:
                if exc.code in ("cursor_expired", "replay_too_large"):
                    with contextlib.suppress(ApiFailure, aiohttp.ClientError):
                        await self._reload_in_place()
                        return True
                if exc.code in GONE_CODES:
                    return False
            except (aiohttp.ClientError, TimeoutError):
                pass

    async def _reload_in_place(self) -> None:
        """After missing more than the daemon replays: show the session afresh."""
        if self.ws is not None:
            await self.ws.close()
            self.ws = None
        await self.transcript.remove_children()
        snapshot = await self._subscribe(snapshot=True)
        self.session = snapshot["session"]
        self.replies.clear()
        self.thinking.clear()
        self.cards.clear()
        await self._show_history()
        await self.note("missed more of the stream than the daemon replays: reloaded the session")
        current = self.session.get("current_turn_id")
        if current and current != self.turn_id:
            self._turn_running(current, self.session.get("active_model"))
        elif not current and self.turn_id:
            self._turn_over()
        for request in self.session.get("pending_confirmations") or []:
            self._queue_confirmation(request)
        await self.refresh_status()

    async def _session_over(self) -> None:
        self.ended = True
        self.status.show(connection="")  # not re-attaching: there is nothing to attach to
        self._turn_over()
        await self.note("the session ended; /new starts another, /sessions picks one")

    # events -----------------------------------------------------------------------------------

    async def on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "ping" and self.ws is not None:
            await self.ws.send_json({"type": "pong", "nonce": frame.get("nonce")})
            return
        if kind != "event":
            return
        event = frame["event"]
        if "id" in event:
            self.last_event_id = event["id"]
        handler = getattr(self, "_on_" + event.get("type", "").replace(".", "_"), None)
        if handler is not None:
            await handler(event, event.get("payload") or {})

    async def _on_turn_started(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        if self.turn_id != event["turn_id"] and event["turn_id"] not in self.finished:
            self._turn_running(event["turn_id"], p.get("model"))

    async def _on_route_decided(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        if p.get("chosen_model"):
            self.turn_model = p["chosen_model"]

    async def _on_message_start(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        # the reply's block is added with its first text: below its thinking, if any
        self.turn_model = p.get("model") or self.turn_model

    async def _on_text_delta(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        reply = self.replies.get(p["message_id"])
        if reply is None or reply is not self.transcript.children[-1]:
            # the first text, or text after a tool card: a block at the end, so the
            # transcript reads in order
            reply = self.replies[p["message_id"]] = await self.add(
                AssistantMessage(p["message_id"], model=self.turn_model)
            )
        reply.append(p.get("text", ""))  # drawn on the next frame; the anchor keeps it in view

    async def _on_thinking_delta(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        block = self.thinking.get(p["message_id"])
        if block is None:
            block = self.thinking[p["message_id"]] = await self.add(ThinkingBlock())
        block.append(p.get("text", ""))

    async def _on_tool_use_start(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = ToolCard(p["tool_use_id"], p.get("tool_name", ""), self.workspace)
        self.cards[p["tool_use_id"]] = card
        await self.add(card)

    async def _on_tool_use_end(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        self.tool_inputs[p["tool_use_id"]] = p.get("final_input") or {}
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            card.set_input(p.get("final_input"))

    async def _on_message_complete(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        reply = self.replies.get(p["message_id"])
        note = None
        if p.get("stop_reason") in ("cancelled", "error"):
            note = f"the reply was cut short ({p['stop_reason']})"
        if reply is not None:
            reply.finish()
        if note:  # at the end, in the order things happened (after "cancelling the turn…")
            await self.add(Note(Text(note), classes="warning"))

    async def _on_llm_call_completed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        self.last_call = p
        await self.refresh_status(fetch=False)

    async def _on_llm_call_failed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        if p.get("will_retry"):
            await self.note(f"{p.get('error_class')} from {p.get('model')}; retrying")

    async def _on_tool_called(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            card.set_state("running")

    async def _on_tool_completed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            card.set_state("error" if p.get("is_error") else "done", p.get("duration_ms"))
            card.exit_code = p.get("exit_code")
            self.run_worker(self._fill_result(card, p), group="results")

    async def _on_tool_failed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            if p.get("error_class") == "user_denied":  # the card says so already, with the reason
                if not card.state.startswith("denied"):
                    card.set_state("denied")
            else:
                card.set_state(f"failed: {p.get('error_class')}", p.get("duration_ms"))
            self.run_worker(self._fill_result(card, p), group="results")

    async def _on_tool_input_invalid(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            errors = "; ".join(e.get("message", "") for e in p.get("errors", [])[:3])
            card.set_state(f"input invalid: {errors}")

    async def _fill_result(self, card: ToolCard, p: dict[str, Any]) -> None:
        with contextlib.suppress(ApiFailure, aiohttp.ClientError):
            page = await self.api.call(
                "GET", f"/sessions/{self.session_id}/messages", params={"limit": 50}
            )
            for m in page["messages"]:
                if m["id"] != p.get("result_message_id"):
                    continue
                for block in m.get("content") or []:
                    if block.get("type") == "tool_result":
                        await card.set_result(
                            tool_result_text(block),
                            is_error=bool(block.get("is_error")),
                            exit_code=p.get("exit_code"),
                        )

    async def _on_tool_confirmation_requested(
        self, event: dict[str, Any], p: dict[str, Any]
    ) -> None:
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            card.set_state("awaiting your answer")
        self._queue_confirmation({**p, "turn_id": event.get("turn_id")})

    async def _on_tool_confirmation_resolved(
        self, event: dict[str, Any], p: dict[str, Any]
    ) -> None:
        request_id = str(p["confirmation_request_id"])
        self.pending.pop(request_id, None)
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            card.set_state(_resolved_label(p))
        screen = self.confirm_screen
        if screen is not None and screen.request_id == request_id:
            self.confirm_screen = None
            screen.dismiss(None)  # answered here or elsewhere: the question is gone
        self._next_confirmation()

    async def _on_session_model_changed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        await self.refresh_status()

    async def _on_session_ended(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        self.ended = True

    async def _on_turn_completed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        await self._turn_ended(event, "completed")

    async def _on_turn_cancelled(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        await self._turn_ended(event, f"cancelled ({p.get('reason')})")

    async def _on_turn_failed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        await self._turn_ended(event, f"failed: {p.get('reason')}: {p.get('message')}")

    async def _turn_ended(self, event: dict[str, Any], outcome: str) -> None:
        p = event.get("payload") or {}
        for reply in list(self.replies.values()):
            reply.finish()
        seconds = (p.get("wall_time_ms") or 0) / 1000
        line = (
            f"turn {outcome} · {seconds:.1f} s · {p.get('llm_call_count', 0)} call(s) · "
            f"{p.get('tool_call_count', 0)} tool(s) · ${p.get('total_cost_usd', '0')}"
        )
        await self.note(line, error=outcome.startswith("failed"))
        turn_id = event.get("turn_id")
        self.finished.add(str(turn_id))
        for request_id, request in list(self.pending.items()):
            if request.get("turn_id") == turn_id:
                self.pending.pop(request_id)
                screen = self.confirm_screen
                if screen is not None and screen.request_id == request_id:
                    self.confirm_screen = None
                    screen.dismiss(None)
        if self.turn_id == turn_id:
            self._turn_over()
        await self.refresh_status()

    # the running turn -------------------------------------------------------------------------

    def _turn_running(self, turn_id: str, model: str | None) -> None:
        self.turn_id = turn_id
        self.turn_started = time.monotonic()
        self.turn_model = model
        self.spinner.add_class("running")

    def _turn_over(self) -> None:
        self.turn_id = None
        self.spinner.remove_class("running")

    def _spin(self) -> None:
        if self.turn_id is None:
            return
        self._tick += 1
        elapsed = time.monotonic() - self.turn_started
        waiting = " · waiting for your answer (Ctrl-O)" if self.pending else ""
        self.spinner.update(
            Text.assemble(
                (SPINNER[self._tick % len(SPINNER)] + " ", "bold"),
                f"working {elapsed:.1f} s · {self.turn_model or 'routing…'}{waiting}",
                ("   Esc / Ctrl-C cancels", "dim"),
            )
        )

    async def send_turn(self, text: str) -> bool:
        """Send a message; False (the message shown nowhere but in the prompt, kept there)
        when it was not accepted."""
        if self.turn_id is not None:
            await self.note("a turn is running: wait for it, or Esc to cancel it", error=True)
            return False
        if not self.connected:
            self._retry_now.set()
            await self.note(
                "not connected to the daemon: re-attaching, then send again", error=True
            )
            return False
        bubble = await self.add(UserMessage(text))  # before the POST: its reply may be quicker
        try:
            accepted = await self.api.call(
                "POST",
                f"/sessions/{self.session_id}/turns",
                {"content": [{"type": "text", "text": text}]},
            )
        except (ApiFailure, aiohttp.ClientError) as exc:
            await bubble.remove()
            await self.note(f"not sent: {_error_text(exc)}", error=True)
            return False
        self.turns_sent += 1
        # its events may have arrived (even its end) before the 202 was read
        if self.turn_id != accepted["turn_id"] and accepted["turn_id"] not in self.finished:
            self._turn_running(accepted["turn_id"], accepted.get("model"))
        return True

    async def cancel_turn(self) -> bool:
        """Ask the daemon to cancel the running turn (False when none runs). The note comes
        first, so it reads before the turn's own end; a failed cancel rewrites it."""
        turn_id = self.turn_id
        if turn_id is None:
            return False
        note = await self.add(Note(Text("cancelling the turn…")))
        try:
            await self.api.call("POST", f"/sessions/{self.session_id}/turns/{turn_id}/cancel")
        except ApiFailure as exc:
            if exc.code not in TURN_GONE_CODES:
                note.update(Text(f"could not cancel the turn: {_error_text(exc)}"))
                note.add_class("error")
                return True
            if self.turn_id == turn_id:  # its end was never streamed: stop waiting for it
                self._turn_over()
            note.update(Text("the turn is no longer running"))
        except aiohttp.ClientError as exc:
            note.update(Text(f"could not cancel the turn: {_error_text(exc)}"))
            note.add_class("error")
        return True

    # confirmations ----------------------------------------------------------------------------

    def _queue_confirmation(self, request: dict[str, Any]) -> None:
        request_id = str(request["confirmation_request_id"])
        if request_id in self.pending:
            return
        self.pending[request_id] = request
        self._next_confirmation()

    def _next_confirmation(self) -> None:
        if self.confirm_screen is not None or not self.pending:
            return
        request = next(iter(self.pending.values()))
        screen = ConfirmScreen(
            request, self.tool_inputs.get(request["tool_use_id"]), self.workspace
        )
        self.confirm_screen = screen

        def answered(decision: Decision | None) -> None:
            if self.confirm_screen is screen:
                self.confirm_screen = None
            if decision is not None:
                self.run_worker(self._answer(request, decision), group="answers")
            else:
                self.call_later(self._later_hint, request)

        self.push_screen(screen, answered)

    async def _later_hint(self, request: dict[str, Any]) -> None:
        if str(request["confirmation_request_id"]) in self.pending:
            await self.note(f"{request.get('tool_name')} is waiting for your answer: Ctrl-O")

    async def _answer(self, request: dict[str, Any], decision: Decision) -> None:
        body: dict[str, Any] = {"decision": decision.decision, "scope": decision.scope}
        if decision.reason:
            body["reason"] = decision.reason
        try:
            await self.api.call(
                "POST",
                f"/sessions/{self.session_id}/turns/{request['turn_id']}/confirmations/"
                f"{request['confirmation_request_id']}",
                body,
            )
        except ApiFailure as exc:
            if exc.code == "confirmation_already_resolved":  # elsewhere, or the turn ended
                await self.note(tooldisplay.already_settled(request, exc.details))
            else:
                await self.note(_failure_text(exc), error=True)
        except aiohttp.ClientError as exc:  # the question still stands: keep it for Ctrl-O
            await self.note(
                f"the answer was not sent: {_error_text(exc)}; Ctrl-O answers again", error=True
            )
            return
        self.pending.pop(str(request["confirmation_request_id"]), None)
        self._next_confirmation()

    def action_open_confirmation(self) -> None:
        self._next_confirmation()

    # status -----------------------------------------------------------------------------------

    async def refresh_status(self, *, fetch: bool = True) -> None:
        if fetch and self.session_id is not None:
            with contextlib.suppress(ApiFailure, aiohttp.ClientError):
                session = await self.api.call("GET", f"/sessions/{self.session_id}")
                self.session = session
        s = self.session
        if not s:
            return
        how = "pinned" if s.get("sticky_model") else "routing"
        fields = {
            "workspace": s.get("workspace_path", ""),
            "model": f"{s.get('active_model') or '—'} ({how})",
            "cost": f"${s.get('cost_so_far_usd', '0')}",
            "tokens": "",
            "context": "",
        }
        call = self.last_call
        if call:
            used = (
                call.get("input_tokens", 0)
                + call.get("cache_read_tokens", 0)
                + call.get("cache_write_tokens", 0)
            )
            fields["tokens"] = f"{used} in / {call.get('output_tokens', 0)} out"
            window = (
                (self.models.get(call.get("model", "")) or {})
                .get("capabilities", {})
                .get("max_context_tokens")
            )
            if window:
                total = used + call.get("output_tokens", 0)
                fields["context"] = f"{100 * total / window:.1f}%"
        self.status.show(**fields)

    # input ------------------------------------------------------------------------------------

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text.strip()
        if not text:
            return
        if text not in ("/quit", "/exit"):  # leaving is not worth recalling
            self.history.add(message.text.rstrip())
        self._show_hints([])
        if text.startswith("/"):
            self.prompt.set_text("")
            await self.command(text)
        elif self.ended:
            await self.note("this session ended: /new starts another", error=True)
        elif await self.send_turn(message.text.rstrip()) and self.prompt.text == message.text:
            self.prompt.set_text("")  # sent: the draft is done with (unless edited meanwhile)

    def on_prompt_input_history_requested(self, message: PromptInput.HistoryRequested) -> None:
        if message.direction < 0:
            entry = self.history.previous(self.prompt.text)
        else:
            entry = self.history.next()
        if entry is not None:
            self.prompt.set_text(entry)

    def completions(self, text: str) -> list[str]:
        """What Tab could complete the prompt's text to (whole replacement texts)."""
        if text.startswith("/") and " " not in text:
            return [c for c in COMMANDS if c.startswith(text)]
        if text.startswith("/model "):
            arg = text.removeprefix("/model ")
            return [f"/model {a}" for a in [*self.aliases, "-"] if a.startswith(arg)]
        if text.startswith("/export "):
            arg = text.removeprefix("/export ")
            return [f"/export {f}" for f in ("md", "json") if f.startswith(arg) and arg != f]
        head, _, word = text.rpartition(" ")
        if word.startswith("@"):
            prefix = f"{head} " if head else ""
            return [f"{prefix}@{a} " for a in self.aliases if a.startswith(word[1:])]
        return []

    def on_prompt_input_completion_requested(self, _: PromptInput.CompletionRequested) -> None:
        options = self.completions(self.prompt.text)
        if not options:
            return
        if len(options) == 1:
            self.prompt.set_text(options[0] if options[0].endswith(" ") else options[0] + " ")
            self._show_hints([])
            return
        common = options[0]
        for option in options[1:]:
            while not option.startswith(common):
                common = common[:-1]
        if len(common) > len(self.prompt.text):
            self.prompt.set_text(common)
        self._show_hints(options)

    def on_text_area_changed(self, _: Any) -> None:
        text = self.prompt.text
        self._show_hints(
            self.completions(text) if text.startswith(("/", "@")) or " @" in text else []
        )

    def _show_hints(self, options: list[str]) -> None:
        hints = self.query_one("#hints", Static)
        if not options:
            hints.remove_class("shown")
            return
        # one per line, every command (9); a long list of aliases ends with how many more
        text = Text()
        for option in options[:MAX_HINTS]:
            usage, _, what = COMMANDS.get(option, option).partition("  ")
            text.append(f"{usage}  ", style="bold")
            text.append(f"{what}\n")
        if len(options) > MAX_HINTS:
            text.append(f"… {len(options) - MAX_HINTS} more\n")
        text.rstrip()
        hints.update(text)
        hints.add_class("shown")

    # commands ---------------------------------------------------------------------------------

    async def command(self, line: str) -> None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        handler = {
            "/quit": self._cmd_quit,
            "/exit": self._cmd_quit,
            "/help": self._cmd_help,
            "/model": self._cmd_model,
            "/models": self._cmd_models,
            "/cost": self._cmd_cost,
            "/sessions": self._cmd_sessions,
            "/new": self._cmd_new,
            "/title": self._cmd_title,
            "/export": self._cmd_export,
        }.get(name)
        if handler is None:
            await self.note(f"unknown command {name}; /help lists them", error=True)
            return
        try:
            await handler(arg)
        except ApiFailure as exc:
            await self.note(_failure_text(exc), error=True)
        except aiohttp.ClientError as exc:
            await self.note(_error_text(exc), error=True)

    async def _cmd_quit(self, arg: str) -> None:
        await self.action_quit_chat()

    async def _cmd_help(self, arg: str) -> None:
        keys = (
            "Enter sends · Shift+Enter or Ctrl+J: new line · ↑/↓ history · Tab completes · "
            "Esc or Ctrl-C cancels a turn · Ctrl-C twice quits · Ctrl-O answers a pending "
            "confirmation"
        )
        await self.note("\n".join([*COMMANDS.values(), keys]))

    async def _cmd_model(self, arg: str) -> None:
        if not arg:
            await self.refresh_status()
            how = "pinned" if self.session.get("sticky_model") else "routing decides"
            await self.note(f"model: {self.session.get('active_model')} ({how})")
            return
        reference = None if arg == "-" else arg
        change = await self.api.call(
            "PATCH", f"/sessions/{self.session_id}", {"active_model": reference}
        )
        when = (
            f" after turn {change['swap_queued_until_turn']}" if change.get("swap_queued") else ""
        )
        how = " (routing decides)" if reference is None else " (pinned)"
        await self.note(f"model: {change.get('active_model')}{how}{when}")
        await self.refresh_status()

    async def _cmd_models(self, arg: str) -> None:
        await self._load_models()
        rows = [("model", "aliases", "context", "availability")]
        for m in self.models.values():
            window = (m.get("capabilities") or {}).get("max_context_tokens")
            rows.append(
                (
                    m["id"],
                    ", ".join(m.get("aliases", [])),
                    str(window or "?"),
                    str(m.get("availability")),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        await self.note("\n".join(lines))  # metis's own output: a note, not a reply

    async def _cmd_cost(self, arg: str) -> None:
        await self.refresh_status()
        events = await self.api.all_events(str(self.session_id), "llm.call_completed")
        tokens_in = sum(e["payload"].get("input_tokens", 0) for e in events)
        tokens_out = sum(e["payload"].get("output_tokens", 0) for e in events)
        await self.note(
            f"session cost ${self.session.get('cost_so_far_usd')} · "
            f"{self.session.get('turn_count')} turn(s) · {len(events)} call(s) · "
            f"{tokens_in} in / {tokens_out} out tokens"
        )

    async def _cmd_sessions(self, arg: str) -> None:
        # ended sessions are not listed: they cannot be continued (`metis sessions export`)
        sessions = await self.api.sessions(
            workspace_path=self.workspace, surface="metis", status="active", limit=50
        )
        if not [s for s in sessions if s["id"] != self.session_id]:
            await self.note("no other active session on this workspace; /new starts one")
            return

        def picked(session_id: str | None) -> None:
            if session_id and session_id != self.session_id:
                self.run_worker(self.switch_to(session_id), group="switch")

        self.push_screen(SessionPicker(sessions[:50], self.session_id), picked)

    async def switch_to(self, session_id: str) -> None:
        if self.turn_id is not None:
            await self.note("a turn is running: cancel it before switching", error=True)
            return
        unused = self._unused_session()
        try:
            await self.open_session(session_id)
        except (ApiFailure, aiohttp.ClientError) as exc:  # a worker: nothing above catches it
            await self.note(_error_text(exc), error=True)
            return
        self.created = False
        self.turns_sent = 0
        await self._end_session(unused)

    async def _cmd_new(self, arg: str) -> None:
        if self.turn_id is not None:
            await self.note(
                "a turn is running: cancel it before starting a new session", error=True
            )
            return
        unused = self._unused_session()
        new = await self._create_session()
        await self.open_session(new)
        self.created = True
        self.turns_sent = 0
        await self._end_session(unused)

    async def _cmd_title(self, arg: str) -> None:
        if not arg:
            await self.note(f"title: {self.session.get('title') or '(none yet)'}")
            return
        await self.api.call("PATCH", f"/sessions/{self.session_id}", {"title": arg})
        await self.refresh_status()
        await self.note(f"title: {self.session.get('title')}")

    async def _cmd_export(self, arg: str) -> None:
        parts = arg.split(maxsplit=1)
        fmt = "md"
        if parts and parts[0] in ("md", "json"):
            fmt = parts.pop(0)
        elif parts and "." not in parts[0] and "/" not in parts[0]:
            # a bare word is a format, not a file name: `/export txt` is refused, not a file
            await self.note(
                f"unknown export format {parts[0]}: md or json (/export [md|json] [FILE])",
                error=True,
            )
            return
        path = Path(parts[0]).expanduser() if parts else Path(f"{self.session_id}.{fmt}")
        data = await exporter.collect(self.api, str(self.session_id))
        text = exporter.to_json(data) if fmt == "json" else exporter.to_markdown(data)
        try:
            write_private(path, text.encode())
        except OSError as exc:
            await self.note(f"cannot write {path}: {exc}", error=True)
            return
        await self.note(f"exported to {path.resolve()} ({fmt})")

    # keys -------------------------------------------------------------------------------------

    async def action_interrupt(self) -> None:
        """Ctrl-C: cancel the running turn; when idle, twice within 2 s quits."""
        if await self.cancel_turn():
            return
        now = time.monotonic()
        if now - self._last_ctrl_c <= QUIT_WINDOW_S:
            await self.action_quit_chat()
            return
        self._last_ctrl_c = now
        self.notify("press Ctrl-C again to quit", timeout=QUIT_WINDOW_S)

    async def action_cancel_turn(self) -> None:
        await self.cancel_turn()

    async def action_quit_chat(self) -> None:
        await self._unsubscribe()
        if await self._end_session(self._unused_session()):
            self.ended = True
        self.exit(self.exit_code)

    def _unused_session(self) -> str | None:
        """The session shown, if this app created it and sent it no turn: it is ended on
        leaving it."""
        if not self.created or self.turns_sent or self.ended:
            return None
        return self.session_id

    async def _end_session(self, session_id: str | None) -> bool:
        if session_id is None:
            return False
        try:
            await self.api.call("DELETE", f"/sessions/{session_id}")
        except (ApiFailure, aiohttp.ClientError):
            return False
        return True

    @property
    def continuable(self) -> bool:
        """A session was opened and is still active on leaving: `--session` continues it."""
        return bool(self.session) and not self.ended


def _failure_text(exc: ApiFailure) -> str:
    text = str(exc)
    tried = exc.details.get("tried") if isinstance(exc.details, dict) else None
    if tried:
        reasons = "; ".join(
            f"{t.get('model')}: {t.get('message') or t.get('reason')}" for t in tried[:4]
        )
        text += f" ({reasons})"
    return text


def _resolved_label(p: dict[str, Any]) -> str:
    """A tool card's state after a confirmation's answer (`denied: not now`), live or resumed."""
    scope = " for this session" if p.get("scope") == "session" else ""
    reason = f": {p['reason']}" if p.get("reason") else ""
    label = {"allow": "allowed", "deny": "denied"}.get(p["decision"], p["decision"])
    return f"{label}{scope}{reason}"


def _error_text(exc: ApiFailure | aiohttp.ClientError) -> str:
    if isinstance(exc, ApiFailure):
        return _failure_text(exc)
    return f"the daemon did not answer ({exc})"


def run_app(args: argparse.Namespace) -> int:
    try:
        target = target_from_args(args)
    except ConfigError as exc:
        print(f"metis: configuration error:\n{exc.message}")
        return 2
    workspace = str(Path(args.workspace).expanduser().resolve()) if args.workspace else None
    app = ChatApp(
        target.url,
        target.headers(),
        workspace=workspace,
        home=target.home,
        session_id=args.session,
        continue_latest=args.continue_,
        model=args.model,
        freeze_heap=True,
    )
    code = app.run()
    if app.continuable:
        print(f"metis: `metis chat --session {app.session_id}` continues this session")
    return int(code or 0)
