"""The transcript's pieces (messages, thinking, tool cards), the prompt and the status bar."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, ClassVar

from markdown_it.token import Token
from rich.console import Console, JustifyMethod
from rich.markdown import Heading, TableDataElement
from rich.markdown import Markdown as RichMarkdown
from rich.syntax import Syntax
from rich.text import Text
from textual import events
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Collapsible, Static, TextArea

from metis.commands.columns import columns
from metis.commands.paths import short_path
from metis.commands.printable import printable
from metis.commands.run import DROPPED
from metis.core.tools.textutil import visible_controls
from metis.wire import tooldisplay
from metis.wire.counts import counted

PREVIEW_LINES = 8
FRAME_S = 1 / 30  # streamed text is drawn at most this often
PIECE_CHARS = 600  # a reply is rendered in pieces of about this much Markdown
DRAW_CHARS = 1200  # at most this much more text is drawn per frame
SLOW_PIECE_CHARS = 2000  # a live piece longer than this (a huge code block) is drawn less often
KEPT_LINES = 1000  # rendered lines of Markdown kept, all replies together (screens of them)
CODE_THEME = "monokai"


def plain(text: str) -> Text:
    """Text from the model, a tool or a file, shown as written: its control characters made
    visible (`\\x1b`), for an escape sequence that reached the terminal would act on it
    (set the clipboard or the window's title, clear the screen); Rich drops only a few."""
    return Text(visible_controls(text))


def plain_code(text: str, lexer: str) -> Syntax:
    """A diff or a command, highlighted, its control characters made visible (`plain`), its
    long lines wrapped: a command cut at the card's edge hid what ran."""
    return Syntax(visible_controls(text), lexer, theme="ansi_dark", word_wrap=True)


class Transcript(VerticalScroll):
    """The conversation, kept at its end as things arrive (Textual's anchor) until it is
    scrolled up to read, or set at a message found by a search."""

    @property
    def following(self) -> bool:
        """Whether the end is kept in view: the anchor not released by a scroll up. Its own
        flag, not the scroll position: a card mounted right after another is below an end
        that Textual scrolls to only on the next refresh."""
        # Textual's own flag, private: read so that a version without it degrades to the
        # anchor alone rather than failing
        return self.is_anchored and not getattr(self, "_anchor_released", False)


class UserMessage(Static):
    """What the user sent (plain text: the user's own words are not rendered as Markdown)."""

    DEFAULT_CSS = """
    UserMessage { margin: 1 0 0 0; padding: 0 1; border-left: thick $accent; color: $text; }
    """

    def __init__(self, text: str, message_id: str | None = None) -> None:
        super().__init__(plain(text))
        self.text = text
        self.message_id = message_id  # a stored prompt's (None: one typed here, not read back)


class RenderedPieces:
    """The rendered lines of recently drawn Markdown pieces (of every view), at most `limit`
    lines in all, the least recently drawn dropped first. An entry is found by view and piece
    and used only if it was rendered from the same text, width and style."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: OrderedDict[tuple[int, int], tuple[tuple[Any, ...], list[Strip]]] = (
            OrderedDict()
        )
        self._lines = 0

    def get(self, key: tuple[int, int], stamp: tuple[Any, ...]) -> list[Strip] | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] != stamp:
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: tuple[int, int], stamp: tuple[Any, ...], lines: list[Strip]) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._lines -= len(old[1])
        self._entries[key] = (stamp, lines)
        self._lines += len(lines)
        while self._lines > self.limit and len(self._entries) > 1:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._lines -= len(dropped)


RENDERED = RenderedPieces(KEPT_LINES)


class MarkdownView(Widget):
    """Markdown as one line-API widget: the text cut at top-level block starts into pieces of
    about PIECE_CHARS, each rendered by Rich on its own, a blank line between them.

    Only the last piece (the live one, still growing) is rendered again as text arrives. The
    others keep their height per width, and their lines only while recently drawn
    (RENDERED, shared by all views): a long transcript then holds few objects for the
    collector to walk, and a layout pass sees one widget per reply, not one per piece.
    """

    DEFAULT_CSS = """
    MarkdownView { height: auto; }
    """

    def __init__(self, text: str) -> None:
        super().__init__()
        self.pieces = split_pieces(text)
        self.settled = len(text) - len(self.pieces[-1])  # where the live piece starts
        self._width = 0  # the width the heights below are for
        self._heights: list[int] = []  # per piece
        self._starts: list[int] = []  # the first line of each piece

    @property
    def source(self) -> str:
        """The text shown."""
        return "".join(self.pieces)

    @property
    def shown(self) -> int:
        """How much of the text is shown."""
        return self.settled + len(self.pieces[-1])

    def show(self, text: str, end: int) -> None:
        """Show more of `text` (which extends what is shown), up to `end`: the pieces that
        became whole are settled; the live piece is rendered now unless more text is waiting
        and whole pieces were settled (text behind the stream is shown a piece at a time, each
        rendered once); the layout is redone only if the height changed."""
        height = self._height() if self._measured() else -1
        settled = len(self.pieces)
        for start in block_starts(text, self.settled, end):
            if start - self.settled >= PIECE_CHARS:
                self._replace_live(text[self.settled : start])
                self.settled = start
                self.pieces.append("")
                if len(self._heights) == len(self.pieces) - 1:
                    self._heights.append(0)
        if end == len(text) or len(self.pieces) == settled:
            self._replace_live(text[self.settled : end])
        if self._measured():
            self._place()
        self.refresh(layout=not self._measured() or self._height() != height)

    def _measured(self) -> bool:
        return bool(self._width) and len(self._heights) == len(self.pieces)

    def _replace_live(self, source: str) -> None:
        last = len(self.pieces) - 1
        if source == self.pieces[last]:
            return
        self.pieces[last] = source
        if self._measured():
            self._heights[last] = len(self._piece_lines(last))

    def _height(self) -> int:
        return self._starts[-1] + self._heights[-1] if self._starts else 0

    def _layout(self, width: int) -> None:
        """Heights and starts of every piece at `width` (pieces not measured yet rendered)."""
        if width != self._width:
            self._width = width
            self._heights.clear()
        if len(self._heights) < len(self.pieces):
            for index in range(len(self._heights), len(self.pieces)):
                self._heights.append(len(self._piece_lines(index)))
            self._place()

    def _place(self) -> None:
        starts = []
        y = 0
        for height in self._heights:
            if height and y:
                y += 1  # the blank line between two pieces
            starts.append(y)
            y += height
        self._starts = starts

    def _piece_lines(self, index: int) -> list[Strip]:
        key = (id(self), index)
        source = self.pieces[index]
        stamp = (source, self._width, self.rich_style)
        lines = RENDERED.get(key, stamp)
        if lines is None:
            lines = self._render_piece(source, self._width)
            RENDERED.put(key, stamp, lines)
        return lines

    def _render_piece(self, source: str, width: int) -> list[Strip]:
        if not source.strip():
            return []
        console = self.app.console
        markdown = LeftMarkdown(visible_controls(source), code_theme=CODE_THEME, hyperlinks=True)
        rendered = console.render_lines(
            markdown, console.options.update(width=width, height=None), style=self.rich_style
        )
        strips = [Strip(line) for line in rendered]
        while strips and _empty(strips[0]):  # e.g. a table's blank top edge
            strips.pop(0)
        while strips and _empty(strips[-1]):
            strips.pop()
        return strips

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._layout(width)
        return self._height()

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        self._layout(width)
        index = bisect_right(self._starts, y) - 1
        if index >= 0:
            lines = self._piece_lines(index)
            row = y - self._starts[index]
            if row < len(lines):
                return lines[row]
        return Strip.blank(width, self.rich_style)  # between two pieces


def _empty(strip: Strip) -> bool:
    """Blank and without a background (a code block's padding row has one)."""
    return not strip.text.strip() and not any(
        segment.style is not None and segment.style.bgcolor is not None for segment in strip
    )


class AssistantMessage(MarkdownView):
    """A reply as Markdown (code blocks highlighted), streamed as deltas arrive: drawn at most
    once a frame however fast the deltas come, a burst over a few frames. One widget: no
    container around it to lay out and paint again as it grows."""

    DEFAULT_CSS = """
    AssistantMessage { height: auto; margin: 1 0 0 0; padding: 0 1; border-left: thick $success; }
    """

    def __init__(self, message_id: str | None, text: str = "", model: str | None = None) -> None:
        super().__init__(text)
        self.message_id = message_id
        self.text = text
        self.model = model
        self._timer: Timer | None = None

    def append(self, fragment: str) -> None:
        """Add streamed text; it is drawn on the next frame."""
        self.text += fragment
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is None and self.is_mounted:
            live = min(len(self.text), self.shown + DRAW_CHARS) - self.settled
            self._timer = self.set_timer(FRAME_S * max(1.0, live / SLOW_PIECE_CHARS), self._draw)

    def _draw(self) -> None:
        """Show up to DRAW_CHARS more of the text: a burst is drawn over a few frames, with
        the app's other work (keys) in between, not in one long render."""
        self._timer = None
        self.show(self.text, min(len(self.text), self.shown + DRAW_CHARS))
        if self.shown < len(self.text):
            self._schedule()

    def finish(self) -> None:
        """The reply is complete: what is not drawn yet is drawn in the next frames."""
        self._schedule()


def warm_up_markdown(console: Console) -> None:
    """Render a little Markdown with a Python block: the parser, the code theme and the lexer
    load now (tens of milliseconds), not in the middle of the first reply."""
    console.render_lines(
        LeftMarkdown("# warm-up\n\n```python\nx = 1\n```\n", code_theme=CODE_THEME),
        console.options.update(width=40, height=None),
    )


class LeftMarkdown(RichMarkdown):
    """Rich's Markdown with every heading on the left, as a chat reads, and a link's address
    after its text when the two differ: a link is clickable only in terminals that take
    hyperlinks (OSC 8), and in the others (tmux as it comes, many over SSH) its address was
    nowhere to be seen."""

    elements = {**RichMarkdown.elements}

    def __init__(self, markup: str, **kwargs: Any) -> None:
        super().__init__(markup, **kwargs)
        for token in self.parsed:
            if token.children:
                token.children = _addresses_shown(token.children)


def _addresses_shown(tokens: list[Token]) -> list[Token]:
    """`tokens` (a block's inline ones) with ` (address)` after each link whose text is not
    its address already (an autolink's is)."""
    shown: list[Token] = []
    href, text = "", ""
    for token in tokens:
        shown.append(token)
        if token.type == "link_open":
            href, text = str(token.attrs.get("href", "")), ""
        elif token.type == "link_close":
            if href and text.strip() not in (href, href.removeprefix("mailto:")):
                shown.append(Token("text", "", 0, content=f" ({href})"))
            href = ""
        elif href:
            text += token.content
    return shown


class _LeftHeading(Heading):
    LEVEL_ALIGN: ClassVar[dict[str, JustifyMethod]] = dict.fromkeys(
        ("h1", "h2", "h3", "h4", "h5", "h6"), "left"
    )


class _FoldedCell(TableDataElement):
    """A table cell whose word is too long for its column goes on over the next lines rather
    than being cut with an ellipsis: at 60 columns a path read `/v1/in…`, and nothing showed
    the rest (the transcript does not scroll sideways)."""

    def __init__(self, justify: JustifyMethod) -> None:
        super().__init__(justify)
        self.content.overflow = "fold"


LeftMarkdown.elements["heading_open"] = _LeftHeading
LeftMarkdown.elements["td_open"] = _FoldedCell
LeftMarkdown.elements["th_open"] = _FoldedCell

_LIST_ITEM = re.compile(r"(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")


def block_starts(text: str, start: int = 0, end: int | None = None) -> Iterator[int]:
    """Offsets after `start` (a block boundary, outside any code fence) where a top-level
    Markdown block starts after a blank line and the line ends before `end`: cut there, the two
    parts render as the whole does (not inside a fence, a list or an indented continuation)."""
    fence = ""
    blank = False
    pos = start
    while (newline := text.find("\n", pos, len(text) if end is None else end)) >= 0:
        line = text[pos:newline]
        if fence:
            stripped = line.strip()
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                fence = ""
        elif not line.strip():
            blank = True
        else:
            if blank and line[0] not in " \t" and not _LIST_ITEM.match(line):
                yield pos
            blank = False
            opening = _FENCE.match(line)
            if opening:
                fence = opening.group(1)
        pos = newline + 1


def split_pieces(text: str) -> list[str]:
    """`text` cut at block starts into pieces of at least PIECE_CHARS (the last may be
    shorter); never empty."""
    pieces: list[str] = []
    settled = 0
    for start in block_starts(text):
        if start - settled >= PIECE_CHARS:
            pieces.append(text[settled:start])
            settled = start
    pieces.append(text[settled:])
    return pieces


class ThinkingBlock(Collapsible):
    """The model's thinking, collapsed: titled `thinking…` while it streams, `thinking` once
    the model has moved on (its reply, the end of its message or turn), so a finished block
    does not read as still under way."""

    DEFAULT_CSS = """
    ThinkingBlock { margin: 1 0 0 0; border: none; padding: 0; background: $surface; }
    ThinkingBlock Static { color: $text-muted; text-style: italic; }
    """

    def __init__(self, text: str = "", *, live: bool = True) -> None:
        self.text = text
        self.body = Static(plain(text))
        self._timer: Timer | None = None
        super().__init__(self.body, title="thinking…" if live else "thinking", collapsed=True)

    def finish(self) -> None:
        self.title = "thinking"

    def append(self, fragment: str) -> None:
        """Add streamed thinking; it is drawn on the next frame."""
        self.text += fragment
        if self._timer is None and self.is_mounted:
            self._timer = self.set_timer(FRAME_S, self._draw)

    def _draw(self) -> None:
        self._timer = None
        self.body.update(plain(self.text))


TITLE_GUTTER = 6
"""Columns of a card's width its title cannot use: the border's corners and the spaces
Textual sets around a title, with one to spare."""

OPEN_STATES = frozenset({"queued", "running", "allowed", "awaiting your answer"})
"""A tool card's states before its call has ended."""
INTERRUPTED = "interrupted"
"""A call whose turn ended before it did (the daemon stopped under it): no end of its own came."""
FAILED = "failed"
"""A call that ran and failed: the tool said so (a file not found, a command's non-zero exit),
in the one word whichever of the daemon's events told it (`tool.failed`, or `tool.completed`
with `is_error`)."""


def _stopped(state: str) -> bool:
    """A call that did not fail but was stopped or never ran (cancelled, interrupted by a
    daemon restart, denied, dropped): its card is not painted as a failure, as the dashboard's
    is not."""
    return state in ("cancelled", INTERRUPTED, DROPPED) or state.startswith("denied")


def took(duration_ms: int) -> str:
    """A call's duration as the turn's end note gives the turn's: in seconds from one second
    on (`1.1 s`, not `1142 ms`), so that two times side by side read in the same unit."""
    return f"{duration_ms} ms" if duration_ms < 1000 else f"{duration_ms / 1000:.1f} s"


class ToolCard(Vertical):
    """One tool call: name, summary, state and duration, then its diff (or its command when
    the title cannot hold it whole) and its result: of each, the first lines, the rest in a
    collapsed section."""

    DEFAULT_CSS = """
    ToolCard { height: auto; margin: 1 0 0 2; padding: 0 1; border: round $primary 60%; }
    ToolCard.error { border: round $error; }
    ToolCard.stopped { border: round $foreground 40%; border-title-color: $foreground 80%; }
    ToolCard.ok { border: round $success 60%; }
    ToolCard > .state { color: $text-muted; }
    ToolCard > .detail { height: auto; }
    ToolCard > .output { color: $text; }
    ToolCard Collapsible { border: none; padding: 0; margin: 0; background: transparent; }
    """

    def __init__(self, tool_use_id: str, name: str, workspace: str | None) -> None:
        super().__init__()
        self.tool_use_id = tool_use_id
        self.name_ = name
        self.workspace = workspace
        self.tool_input: dict[str, Any] | None = None
        self.state = "queued"  # asked for by the model, not yet running
        self.duration_ms: int | None = None
        self.exit_code: int | None = None
        self.result: str | None = None
        self.is_error = False
        self.detail: str | None = None  # the diff or the command shown
        self.caption = name  # the title as written (the border shows it cut to fit)
        self.border_title = Content(visible_controls(name))  # never read as markup
        self._state = Static("", classes="state")
        self._detail = Vertical(classes="detail")
        self._output = Vertical(classes="output")
        self._output.styles.height = "auto"

    def compose(self) -> Any:
        yield self._state
        yield self._detail
        yield self._output

    def on_mount(self) -> None:
        self._refresh_state()

    def _refresh_state(self) -> None:
        parts = [self.state]
        if self.duration_ms is not None:
            parts.append(took(self.duration_ms))
        if self.exit_code is not None:
            parts.append(f"exit {self.exit_code}")
        self._state.update(plain(" · ".join(parts)))  # a denial quotes its reason

    def set_input(self, tool_input: dict[str, Any] | None, *, live: bool = True) -> None:
        """The call's arguments; `live` False for a call read back, whose `write_file` diff
        is left out: against the file as it is now, it would show the write as no change."""
        self.tool_input = tool_input or {}
        line = tooldisplay.summary(self.name_, self.tool_input)
        self.caption = f"{self.name_} {line}".strip()
        self.border_title = Content(visible_controls(self.caption))
        diff = None
        if live or self.name_ != "write_file":
            diff = tooldisplay.file_diff(self.name_, self.tool_input, self.workspace)
        if diff is not None:
            self._show_detail(diff.rstrip("\n"), "diff", "diff")
        elif self.name_ == "shell":
            self._fit_command()

    def _fit_command(self) -> None:
        """A shell command is in the title when the title holds it whole (on one line, at
        the card's width), else in the card's body too: what ran is always readable."""
        command = str((self.tool_input or {}).get("command") or "")
        room = self.size.width - TITLE_GUTTER
        whole = f"{self.name_} {command}" == self.caption and "\n" not in command
        fits = whole and (not self.size.width or columns(visible_controls(self.caption)) <= room)
        if command and not fits:
            self._show_detail(command, "bash", "command")
        elif self.detail is not None:
            self.detail = None
            self._detail.remove_children()

    def on_resize(self) -> None:
        if self.name_ == "shell" and self.tool_input is not None:
            self._fit_command()

    def _show_detail(self, detail: str, lexer: str, kind: str) -> None:
        """The diff or command under the title: its first lines, the rest collapsed."""
        if detail == self.detail:
            return
        self.detail = detail
        preview, hidden = tooldisplay.truncate_lines(detail, PREVIEW_LINES)
        widgets: list[Widget] = [Static(plain_code(preview, lexer))]
        if hidden:
            widgets.append(
                _Whole(
                    Static(plain_code(detail, lexer)),
                    title=f"whole {kind} ({counted(hidden, 'more line', 'more lines')})",
                    collapsed=True,
                )
            )
        self._detail.remove_children()
        self._detail.mount_all(widgets)

    def set_state(self, state: str, duration_ms: int | None = None) -> None:
        self.state = state
        if _stopped(state) and self.result is None:  # one never run has no result to come
            self.add_class("stopped")
        if duration_ms is not None:
            self.duration_ms = duration_ms
        self._refresh_state()

    async def set_result(self, output: str, *, is_error: bool, exit_code: int | None) -> None:
        if self.result is not None:
            return
        self.is_error = is_error
        code, body = tooldisplay.split_exit_code(output)
        self.exit_code = exit_code if exit_code is not None else code
        self.result = body
        self.add_class(("stopped" if _stopped(self.state) else "error") if is_error else "ok")
        if self.state in OPEN_STATES:
            self.state = FAILED if is_error else "done"
        self._refresh_state()
        preview, hidden = tooldisplay.truncate_lines(body, PREVIEW_LINES)
        widgets: list[Any] = [Static(plain(preview or "(no output)"))]
        if hidden:
            widgets.append(
                _Whole(
                    Static(plain(body.rstrip("\n"))),
                    title=f"show all ({counted(hidden, 'more line', 'more lines')})",
                    collapsed=True,
                )
            )
        await self._output.mount_all(widgets)


class _Whole(Collapsible):
    """A card's whole diff, command or output, collapsed under the first lines shown above it:
    opened, it stands in for them (they are hidden, not shown twice), closed, they come back."""

    def watch_collapsed(self, collapsed: bool) -> None:
        if self.parent is not None:
            for preview in self.parent.children:
                if preview is not self:
                    preview.display = collapsed


class Note(Static):
    """A line from metis itself (errors, command output)."""

    DEFAULT_CSS = """
    Note { margin: 1 0 0 0; padding: 0 1; color: $text-muted; }
    Note.error { color: $error; }
    Note.warning { color: $warning; }
    Note.marker { color: $accent; text-style: bold; content-align: center middle; width: 100%; }
    """


class PromptInput(TextArea):
    """The prompt: Enter sends, Shift+Enter / Ctrl+J add a line, ↑/↓ walk the history at the
    first/last line, Tab completes, PageUp / PageDown scroll the transcript."""

    DEFAULT_CSS = """
    PromptInput { height: auto; max-height: 10; min-height: 3; border: round $accent 60%; }
    PromptInput:focus { border: round $accent; }
    """

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class HistoryRequested(Message):
        def __init__(self, direction: int) -> None:
            super().__init__()
            self.direction = direction

    class CompletionRequested(Message):
        pass

    class ScrollRequested(Message):
        """PageUp / PageDown: the transcript is scrolled, not the prompt's few lines."""

        def __init__(self, pages: int) -> None:
            super().__init__()
            self.pages = pages

    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        if key == "enter":
            event.prevent_default()
            event.stop()
            self.post_message(self.Submitted(self.text))
            return
        if key in ("shift+enter", "ctrl+j"):
            event.prevent_default()
            event.stop()
            self.insert("\n")
            return
        if key == "tab":
            event.prevent_default()
            event.stop()
            self.post_message(self.CompletionRequested())
            return
        if key in ("pageup", "pagedown"):
            event.prevent_default()
            event.stop()
            self.post_message(self.ScrollRequested(-1 if key == "pageup" else 1))
            return
        row = self.cursor_location[0]
        if key == "up" and row == 0:
            event.prevent_default()
            event.stop()
            self.post_message(self.HistoryRequested(-1))
            return
        if key == "down" and row == self.document.line_count - 1:
            event.prevent_default()
            event.stop()
            self.post_message(self.HistoryRequested(1))
            return
        await super()._on_key(event)

    def set_text(self, text: str) -> None:
        self.text = text
        last = self.document.line_count - 1
        self.cursor_location = (last, len(self.document.get_line(last)))


class StatusBar(Widget):
    """The connection's state when it is lost (or the session has ended), then model · tokens
    of the last call · context used · session cost · workspace (its path shortened to what the
    line has room for: ~ for the home directory, the middle elided). A narrow line drops the
    tokens first, then the labels, then the context, then the cost; the model and a lost
    connection always show."""

    DEFAULT_CSS = """
    StatusBar { dock: bottom; height: 1; padding: 0 1; background: $panel; color: $text; }
    """

    ORDER = ("connection", "below", "model", "tokens", "context", "cost")
    # what a narrow line leaves out, in turn: (fields dropped, labels kept)
    NARROWER = ((("tokens",), True), (("tokens",), False), (("tokens", "context"), False))
    NARROWEST = (("tokens", "context", "cost"), False)

    def __init__(self) -> None:
        super().__init__(id="status")
        self.fields: dict[str, str] = {}

    def show(self, **fields: str) -> None:
        self.fields.update(fields)
        self.refresh()

    def render(self) -> Text:
        width = self.content_region.width
        present = [name for name in self.ORDER if self.fields.get(name)]
        labels = True
        text = self._line(present, labels=labels)
        for dropped, narrower_labels in (*self.NARROWER, self.NARROWEST):
            if text.cell_len <= width:
                break
            labels = narrower_labels  # the separator before the workspace matches the line's
            text = self._line([n for n in present if n not in dropped], labels=labels)
        if text.cell_len > width:  # narrower still: the state in its first words, for the model
            kept = [n for n in present if n not in self.NARROWEST[0]]
            text = self._line(kept, labels=False, terse=True)
        workspace = self.fields.get("workspace")
        separator = self._separator(labels)
        room = width - text.cell_len - len(separator)
        if workspace and room >= 8:  # last, in the room left (no label: a path reads as one)
            text.append(separator, style="dim")
            text.append(short_path(printable(workspace), room))
        return text

    @staticmethod
    def _separator(labels: bool) -> str:
        return "  │  " if labels else " │ "

    def _line(self, names: list[str], *, labels: bool, terse: bool = False) -> Text:
        """The fields named; `terse`, the connection's state without what follows its colon
        (`disconnected`, not `disconnected: re-attaching…`)."""
        text = Text(no_wrap=True, overflow="ellipsis")
        for name in names:
            if text:
                text.append(self._separator(labels), style="dim")
            if name == "connection":
                state = self.fields[name].partition(":")[0] if terse else self.fields[name]
                text.append(state, style="bold reverse red")
                continue
            if name == "below":  # what arrived while the transcript was scrolled up
                text.append(self.fields[name], style="bold yellow")
                continue
            if labels or name == "context":  # a bare percentage would not say what it is
                text.append(f"{name} ", style="dim")
            text.append(self.fields[name], style="bold" if name in ("model", "cost") else "")
        return text
