"""The turn the daemon runs for the shown session, as far as the app knows.

A message sent over REST starts a turn whose events (even its end) may stream in before the
202 is read, a re-attach or a reload may find it over, and Esc may cancel one the daemon has
already forgotten. The sending, the stream and the keys all ask "is a turn running, which
one?": the answer, the turns whose end was shown (a late event must not revive one) and the
spinner that shows it are kept here, with the two REST calls that start and stop a turn.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from rich.text import Text
from textual.widgets import Static

from metis.commands.client import CALL_FAILURES, ApiFailure, DaemonApi
from metis.commands.failures import TURN_GONE_CODES
from metis.commands.tui.confirmations import ConfirmationQueue
from metis.commands.tui.widgets import Note, UserMessage, plain

if TYPE_CHECKING:  # stream.py names RunningTurn: importing it here at run time is a cycle
    from metis.commands.tui.stream import SessionStream

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class TurnHost(Protocol):
    """What of the app sending and cancelling a turn uses."""

    api: DaemonApi
    session_id: str | None
    stream: SessionStream
    confirmations: ConfirmationQueue

    async def add(self, widget: Any) -> Any: ...

    async def note(self, text: str, *, error: bool = False) -> object: ...

    def call_failed(self, exc: ApiFailure | aiohttp.ClientError | TimeoutError) -> str: ...

    def run_worker(self, work: Coroutine[Any, Any, None], *, group: str) -> object: ...


class RunningTurn:
    """The running turn's id (None when idle), its start and model for the spinner line."""

    def __init__(self, host: TurnHost) -> None:
        self.host = host
        self.id: str | None = None
        self.started = 0.0
        self.model: str | None = None
        self.finished: set[str] = set()  # turns whose end was shown
        self._cancel_asked: str | None = None  # the turn whose cancel is on its way or taken
        self.sending = False  # a message is on its way: a turn starting now is this app's
        # held, not queried: the spinner's timer may fire once more while the app shuts down
        self.spinner = Static("", id="spinner")
        self._tick = 0

    def is_new(self, turn_id: str) -> bool:
        """Neither the turn shown running nor one that was shown to end."""
        return self.id != turn_id and turn_id not in self.finished

    def mark_running(self, turn_id: str, model: str | None, started_at: str | None = None) -> None:
        """Show the turn running; `started_at` (its `turn.started` timestamp) when it began
        before the app saw it, so a resumed turn's time counts from its start, not the attach."""
        self.id = turn_id
        self.started = time.monotonic() - _age_s(started_at)
        self.model = model
        self.spinner.add_class("running")

    def cancel_asked(self, turn_id: str | None) -> bool:
        """Whether this app asked the daemon to cancel that turn (a cancel from elsewhere, or
        the session's end, may say why)."""
        return turn_id is not None and self._cancel_asked == turn_id

    def mark_over(self) -> None:
        self.id = None
        self.spinner.remove_class("running")

    def spin(self) -> None:
        if self.id is None:
            return
        self._tick += 1
        elapsed = time.monotonic() - self.started
        status = f"working {elapsed:.1f} s · {self.model or 'routing…'}"
        queue = self.host.confirmations
        # Ctrl-O is named only while no dialog asks: with one open, it would do nothing
        waiting = bool(queue.pending) and queue.screen is None
        if queue.pending and queue.screen is not None:
            status += " · waiting for your answer"
        self.spinner.update(
            spinner_line(
                SPINNER[self._tick % len(SPINNER)], status, waiting, self.spinner.content_size.width
            )
        )

    async def send(self, text: str) -> bool:
        """Send a message; False (the message shown nowhere but in the prompt, kept there)
        when it was not accepted."""
        host = self.host
        if self.id is not None:
            await host.note("a turn is running: wait for it, or Esc to cancel it", error=True)
            return False
        if not host.stream.connected:
            host.stream.retry_now()
            await host.note(
                "not connected to the daemon: re-attaching, then send again", error=True
            )
            return False
        bubble = await host.add(UserMessage(text))  # before the POST: its reply may be quicker
        self.sending = True
        try:
            accepted = await host.api.call(
                "POST",
                f"/sessions/{host.session_id}/turns",
                {"content": [{"type": "text", "text": text}]},
            )
        except CALL_FAILURES as exc:
            await bubble.remove()
            await host.note(f"not sent: {host.call_failed(exc)}", error=True)
            return False
        finally:
            self.sending = False
        # its events may have arrived (even its end) before the 202 was read
        if self.is_new(accepted["turn_id"]):
            self.mark_running(accepted["turn_id"], accepted.get("model"))
        return True

    def cancel(self) -> bool:
        """Ask the daemon to cancel the running turn, in a worker: the keys go on working while
        it is slow to answer. False when none runs. Asked once: while the cancel is on its way
        or was taken (the turn's end is coming), asking again sends nothing."""
        turn_id = self.id
        if turn_id is None:
            return False
        if self._cancel_asked != turn_id:
            self._cancel_asked = turn_id
            self.host.run_worker(self._cancel(turn_id), group="cancel")
        return True

    async def _cancel(self, turn_id: str) -> None:
        """The cancel call. Its note comes first, so it reads before the turn's own end; a
        failed cancel rewrites it, and may be asked again."""
        note = await self.host.add(Note(Text("cancelling the turn…")))
        try:
            await self.host.api.call(
                "POST", f"/sessions/{self.host.session_id}/turns/{turn_id}/cancel"
            )
        except CALL_FAILURES as exc:
            if isinstance(exc, ApiFailure) and exc.code in TURN_GONE_CODES:
                if self.id == turn_id:  # its end was never streamed: stop waiting for it
                    self.mark_over()
                note.update(Text("the turn is no longer running"))
                return
            self._cancel_asked = None
            note.update(plain(f"could not cancel the turn: {self.host.call_failed(exc)}"))
            note.add_class("error")


def spinner_line(frame: str, status: str, waiting: bool, width: int) -> Text:
    """The running turn's line, cut to the terminal's width by dropping what matters least:
    the cancel hint first, then the long form of "waiting for your answer" (at 80 columns the
    whole line did not fit and ended mid-hint). A width of 0 (not laid out yet) keeps it all."""
    hint = "   Esc / Ctrl-C cancels"
    asks = (" · waiting for your answer (Ctrl-O)", " · answer with Ctrl-O") if waiting else ("",)
    head = f"{frame} "
    for ask in asks:
        for tail in (hint, ""):
            if not width or len(head) + len(status) + len(ask) + len(tail) <= width:
                return Text.assemble((head, "bold"), status + ask, (tail, "dim"))
    return Text.assemble((head, "bold"), status + asks[-1])


def _age_s(timestamp: str | None) -> float:
    """Seconds since an ISO 8601 timestamp of the daemon's (0 when unknown or in the future:
    the two clocks are the same machine's, but a bad value must not show a negative time)."""
    if not timestamp:
        return 0.0
    try:
        then = datetime.fromisoformat(timestamp)
    except ValueError:
        return 0.0
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - then).total_seconds())
