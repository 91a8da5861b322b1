"""Modal screens: a tool call's confirmation and the session picker."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from rich.console import Group
from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.css.scalar import Scalar
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from metis.commands.client import ApiFailure
from metis.commands.failures import error_text
from metis.commands.tui.widgets import plain, plain_code
from metis.core.tools.textutil import visible_controls
from metis.wire import tooldisplay
from metis.wire.counts import counted
from metis.wire.search import where_said
from metis.wire.when import local_time


def fit_scroll(dialog: Widget, scroll: Widget, *, share: float, cap: int) -> None:
    """Give `scroll` (a diff, a list) at most the rows `dialog` has left, at most `share` of
    the screen's height, once its other parts are laid out. A height fixed in CSS overflowed a
    short terminal: the dialog clipped the scroll's end, and what came after it (the keys)."""
    used = dialog.styles.gutter.height + scroll.styles.margin.height
    for child in dialog.children:
        if child is not scroll and child.display:
            used += child.outer_size.height + child.styles.margin.height
    room = max(3, min(cap, int(dialog.screen.size.height * share) - used))
    if scroll.styles.max_height != Scalar.from_number(room):
        scroll.styles.max_height = room


SHORT_SCREEN_ROWS = 20
"""Below this many rows, the confirmation drops its padding and margins: at 12 rows they took
the rows the diff needed, and a write was asked for without a line of it shown."""


NARROW_SCREEN_COLUMNS = 60
"""Below this many columns, the confirmation's keys are said in fewer words."""


@dataclass(frozen=True)
class PickedSession:
    """A session picked in `SessionPicker`, and the message its search result was found at
    (None: not found by words of a message)."""

    session_id: str
    message_id: str | None


@dataclass(frozen=True)
class Decision:
    decision: str  # "allow" | "deny"
    scope: str = "once"  # "once" | "session"
    reason: str | None = None


class ConfirmScreen(ModalScreen[Decision | None]):
    """`y` allow once, `a` allow for this session, `n` deny (then an optional reason), Esc
    decide later. `None` is the result when it is closed without an answer."""

    ARMING_S = 0.5
    """`y`, `a` and `n` this soon after the dialog opened by itself are not answers: it opens
    whenever a call asks, also while a message is being typed, whose next letters (the `a` of
    a word) allowed a call no one had read. Esc, which answers nothing, works at once, and so
    do all keys in a dialog asked for with Ctrl-O (`armed`)."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 90%; max-width: 120; height: auto; max-height: 90%;
        border: thick $warning; background: $surface; padding: 1 2;
    }
    ConfirmScreen .title { text-style: bold; }
    ConfirmScreen VerticalScroll { height: auto; max-height: 24; margin: 1 0; }
    ConfirmScreen .keys { color: $text-muted; }
    ConfirmScreen.arming .keys { text-opacity: 40%; }
    ConfirmScreen #answer { dock: bottom; height: auto; }
    ConfirmScreen Input { display: none; }
    ConfirmScreen Input.asking { display: block; }
    """

    # the diff or command, if any, takes the keys that scroll it; never the hidden reason
    # field, which would swallow y / a / n as text
    AUTO_FOCUS = "VerticalScroll"
    BINDINGS = [
        Binding("y", "allow", "allow once"),
        Binding("a", "allow_session", "allow for this session"),
        Binding("n", "deny", "deny"),
        Binding("escape", "later", "decide later"),
    ]

    def __init__(
        self,
        request: dict[str, Any],
        tool_input: dict[str, Any] | None,
        workspace: str | None,
        *,
        armed: bool = False,
    ) -> None:
        super().__init__()
        self.request = request
        self.request_id = str(request["confirmation_request_id"])
        self.tool_input = tool_input
        self.workspace = workspace
        self.detail = ""  # the diff or the command shown
        self._opened = time.monotonic()  # set again when shown (on_mount)
        self._arming_s = 0.0 if armed else self.ARMING_S  # asked for (Ctrl-O): no wait

    def compose(self) -> Any:
        name = str(self.request.get("tool_name"))
        summary = self.request.get("command_summary") or self.request.get("input_summary") or ""
        with Vertical():
            yield Static(
                Text.assemble(  # an MCP server names its tools: shown as written, never obeyed
                    ("Allow ", "bold"),
                    (visible_controls(name), "bold yellow"),
                    (f" ({visible_controls(str(self.request.get('side_effects')))})?", "bold"),
                ),
                classes="title",
            )
            body = self._body(name)
            if name != "shell" or body is None:  # a shell's summary is the command shown below
                yield Static(plain(str(summary)))
            if body is not None:
                with VerticalScroll():
                    yield Static(body, id="confirm-body")
            # docked at the dialog's foot: a long diff scrolls above them, never hides them
            with Vertical(id="answer"):
                yield Static(self._keys(narrow=False), classes="keys")
                yield Input(placeholder="reason for denying (optional)", id="reason")

    def _keys(self, *, narrow: bool, asking: bool = False) -> Text:
        """Allowing, then the rest, a line each (one line wrapped inside a key's words at 80
        columns: "[n] deny (with a" / "reason)"); in a narrow dialog, in fewer words, so that
        each stays on its line and the diff keeps its rows. While a reason is typed, the keys
        that work then: `y` and `a` are letters of the reason."""
        if asking:
            return Text(
                "[Enter] deny  [Esc] later" if narrow else "[Enter] deny   [Esc] decide later"
            )
        session = "session" in (self.request.get("allowed_scopes") or ["once"])
        if narrow:
            keys = "[y] allow once" + ("  [a] session" if session else "")
            return Text(keys + "\n[n] deny  [Esc] later")
        keys = "[y] allow once" + ("   [a] allow for this session" if session else "")
        return Text(keys + "\n[n] deny (with a reason)   [Esc] decide later")

    def _body(self, name: str) -> Any:
        diff = tooldisplay.file_diff(name, self.tool_input, self.workspace)
        if diff is not None:
            self.detail = diff
            return plain_code(diff.rstrip("\n"), "diff")
        command = (self.tool_input or {}).get("command") or self.request.get("command_summary")
        if name == "shell" and command:
            self.detail = str(command)
            return plain_code(str(command), "bash")
        return None

    def on_mount(self) -> None:
        self._opened = time.monotonic()
        if self._arming_s:  # the keys dimmed until they answer
            self.add_class("arming")
            self.set_timer(self._arming_s, lambda: self.remove_class("arming"))
        self.call_after_refresh(self._fit)

    @property
    def armed(self) -> bool:
        """Whether `y`, `a` and `n` answer yet (ARMING_S)."""
        return time.monotonic() - self._opened >= self._arming_s

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit)

    def _fit(self) -> None:
        dialog = self.query_one(Vertical)
        scrolls = self.query(VerticalScroll)
        # a short terminal: the padding and the diff's margins go, for the diff's first rows
        short = self.size.height < SHORT_SCREEN_ROWS
        dialog.styles.padding = (0, 1) if short else (1, 2)
        narrow = self.size.width < NARROW_SCREEN_COLUMNS
        keys = self._keys(narrow=narrow, asking=self._asking_reason())
        self.query_one(".keys", Static).update(keys)
        if scrolls:  # the dialog takes at most 90% of the screen (its CSS)
            scrolls.first().styles.margin = (0, 0) if short else (1, 0)
            fit_scroll(dialog, scrolls.first(), share=0.9, cap=24)

    def _asking_reason(self) -> bool:
        return self.query_one("#reason", Input).has_class("asking")

    def action_allow(self) -> None:
        if self.armed and not self._asking_reason():
            self.dismiss(Decision("allow"))

    def action_allow_session(self) -> None:
        scopes = self.request.get("allowed_scopes") or ["once"]
        if self.armed and not self._asking_reason() and "session" in scopes:
            self.dismiss(Decision("allow", "session"))

    def action_deny(self) -> None:
        reason = self.query_one("#reason", Input)
        if self.armed and not reason.has_class("asking"):
            reason.add_class("asking")
            reason.focus()
            self.call_after_refresh(self._fit)  # the reason's field takes rows from the diff

    def action_later(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(Decision("deny", "once", event.value.strip() or None))


class SessionPicker(ModalScreen[PickedSession | None]):
    """The active sessions of this workspace, newest first; typing searches them (the daemon's
    search: words of a conversation or its title, or an id's start), Enter switches (to the
    message a result was found at), Esc closes."""

    DEFAULT_CSS = """
    SessionPicker { align: center middle; }
    SessionPicker > Vertical {
        width: 90%; max-width: 110; height: auto; max-height: 80%;
        border: thick $accent; background: $surface; padding: 1 2;
    }
    SessionPicker OptionList { height: auto; max-height: 30; }
    SessionPicker #search { margin-bottom: 1; }
    SessionPicker .keys { color: $text-muted; dock: bottom; }
    """

    BINDINGS = [
        Binding("escape", "close", "close"),
        Binding("down", "move(1)", show=False),
        Binding("up", "move(-1)", show=False),
    ]

    SEARCH_PAUSE_S = 0.2
    """Typing pauses this long before the daemon is asked."""

    def __init__(
        self,
        sessions: list[dict[str, Any]],
        current: str | None,
        search: Callable[[str], Awaitable[list[dict[str, Any]]]],
    ) -> None:
        super().__init__()
        self.sessions = sessions
        self.current = current
        self._search = search
        self._typing: Timer | None = None
        self._query = ""  # the text the sessions shown were found by

    def compose(self) -> Any:
        with Vertical():
            yield Static(Text("Sessions on this workspace", style="bold"))
            yield Input(placeholder="search: words said, or an id", id="search")
            yield OptionList(*self._options(), id="sessions")
            # docked at the foot: a long list scrolls above it, never hides it
            yield Static(Text("type: search   ↑↓ Enter: switch   Esc: close"), classes="keys")

    def on_mount(self) -> None:
        self.query_one(OptionList).highlighted = self._first_choice()
        self.call_after_refresh(self._fit)

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit)

    def _first_choice(self) -> int | None:
        """The row highlighted first: the newest session other than the one shown, which the
        picker is opened to switch to (on the one shown, Enter only closed it), else the
        first; none when nothing is listed."""
        ids = [s["id"] for s in self.sessions]
        if not ids:
            return None
        return next((i for i, sid in enumerate(ids) if sid != self.current), 0)

    def _fit(self) -> None:  # the picker takes at most 80% of the screen (its CSS)
        fit_scroll(self.query_one(Vertical), self.query_one(OptionList), share=0.8, cap=30)

    def _options(self) -> list[Option]:
        if not self.sessions:
            return [Option(Text("no active session matches", style="dim"), disabled=True)]
        options = []
        for s in self.sessions:
            title = visible_controls(s.get("title") or "(no prompt yet)")
            mark = "● " if s["id"] == self.current else "  "
            when = local_time(s.get("created_at"))
            # two lines, each cut (not wrapped) at the list's width: title, then the details
            head = Text(no_wrap=True, overflow="ellipsis")
            head.append(mark, "bold green")
            asks = s.get("pending_confirmation_count", 0)
            if asks:  # a session waiting for its user stands out, before a title cut short
                head.append(f"{asks} to confirm · ", "bold yellow")
            head.append((title.splitlines() or [title])[0], "bold")
            shown = "this session · " if s["id"] == self.current else ""  # what ● means
            details = Text(
                f"  {shown}{when} · {counted(s.get('turn_count') or 0, 'turn')} · {s['id']}",
                style="dim",
                no_wrap=True,
                overflow="ellipsis",
            )
            lines = [head, details]
            said = where_said(s.get("match"))
            if said is not None:  # found by words of a prompt or reply: them, in context
                where, excerpt = said
                context = Text(f"  {where}: ", style="dim", no_wrap=True, overflow="ellipsis")
                context.append(visible_controls(excerpt))
                context.highlight_words(self._query.split(), "bold reverse", case_sensitive=False)
                lines.append(context)
            options.append(Option(Group(*lines), id=s["id"]))
        return options

    def action_move(self, step: int) -> None:
        rows = self.query_one(OptionList)
        if step > 0:
            rows.action_cursor_down()
        else:
            rows.action_cursor_up()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self._typing is not None:
            self._typing.stop()
        text = event.value
        self._typing = self.set_timer(
            self.SEARCH_PAUSE_S,
            lambda: self.run_worker(self._show(text), group="search", exclusive=True),
        )

    async def _show(self, text: str) -> None:
        """The sessions the daemon finds for `text` (all of them for a blank one)."""
        try:
            found = await self._search(text)
        except (ApiFailure, aiohttp.ClientError, TimeoutError) as exc:
            self.notify(error_text(exc), severity="error", markup=False)  # the daemon's words
            return
        self.sessions = found
        self._query = text
        rows = self.query_one(OptionList)
        rows.clear_options()
        rows.add_options(self._options())
        rows.highlighted = self._first_choice()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        rows = self.query_one(OptionList)
        if rows.highlighted is not None and self.sessions:
            self._pick(rows.get_option_at_index(rows.highlighted).id)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self._pick(event.option.id)

    def _pick(self, session_id: str | None) -> None:
        if session_id is None:
            return
        match = next((s.get("match") for s in self.sessions if s["id"] == session_id), None)
        self.dismiss(PickedSession(session_id, (match or {}).get("message_id")))

    def action_close(self) -> None:
        self.dismiss(None)
