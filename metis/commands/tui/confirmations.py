"""The tool calls waiting for the user's answer, asked one dialog at a time.

Requests come from the stream, from a session's snapshot and again after a re-attach; they are
answered here, or elsewhere (another client), or dropped by the turn's end; a dialog closed with
Esc must come back on Ctrl-O. The queue is the one place that knows which questions still stand
and which one is on screen, so none is asked twice or left open after it was settled.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import aiohttp
from textual.screen import Screen
from textual.widget import Widget

from metis.commands.client import ApiFailure, DaemonApi
from metis.commands.failures import failure_text
from metis.commands.tui.screens import ConfirmScreen, Decision
from metis.wire import tooldisplay


class ConfirmationHost(Protocol):
    """What of the app the dialogs and the answers use."""

    api: DaemonApi
    session_id: str | None
    workspace: str

    async def note(self, text: str, *, error: bool = False) -> Widget: ...

    def call_failed(self, exc: ApiFailure | aiohttp.ClientError | TimeoutError) -> str: ...

    def push_screen(self, screen: Screen[Any], callback: Callable[[Any], None]) -> object: ...

    def run_worker(self, work: Coroutine[Any, Any, None], *, group: str) -> object: ...

    def call_later(self, callback: Callable[..., Any], *args: Any) -> bool: ...


class ConfirmationQueue:
    """Open requests by id, oldest first; at most one of them in a dialog."""

    def __init__(self, host: ConfirmationHost) -> None:
        self.host = host
        self.pending: dict[str, dict[str, Any]] = {}  # confirmation requests not yet answered
        self.screen: ConfirmScreen | None = None
        # every tool call's final input, by tool_use_id: the dialog shows the diff it would make
        self.tool_inputs: dict[str, dict[str, Any]] = {}
        # "… is waiting for your answer" notes, by request: removed once the question is gone
        self._hints: dict[str, Widget] = {}

    def add(self, request: dict[str, Any]) -> None:
        request_id = str(request["confirmation_request_id"])
        if request_id in self.pending:
            return
        self.pending[request_id] = request
        self.show_next()

    def show_next(self, *, asked: bool = False) -> None:
        """The next question's dialog; `asked` when opened with Ctrl-O, whose keys answer at
        once (one that opens by itself waits ConfirmScreen.ARMING_S)."""
        if self.screen is not None or not self.pending:
            return
        request = next(iter(self.pending.values()))
        screen = ConfirmScreen(
            request,
            self.tool_inputs.get(request["tool_use_id"]),
            self.host.workspace,
            armed=asked,
        )
        self.screen = screen

        def answered(decision: Decision | None) -> None:
            if self.screen is screen:
                self.screen = None
            if decision is not None:
                self.host.run_worker(self.answer(request, decision), group="answers")
            else:
                self.host.call_later(self._later_hint, request)

        self.host.push_screen(screen, answered)

    def resolved(self, request_id: str) -> None:
        """Answered, here or elsewhere: the question is gone; the next one is asked."""
        self._settled(request_id)
        self._close_dialog(request_id)
        self.show_next()

    def drop_turn(self, turn_id: str | None) -> None:
        """The turn ended: what it asked needs no answer any more."""
        for request_id, request in list(self.pending.items()):
            if request.get("turn_id") == turn_id:
                self._settled(request_id)
                self._close_dialog(request_id)

    def _settled(self, request_id: str) -> None:
        """The question no longer stands: nor does a note saying it waits for an answer."""
        self.pending.pop(request_id, None)
        hint = self._hints.pop(request_id, None)
        if hint is not None:
            hint.remove()

    def _close_dialog(self, request_id: str) -> None:
        screen = self.screen
        if screen is not None and screen.request_id == request_id:
            self.screen = None
            screen.dismiss(None)

    async def _later_hint(self, request: dict[str, Any]) -> None:
        request_id = str(request["confirmation_request_id"])
        if request_id in self.pending and request_id not in self._hints:
            self._hints[request_id] = await self.host.note(
                f"{request.get('tool_name')} is waiting for your answer: Ctrl-O"
            )

    async def answer(self, request: dict[str, Any], decision: Decision) -> None:
        body: dict[str, Any] = {"decision": decision.decision, "scope": decision.scope}
        if decision.reason:
            body["reason"] = decision.reason
        session_id = self.host.session_id
        assert session_id is not None  # a question comes from the shown session's stream
        try:
            await self.host.api.answer_confirmation(
                session_id,
                request["turn_id"],
                request["confirmation_request_id"],
                body,
            )
        except ApiFailure as exc:
            if exc.code == "confirmation_already_resolved":  # elsewhere, or the turn ended
                await self.host.note(tooldisplay.already_settled(request, exc.details))
            else:
                await self.host.note(failure_text(exc), error=True)
        except (aiohttp.ClientError, TimeoutError) as exc:  # the question still stands: Ctrl-O
            await self.host.note(
                f"the answer was not sent: {self.host.call_failed(exc)}; Ctrl-O answers again",
                error=True,
            )
            return
        self._settled(str(request["confirmation_request_id"]))
        self.show_next()
