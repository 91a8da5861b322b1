"""`metis chat` at a terminal: a full-screen Textual app over the daemon's public surfaces.

REST creates or resumes the session, sends turns, answers confirmations and changes the model;
the session's WebSocket (`preset:full`) streams the turn into the transcript. A resumed session
shows its earlier conversation (GET messages). docs/tui.md is the user guide.

`ChatApp` holds the session shown and the screen's layout, and hands each job to a part it
owns: the stream (stream.py), drawing events (transcript.py), the running turn (turn.py),
confirmations (confirmations.py), the `/` commands (slash_commands.py) and completion
(completion.py). Each part sees the app through a small protocol naming what it uses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from rich.text import Text
from textual import events
from textual.app import App
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Static

from metis.commands import client
from metis.commands.client import CALL_FAILURES, ApiFailure, DaemonApi
from metis.commands.daemon_client import target_from_args, unreachable
from metis.commands.failures import error_text, failure_text
from metis.commands.paths import short_path
from metis.commands.tui.completion import PromptCompletion
from metis.commands.tui.confirmations import ConfirmationQueue
from metis.commands.tui.history import InputHistory
from metis.commands.tui.slash_commands import SlashCommands
from metis.commands.tui.status import status_fields
from metis.commands.tui.stream import SessionStream
from metis.commands.tui.transcript import TranscriptRenderer
from metis.commands.tui.turn import RunningTurn
from metis.commands.tui.widgets import (
    AssistantMessage,
    Note,
    PromptInput,
    StatusBar,
    Transcript,
    plain,
    warm_up_markdown,
)
from metis.core.errors import ConfigError
from metis.wire.counts import counted
from metis.wire.instructions import instructions_note

QUIT_WINDOW_S = 2.0
MORE_BELOW = "↓ more below"  # short: at 60 columns the model's name must fit beside it
"""The status bar's word that the transcript, scrolled up, has had something added below."""
QUIT_WAIT_S = 3.0
"""Leaving waits this long at most for the daemon (closing the stream, ending an unused
session): one that does not answer must not hold the terminal."""


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
        height: auto; max-height: 60%; padding: 0 2; color: $text-muted; background: $surface;
        text-wrap: nowrap; text-overflow: ellipsis; display: none;
    }
    #hints.shown { display: block; }
    #transcript .found { background: $warning 15%; }
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
        call_timeout_s: float | None = None,
    ) -> None:
        super().__init__()
        self.freeze_heap = freeze_heap
        self.api = DaemonApi(url, headers, call_timeout_s)
        self.workspace = workspace or str(Path.cwd())
        self.home = home
        self.session_id = session_id
        self.continue_latest = continue_latest
        self.initial_model = model
        self.history = InputHistory(home, self.workspace)
        self.session: dict[str, Any] = {}
        self.models: dict[str, dict[str, Any]] = {}
        self.aliases: list[str] = []
        self.last_call: dict[str, Any] | None = None
        self.left_out = 0  # the earliest messages the last model call did not see
        self.created = False
        self.ended = False
        self._last_ctrl_c = 0.0
        self.exit_code = 0
        self.start_failure: str | None = None  # why no session could be opened, said on exit too
        # what is typed is handled one line at a time, in order, each in a worker: the keys
        # (Ctrl-C, Ctrl-Q) go on working while the daemon is slow to answer
        self._in_order = asyncio.Lock()
        self.stream = SessionStream(self)
        self.turn = RunningTurn(self)
        self.confirmations = ConfirmationQueue(self)
        self.renderer = TranscriptRenderer(self)
        self.slash_commands = SlashCommands(self)
        self.completion = PromptCompletion(self)

    # layout -----------------------------------------------------------------------------------

    def compose(self) -> Any:
        # never focused itself, only its collapsed parts: Shift+Tab stopped on it on the way
        # back to the prompt, a stop that showed nothing (PageUp / PageDown scroll it)
        yield Transcript(id="transcript", can_focus=False)
        yield self.turn.spinner
        yield Static("", id="hints")
        yield PromptInput(id="prompt", placeholder="message, /help for commands")
        yield StatusBar()

    @property
    def transcript(self) -> Transcript:
        return self.query_one("#transcript", Transcript)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    @property
    def hints(self) -> Static:
        return self.query_one("#hints", Static)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def note_width(self) -> int:
        """The columns a note's text has: the transcript's, less its scrollbar (shown or not
        yet: the note may be what brings it) and a note's padding."""
        transcript = self.transcript
        scrollbar = 0 if transcript.show_vertical_scrollbar else 1
        return max(20, transcript.scrollable_content_region.width - scrollbar - 2)

    async def add(self, widget: Any) -> Any:
        """Mount at the transcript's end, in view while the transcript follows its end (its
        anchor). One scrolled up to read is not pulled down by each card or note that arrives:
        the bar says something did, until the end is scrolled to (`_on_transcript_scrolled`);
        sending anything brings the end back (`on_prompt_input_submitted`)."""
        await self.transcript.mount(widget)
        self.grew()
        return widget

    def grew(self) -> None:
        """Something was added to the transcript, or a reply in it grew: said on the bar while
        the transcript is scrolled up (once: a reply grows at every piece of text)."""
        if not self.transcript.following and not self.status.fields.get("below"):
            self.status.show(below=MORE_BELOW)

    def _on_transcript_scrolled(self) -> None:
        if self.status.fields.get("below") and self.transcript.following:
            self.status.show(below="")

    async def note(self, text: str, *, error: bool = False, listing: bool = False) -> Widget:
        """A line from metis in the transcript; the widget, for a note that goes once moot. A
        `listing` (/help, /models, /mcp) taller than the transcript is shown from its first
        line: following the end, /help showed its keys with its commands scrolled away."""
        note = Note(plain(text), classes="error" if error else "")
        await self.add(note)
        if listing:
            # once laid out: before, its height is not known
            self.transcript.call_after_refresh(self._show_from_its_top, note)
        return note

    def _show_from_its_top(self, note: Widget) -> None:
        """Scroll to a note's first line if its whole does not fit; the transcript then stays
        there until its end is scrolled to again (or something new arrives)."""
        transcript = self.transcript
        if note.outer_size.height > transcript.scrollable_content_region.height:
            transcript.release_anchor()
            transcript.scroll_to_widget(note, animate=False, top=True)

    # start and stop ---------------------------------------------------------------------------

    async def on_mount(self) -> None:
        self.transcript.anchor()
        self.watch(self.transcript, "scroll_y", self._on_transcript_scrolled, init=False)
        self.prompt.focus()
        self.set_interval(0.1, self.turn.spin)
        await self.api.__aenter__()
        self.status.show(connection="connecting to the daemon…")
        await self._in_order.acquire()  # what is typed meanwhile waits for the session
        self.run_worker(self._start(), group="input")

    async def _start(self) -> None:
        """Open the session (created, continued or given), in a worker: the screen is drawn
        and Ctrl-Q leaves while the daemon is slow to answer."""
        try:
            await self._open_first_session()
        finally:
            self._in_order.release()
        warm_up_markdown(self.console)
        if self.freeze_heap:
            # what start-up left (Textual, Rich, aiohttp, pygments) lives as long as the app:
            # out of the collector's reach, full collections stop pausing a stream for ~100 ms
            gc.collect()
            gc.freeze()

    async def _open_first_session(self) -> None:
        try:
            await self.load_models()
            if self.session_id is None and self.continue_latest:
                self.session_id = await self.api.last_used_session(self.workspace)
                if self.session_id is None:
                    await self.note("no active session on this workspace; starting a new one")
            if self.session_id is None:
                self.session_id = await self._create_session()
                self.created = True  # set first: a session that fails to open is ended too
            await self.open_session(self.session_id)
        except aiohttp.ClientConnectionError:
            await self._fatal(unreachable(self.api.url))
        except ApiFailure as exc:
            await self._fatal(failure_text(exc))
        except TimeoutError as exc:
            await self._fatal(self.call_failed(exc))

    async def _fatal(self, text: str) -> None:
        """Start-up failed: no session is open, so the prompt has nothing to send to. It is
        disabled before the notes are drawn: nothing can be sent once the failure shows."""
        self.exit_code = 1
        self.start_failure = text
        self.prompt.placeholder = "no session is open: Ctrl-Q leaves"
        self.prompt.disabled = True
        self.status.show(connection="no session")
        await self.note(text, error=True)
        await self.note("press Ctrl-C or Ctrl-Q to leave")

    async def on_unmount(self) -> None:
        await self.stream.close()
        await self.api.__aexit__()

    async def load_models(self) -> None:
        """The models' windows and aliases (the status bar, completion). A daemon that refuses
        the listing still gets its session; one that does not answer ends the start at once,
        not after a second wait for the session."""
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
        ws, snapshot, _ = await self.stream.attach(session_id, since=None)
        await self.stream.replace(ws, snapshot["snapshot_at_event_id"])
        self.session_id = session_id
        self.renderer.clear()
        self.confirmations.pending.clear()
        self.turn.mark_over()
        self.ended = False
        self.last_call = None
        self.left_out = 0
        await self.transcript.remove_children()
        self.status.show(below="")
        session = snapshot["session"]
        self.session = session
        self.workspace = session["workspace_path"]
        await self.renderer.show_history()
        earlier = int(session.get("turn_count") or 0)  # a turn still running counts
        if earlier:
            said = (
                f"{counted(earlier, 'turn')}, the last still running"
                if session.get("current_turn_id")
                else counted(earlier, "earlier turn")
            )
            await self.add(Note(Text(f"── resumed: {said} ──"), classes="marker"))
        # the path ends the note's first line: one too long for it wrapped in a directory's name
        room = self.note_width - len(f"session {session_id} on ")
        where = short_path(session["workspace_path"], max(24, min(60, room)))
        self.renderer.instructions = session.get("instructions")
        uses = instructions_note(self.renderer.instructions)
        await self.note(f"session {session_id} on {where}{uses}; /help for commands")
        current = session.get("current_turn_id")
        if current:
            started = self.renderer.started_at.get(current)
            self.turn.mark_running(current, session.get("active_model"), started)
        for request in session.get("pending_confirmations") or []:
            self.confirmations.add(request)
        await self.refresh_status()
        self.stream.start_reading()

    async def switch_to(self, session_id: str, *, at: str | None = None) -> None:
        """Show another session (ending this one if it was never used), at message `at` when
        given (a search result's)."""
        if self.turn.id is not None:
            await self.note("a turn is running: cancel it before switching", error=True)
            return
        unused = await self._unused_session()
        try:
            await self.open_session(session_id)
        except CALL_FAILURES as exc:  # a worker: nothing above catches it
            await self.note(self.call_failed(exc), error=True)
            return
        self.created = False
        if at is not None:
            self.show_message(at)
        await self._end_session(unused)

    def show_message(self, message_id: str) -> None:
        """Scroll the transcript to a stored message and mark it; the transcript then stays
        there until the end is scrolled to again (or something new arrives)."""
        shown = [
            w
            for w in self.transcript.query("UserMessage, AssistantMessage")
            if getattr(w, "message_id", None) == message_id
        ]
        if not shown:
            return
        for widget in self.transcript.query(".found"):
            widget.remove_class("found")
        shown[0].add_class("found")
        self.transcript.release_anchor()
        # once the transcript just filled has been laid out: before, its place is not known
        self.transcript.call_after_refresh(
            self.transcript.scroll_to_widget, shown[0], animate=False, top=True
        )

    def last_reply(self) -> str | None:
        """The newest reply shown, as received so far if it is still streaming (`/copy`)."""
        replies = [w.text for w in self.transcript.query(AssistantMessage) if w.text.strip()]
        return replies[-1] if replies else None

    async def new_session(self) -> None:
        if self.turn.id is not None:
            await self.note(
                "a turn is running: cancel it before starting a new session", error=True
            )
            return
        unused = await self._unused_session()
        before = self.session_id if self.continuable else None
        new = await self._create_session()
        await self.open_session(new)
        self.created = True
        await self._end_session(unused)
        if before is not None and unused is None:  # kept: say where it went
            await self.note(f"session {before} stays active: /sessions goes back to it")

    async def _unused_session(self) -> str | None:
        """The session shown, if this app created it and it never had a turn, from here or
        from elsewhere (`metis run --session`, REST): it is ended on leaving it. The daemon's
        count says; a daemon that cannot say keeps the session."""
        if not self.created or self.ended or self.session_id is None:
            return None
        try:
            session = await self.api.call("GET", f"/sessions/{self.session_id}")
        except CALL_FAILURES:
            return None
        return None if session.get("turn_count") else self.session_id

    async def _end_session(self, session_id: str | None) -> bool:
        if session_id is None:
            return False
        try:
            await self.api.call("DELETE", f"/sessions/{session_id}")
        except CALL_FAILURES:
            return False
        return True

    def call_failed(self, exc: ApiFailure | aiohttp.ClientError | TimeoutError) -> str:
        """A failed call in words, as the other chat client says it; a daemon that did not
        answer in time is named, with the wait."""
        if isinstance(exc, TimeoutError):
            return client.failure_text(exc, self.api.url, self.api.call_timeout_s)
        return error_text(exc)

    @property
    def continuable(self) -> bool:
        """A session was opened and is still active on leaving: `--session` continues it."""
        return bool(self.session) and not self.ended

    def farewell(self) -> str | None:
        """The line printed once the app is gone: how to continue the session, and that its
        turn goes on when one was running (leaving does not cancel it; a question it asks then
        waits for an answer from elsewhere), or was when the stream was lost."""
        if not self.continuable:
            return None
        line = f"`metis chat --session {self.session_id}` continues this session"
        if self.turn.id is not None and self.stream.connected:
            line += " (its turn is still running)"
        elif self.turn.id is not None:  # the daemon cannot say: its turn may have ended
            line += " (its turn was running when the connection to the daemon was lost)"
        return line

    async def refresh_status(self, *, fetch: bool = True) -> None:
        if fetch and self.session_id is not None:
            with contextlib.suppress(*CALL_FAILURES):
                session = await self.api.call("GET", f"/sessions/{self.session_id}")
                self.session = session
        if self.session:
            fields = status_fields(self.session, self.last_call, self.models, self.left_out)
            self.status.show(**fields)

    # input ------------------------------------------------------------------------------------

    def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text.strip()
        if not text:
            return
        if text not in ("/quit", "/exit"):  # leaving is not worth recalling
            self.history.add(message.text.rstrip())
        self.completion.show_hints([])
        self.transcript.scroll_end(animate=False)  # what it brings is read at the end
        command = _is_command(message.text)
        if command and self.slash_commands.knows(text):  # an unknown one is kept to be fixed
            self.prompt.set_text("")
        self.run_worker(self._handle_typed(message.text, command), group="input")

    async def _handle_typed(self, typed: str, command: bool) -> None:
        """Run a command or send a message, after what was typed before it (a `/model` typed
        first applies to the message after it)."""
        async with self._in_order:
            if self.start_failure is not None:
                return
            if command:
                await self.slash_commands.run(typed.strip())
            elif self.ended:
                await self.note("this session ended: /new starts another", error=True)
            elif await self.turn.send(typed.rstrip()) and self.prompt.text == typed:
                self.prompt.set_text("")  # sent: the draft is done with (unless edited meanwhile)

    def on_prompt_input_history_requested(self, message: PromptInput.HistoryRequested) -> None:
        if message.direction < 0:
            entry = self.history.previous(self.prompt.text)
        else:
            entry = self.history.next()
        if entry is not None:
            self.prompt.set_text(entry)

    def on_prompt_input_completion_requested(self, _: PromptInput.CompletionRequested) -> None:
        self.completion.complete()

    def on_prompt_input_scroll_requested(self, message: PromptInput.ScrollRequested) -> None:
        # back at the end, the transcript follows what arrives again (its anchor)
        if message.pages < 0:
            self.transcript.scroll_page_up(animate=False)
        else:
            self.transcript.scroll_page_down(animate=False)

    def on_text_area_changed(self, _: Any) -> None:
        self.completion.text_changed()

    # keys -------------------------------------------------------------------------------------

    def on_key(self, event: events.Key) -> None:
        """A character typed while the focus is in the transcript (Shift+Tab took it there)
        goes to the prompt, and the focus with it: typing is never lost."""
        if self.screen is not self.screen_stack[0] or self.prompt.disabled:
            return
        if self.focused is not self.prompt and event.is_printable and event.character:
            event.stop()
            self.prompt.focus()
            self.prompt.insert(event.character)

    async def action_interrupt(self) -> None:
        """Ctrl-C: cancel the running turn; twice within 2 s quits, a turn running or not (a
        daemon gone mid-turn cannot take the cancel: that must not keep the app open); with
        no session open (start-up failed), once: there is nothing to lose."""
        now = time.monotonic()
        if self.start_failure is not None or now - self._last_ctrl_c <= QUIT_WINDOW_S:
            await self.action_quit_chat()
            return
        self._last_ctrl_c = now
        self.turn.cancel()
        self.notify("press Ctrl-C again to quit", timeout=QUIT_WINDOW_S)

    async def action_cancel_turn(self) -> None:
        """Esc: cancel the running turn; with none, put away the completions listed."""
        if not self.turn.cancel():
            self.completion.show_hints([])

    async def action_quit_chat(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(QUIT_WAIT_S):
                await self.stream.close()
                if await self._end_session(await self._unused_session()):
                    self.ended = True
        self.exit(self.exit_code)

    def action_open_confirmation(self) -> None:
        """Ctrl-O: the question put off; with none waiting, said so (the key did nothing)."""
        if not self.confirmations.pending:
            self.notify("no tool call is waiting for your answer", timeout=QUIT_WINDOW_S)
            return
        self.confirmations.show_next(asked=True)


def _is_command(typed: str) -> bool:
    """A `/name …` line. One whose first word is a path (`/etc/hosts …`), or that starts with
    a space (` /tmp is full`), is a message."""
    return typed.startswith("/") and "/" not in typed.split()[0][1:]


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
    app.run()
    return finish(app)


def finish(app: ChatApp) -> int:
    """Say what the closed screen can no longer say, and give the exit status. After a crash
    (an unhandled exception: Textual printed its traceback, `return_code` 1) there is no
    farewell as if all were well, only how to open the session again."""
    if app.return_code:
        if app.continuable:
            print(
                f"metis: the app stopped on an error; `metis chat --session {app.session_id}` "
                "opens this session again",
                file=sys.stderr,
            )
        return app.return_code
    if app.start_failure is not None:  # the screen that said it is gone: say it where it stays
        print(f"metis: {app.start_failure}", file=sys.stderr)
    farewell = app.farewell()
    if farewell is not None:
        print(f"metis: {farewell}")
    return app.exit_code
