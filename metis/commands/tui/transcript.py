"""The session's events, drawn into the transcript: replies, thinking, tool cards, turn ends.

A session is drawn twice over: from its stored messages when it is opened (or reloaded), then
from the live events of the stream. Both must read the same (a denied call says "denied", not
"failed", either way), and a live event finds the widget the stored history or an earlier event
made (a card by its tool_use_id, a reply by its message id): the drawing and those maps are
kept together here. One handler per event type, found by name (`tool.completed` →
`_on_tool_completed`); an event without one is not shown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine
from typing import Any, Protocol

from rich.text import Text
from textual.containers import VerticalScroll

from metis.commands.client import CALL_FAILURES, DaemonApi, turn_outcome
from metis.commands.run import CUT_OFF, DROPPED, retry_wait
from metis.commands.tui.confirmations import ConfirmationQueue
from metis.commands.tui.turn import RunningTurn
from metis.commands.tui.widgets import (
    FAILED,
    INTERRUPTED,
    OPEN_STATES,
    AssistantMessage,
    Note,
    ThinkingBlock,
    ToolCard,
    UserMessage,
    plain,
)
from metis.wire.counts import turn_totals
from metis.wire.instructions import instructions_label
from metis.wire.messages import text_of, tool_result_text

OUTGROWN_NOTE = (
    "The conversation has outgrown the model's context window: its earliest messages are no "
    "longer sent to the model (the status bar counts them)."
)


class TranscriptHost(Protocol):
    """What of the app drawing the events uses."""

    api: DaemonApi
    session_id: str | None
    workspace: str
    last_call: dict[str, Any] | None
    left_out: int
    ended: bool
    turn: RunningTurn
    confirmations: ConfirmationQueue

    @property
    def transcript(self) -> VerticalScroll: ...

    @property
    def note_width(self) -> int: ...

    async def add(self, widget: Any) -> Any: ...

    def grew(self) -> None: ...

    async def note(self, text: str, *, error: bool = False) -> object: ...

    async def refresh_status(self, *, fetch: bool = True) -> None: ...

    def run_worker(self, work: Coroutine[Any, Any, None], *, group: str) -> object: ...


class TranscriptRenderer:
    """The shown session's widgets by id, and the events and stored messages that fill them."""

    def __init__(self, host: TranscriptHost) -> None:
        self.host = host
        self.replies: dict[str, AssistantMessage] = {}
        self.thinking: dict[str, ThinkingBlock] = {}
        self.cards: dict[str, ToolCard] = {}
        self.instructions: dict[str, Any] | None = None  # the project file last said in use
        self.started_at: dict[str, str] = {}  # stored turns' start (`turn.started` timestamps)
        # the end note of a turn cancelled by no one here, with its totals: said again with why
        # if the session's end comes next (ending a session cancels its turn, as `user_cancel`)
        self._unexplained_cancel: tuple[Note, dict[str, Any]] | None = None

    def clear(self) -> None:
        """The transcript was emptied: no event finds these widgets any more."""
        self.replies.clear()
        self.thinking.clear()
        self.cards.clear()

    # the stored conversation ------------------------------------------------------------------

    async def show_history(self) -> None:
        """The stored conversation: messages, tool cards with their results and durations, and
        the end of each turn that failed or was cancelled, as it read live."""
        host = self.host
        assert host.session_id is not None
        messages = await host.api.all_messages(host.session_id)
        events = await host.api.all_events(
            host.session_id,
            "tool.completed,tool.failed,llm.call_started,llm.call_completed,"
            "tool.confirmation_resolved,turn.started,turn.failed,turn.cancelled",
        )
        self.started_at = {
            e["turn_id"]: e["timestamp"] for e in events if e["type"] == "turn.started"
        }
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
        host.last_call = calls[-1] if calls else None
        fits = [e["payload"] for e in events if e["type"] == "llm.call_started"]
        host.left_out = int(fits[-1].get("messages_left_out") or 0) if fits else 0
        cut_short = {e["turn_id"]: e for e in events if e["type"] in _CUT_SHORT}
        shown_turn = None
        for m in messages:
            if m.get("turn_id") != shown_turn:
                await self._show_stored_end(cut_short.pop(shown_turn, None))
                shown_turn = m.get("turn_id")
            if m["role"] == "user":
                await host.add(UserMessage(text_of(m), m["id"]))
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
                    elif info.get("error_class"):  # as it read live: cancelled, timed out…
                        card.set_state(_failed_label(info["error_class"]), info.get("duration_ms"))
                    elif not info and m.get("turn_id") in cut_short:
                        card.set_state(INTERRUPTED)  # its result is the restart's, as live
                    else:
                        card.set_state(card.state, info.get("duration_ms"))
                    await card.set_result(
                        tool_result_text(block),
                        is_error=bool(block.get("is_error")),
                        exit_code=info.get("exit_code"),
                    )
        await self._show_stored_end(cut_short.pop(shown_turn, None))
        for event in cut_short.values():  # turns that stored no message (in event order)
            await self._show_stored_end(event)

    async def _show_stored_end(self, event: dict[str, Any] | None) -> None:
        if event is not None:
            outcome = turn_outcome(event["type"], event.get("payload") or {})
            line = _turn_line(event.get("payload") or {}, outcome, self.host.note_width)
            await self.host.note(line, error=outcome.startswith("failed"))

    async def _show_stored_reply(self, m: dict[str, Any]) -> None:
        host = self.host
        text = ""
        for block in m.get("content") or []:
            kind = block.get("type")
            if kind == "thinking":
                await host.add(ThinkingBlock(block.get("thinking", ""), live=False))
            elif kind == "text":
                text += block.get("text", "")
            elif kind == "tool_use":
                if text:
                    await host.add(AssistantMessage(m["id"], text))
                    text = ""
                card = ToolCard(block["id"], block.get("name", ""), host.workspace)
                self.cards[block["id"]] = card
                host.confirmations.tool_inputs[block["id"]] = block.get("input") or {}
                await host.add(card)
                card.set_input(block.get("input") or {}, live=False)
        if text:
            self.replies[m["id"]] = await host.add(AssistantMessage(m["id"], text))
        if (m.get("metadata") or {}).get("stop_reason") == "max_tokens":  # as it read live
            await host.add(Note(plain(f"the reply was {CUT_OFF}"), classes="warning"))

    # live events ------------------------------------------------------------------------------

    async def render(self, event: dict[str, Any]) -> None:
        if event.get("type") != "session.ended":  # only the very next event can explain it
            self._unexplained_cancel = None
        handler = getattr(self, "_on_" + event.get("type", "").replace(".", "_"), None)
        if handler is not None:
            await handler(event, event.get("payload") or {})

    async def _on_turn_started(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        turn = self.host.turn
        if not turn.is_new(event["turn_id"]):
            return
        if p.get("user_message_id") and not turn.sending:  # sent elsewhere: not shown yet
            await self._show_prompt(p["user_message_id"])
        turn.mark_running(event["turn_id"], p.get("model"), event.get("timestamp"))

    async def _show_prompt(self, message_id: str) -> None:
        """The prompt of a turn sent from elsewhere (another client, `metis run --session`),
        above its reply: this app drew only those typed in it. Stored before the turn began,
        it is among the newest messages."""
        with contextlib.suppress(*CALL_FAILURES):
            page = await self.host.api.call(
                "GET", f"/sessions/{self.host.session_id}/messages", params={"limit": 20}
            )
            for m in page["messages"]:
                if m["id"] == message_id:
                    await self.host.add(UserMessage(text_of(m), m["id"]))

    async def _on_route_decided(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        if p.get("chosen_model"):
            self.host.turn.model = p["chosen_model"]

    async def _on_message_start(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        # the reply's block is added with its first text: below its thinking, if any
        self.host.turn.model = p.get("model") or self.host.turn.model

    async def _on_text_delta(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        thinking = self.thinking.get(p["message_id"])
        if thinking is not None:  # the reply has begun: the thinking that led to it is over
            thinking.finish()
        reply = self.replies.get(p["message_id"])
        if reply is None or reply is not self.host.transcript.children[-1]:
            # the first text, or text after a tool card: a block at the end, so the
            # transcript reads in order
            reply = self.replies[p["message_id"]] = await self.host.add(
                AssistantMessage(p["message_id"], model=self.host.turn.model)
            )
        reply.append(p.get("text", ""))  # drawn on the next frame; the anchor keeps it in view
        self.host.grew()  # or, scrolled up, the bar says it grows

    async def _on_thinking_delta(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        block = self.thinking.get(p["message_id"])
        if block is None:
            block = self.thinking[p["message_id"]] = await self.host.add(ThinkingBlock())
        block.append(p.get("text", ""))
        self.host.grew()

    async def _on_tool_use_start(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = ToolCard(p["tool_use_id"], p.get("tool_name", ""), self.host.workspace)
        self.cards[p["tool_use_id"]] = card
        await self.host.add(card)

    async def _on_tool_use_end(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = self.cards.get(p["tool_use_id"])
        if p.get("dropped"):  # never made: no input to show, no result to come
            if card is not None:
                card.set_state(DROPPED)
            return
        self.host.confirmations.tool_inputs[p["tool_use_id"]] = p.get("final_input") or {}
        if card is not None:
            card.set_input(p.get("final_input"))

    async def _on_message_complete(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        reply = self.replies.get(p["message_id"])
        note = _stop_note(p.get("stop_reason"))
        if reply is not None:
            reply.finish()
        thinking = self.thinking.get(p["message_id"])
        if thinking is not None:
            thinking.finish()
        if note:  # at the end, in the order things happened (after "cancelling the turn…")
            await self.host.add(Note(plain(note), classes="warning"))

    async def _on_llm_call_started(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        left_out = int(p.get("messages_left_out") or 0)
        if left_out and not self.host.left_out:  # said once, as it begins; then the bar counts
            await self.host.add(Note(plain(OUTGROWN_NOTE), classes="warning"))
        self.host.left_out = left_out

    async def _on_llm_call_completed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        self.host.last_call = p
        await self.host.refresh_status(fetch=False)

    async def _on_llm_call_failed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        if p.get("will_retry"):
            trouble = _LLM_TROUBLE.get(str(p.get("error_class")), "failed")
            await self.host.note(f"{p.get('model')}: {trouble}, retrying{retry_wait(p)}")

    async def _on_tool_called(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            card.set_state("running")

    async def _on_tool_completed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            card.set_state(FAILED if p.get("is_error") else "done", p.get("duration_ms"))
            card.exit_code = p.get("exit_code")
            self.host.run_worker(self._fill_result(card, p), group="results")

    async def _on_tool_failed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            if p.get("error_class") == "user_denied":  # the card says so already, with the reason
                if not card.state.startswith("denied"):
                    card.set_state("denied")
            else:
                card.set_state(_failed_label(str(p.get("error_class"))), p.get("duration_ms"))
            self.host.run_worker(self._fill_result(card, p), group="results")

    async def _on_tool_input_invalid(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            errors = "; ".join(e.get("message", "") for e in p.get("errors", [])[:3])
            card.set_state(f"input invalid: {errors}")

    def interrupt_open_calls(self) -> None:
        """The turn ended under calls that had not: they read `interrupted` (their result, if
        the daemon stored one when it started again, is filled in after)."""
        for card in self.cards.values():
            if card.result is None and card.state in OPEN_STATES:
                card.set_state(INTERRUPTED)

    async def fill_missing_results(self) -> None:
        """Fill the cards of calls that ended without their result shown: its fetch failed (the
        daemon stopped just then). Called once the stream is back."""
        waiting = {i: c for i, c in self.cards.items() if c.result is None}
        if not waiting:
            return
        with contextlib.suppress(*CALL_FAILURES):
            page = await self.host.api.call(
                "GET", f"/sessions/{self.host.session_id}/messages", params={"limit": 50}
            )
            for m in page["messages"]:
                for block in m.get("content") or []:
                    card = waiting.get(block.get("tool_use_id", ""))
                    if block.get("type") == "tool_result" and card is not None:
                        await card.set_result(
                            tool_result_text(block),
                            is_error=bool(block.get("is_error")),
                            exit_code=card.exit_code,
                        )

    async def _fill_result(self, card: ToolCard, p: dict[str, Any]) -> None:
        with contextlib.suppress(*CALL_FAILURES):
            page = await self.host.api.call(
                "GET", f"/sessions/{self.host.session_id}/messages", params={"limit": 50}
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
        self.host.confirmations.add({**p, "turn_id": event.get("turn_id")})

    async def _on_tool_confirmation_resolved(
        self, event: dict[str, Any], p: dict[str, Any]
    ) -> None:
        request_id = str(p["confirmation_request_id"])
        card = self.cards.get(p["tool_use_id"])
        if card is not None:
            card.set_state(_resolved_label(p))
        self.host.confirmations.resolved(request_id)

    async def _on_session_instructions_loaded(
        self, event: dict[str, Any], p: dict[str, Any]
    ) -> None:
        """Said when the file differs from the one the app said was in use (the first turn of a
        session in a daemon's life announces the file again)."""
        shown = self.instructions or {}
        if (p.get("file"), p.get("sha256")) == (shown.get("file"), shown.get("sha256")):
            return
        self.instructions = p if p.get("file") else None
        if p.get("file"):
            await self.host.note(f"project instructions from now on: {instructions_label(p)}")
        else:
            await self.host.note(
                "project instructions: none from now on (no AGENTS.md or CLAUDE.md at the "
                "workspace root)"
            )

    async def _on_session_model_changed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        await self.host.refresh_status()

    async def _on_session_ended(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        self.host.ended = True
        if self._unexplained_cancel is not None:
            note, totals = self._unexplained_cancel
            why = "cancelled: the session was ended elsewhere"
            note.update(Text(_turn_line(totals, why, self.host.note_width)))

    async def _on_turn_completed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        await self._turn_ended(event)

    async def _on_turn_cancelled(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        await self._turn_ended(event)

    async def _on_turn_failed(self, event: dict[str, Any], p: dict[str, Any]) -> None:
        await self._turn_ended(event)

    async def _turn_ended(self, event: dict[str, Any]) -> None:
        for reply in list(self.replies.values()):
            reply.finish()
        for thinking in list(self.thinking.values()):
            thinking.finish()
        outcome = turn_outcome(event["type"], event.get("payload") or {})
        if event["type"] != "turn.completed":
            self.interrupt_open_calls()
        payload = event.get("payload") or {}
        failed = "error" if outcome.startswith("failed") else ""
        line = _turn_line(payload, outcome, self.host.note_width)
        note = await self.host.add(Note(plain(line), classes=failed))
        turn_id = event.get("turn_id")
        if payload.get("reason") == "user_cancel" and not self.host.turn.cancel_asked(turn_id):
            self._unexplained_cancel = (note, payload)
        self.host.turn.finished.add(str(turn_id))
        self.host.confirmations.drop_turn(turn_id)
        if self.host.turn.id == turn_id:
            self.host.turn.mark_over()
        await self.host.refresh_status()


_CUT_SHORT = ("turn.failed", "turn.cancelled")


def _stop_note(stop_reason: str | None) -> str | None:
    """What a reply's end says when it stopped short of what the model meant to write."""
    if stop_reason in ("cancelled", "error"):
        return f"the reply was cut short ({stop_reason})"
    if stop_reason == "max_tokens":
        return f"the reply was {CUT_OFF}"
    return None


def _turn_line(p: dict[str, Any], outcome: str, width: int) -> str:
    """The line a turn's end shows: its outcome, wall time, calls, tools and cost. Too long for
    the note's `width` (a failure's reason, a narrow terminal), the figures go on a line of
    their own: wrapped after the reason, they ended mid-line and read as part of it."""
    seconds = (p.get("wall_time_ms") or 0) / 1000
    figures = f"{seconds:.1f} s · {turn_totals(p)}"
    line = f"turn {outcome} · {figures}"
    return line if len(line) <= width else f"turn {outcome}\n{figures}"


# What went wrong with a model call that is retried, in words (`llm.call_failed`'s error_class)
_LLM_TROUBLE = {
    "rate_limit": "rate limited",
    "server_error": "server error",
    "network": "connection failed",
    "auth": "key refused",
    "context_overflow": "conversation too long",
    "invalid_request": "request refused",
    "content_filter": "content filtered",
}

# A failed tool call's state on its card, in words (the keys are `tool.failed`'s error_class)
_FAILED_BECAUSE = {
    "cancelled": "cancelled",
    "timeout": "timed out",
    "confirmation_timeout": "not answered in time",
    "not_found": "failed: not found",
    "permission_denied": "failed: permission denied",
    "policy_denied": "refused by the tool policy",
    "user_denied": "denied",
    "tool_error": FAILED,
    "internal_error": "failed: an error in metis",
}


def _failed_label(error_class: str) -> str:
    """A failed call's card state (`cancelled`, `timed out`), live or resumed alike."""
    return _FAILED_BECAUSE.get(error_class, f"failed: {error_class}")


def _resolved_label(p: dict[str, Any]) -> str:
    """A tool card's state after a confirmation's answer (`denied: not now`), live or resumed."""
    scope = " for this session" if p.get("scope") == "session" else ""
    reason = f": {p['reason']}" if p.get("reason") else ""
    label = {"allow": "allowed", "deny": "denied"}.get(p["decision"], p["decision"])
    return f"{label}{scope}{reason}"
