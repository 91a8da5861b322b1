"""The transcript's pieces (messages, thinking, tool cards), the prompt and the status bar."""

from __future__ import annotations

from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual import events
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Collapsible, Markdown, Static, TextArea

from metis.commands import tooldisplay

PREVIEW_LINES = 8


class UserMessage(Static):
    """What the user sent (plain text: the user's own words are not rendered as Markdown)."""

    DEFAULT_CSS = """
    UserMessage { margin: 1 0 0 0; padding: 0 1; border-left: thick $accent; color: $text; }
    """

    def __init__(self, text: str) -> None:
        super().__init__(Text(text))
        self.text = text


class AssistantMessage(Vertical):
    """A reply: Markdown (code blocks highlighted), streamed as deltas arrive."""

    DEFAULT_CSS = """
    AssistantMessage { height: auto; margin: 1 0 0 0; padding: 0 1; border-left: thick $success; }
    AssistantMessage > Markdown { margin: 0; padding: 0; }
    AssistantMessage > Markdown > *:last-child { margin-bottom: 0; }
    AssistantMessage > .note { color: $warning; }
    """

    def __init__(self, message_id: str | None, text: str = "", model: str | None = None) -> None:
        super().__init__()
        self.message_id = message_id
        self.text = text
        self.model = model
        self.markdown = Markdown(text)
        self._stream: Any = None

    def compose(self) -> Any:
        yield self.markdown

    async def append(self, fragment: str) -> None:
        self.text += fragment
        if self._stream is None:
            self._stream = Markdown.get_stream(self.markdown)
        await self._stream.write(fragment)

    async def finish(self, note: str | None = None) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        if note:
            await self.mount(Static(note, classes="note"))


class ThinkingBlock(Collapsible):
    """The model's thinking, collapsed."""

    DEFAULT_CSS = """
    ThinkingBlock { margin: 1 0 0 0; border: none; padding: 0; background: $surface; }
    ThinkingBlock Static { color: $text-muted; text-style: italic; }
    """

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.body = Static(Text(text))
        super().__init__(self.body, title="thinking…", collapsed=True)

    def append(self, fragment: str) -> None:
        self.text += fragment
        self.body.update(Text(self.text))


class ToolCard(Vertical):
    """One tool call: name, summary, state and duration, then its diff or command and result
    (the first lines; the rest in a collapsed section)."""

    DEFAULT_CSS = """
    ToolCard { height: auto; margin: 1 0 0 2; padding: 0 1; border: round $primary 60%; }
    ToolCard.error { border: round $error; }
    ToolCard.ok { border: round $success 60%; }
    ToolCard > .state { color: $text-muted; }
    ToolCard > .detail { display: none; }
    ToolCard > .detail.shown { display: block; }
    ToolCard > .output { color: $text; }
    ToolCard Collapsible { border: none; padding: 0; margin: 0; background: transparent; }
    """

    def __init__(self, tool_use_id: str, name: str, workspace: str | None) -> None:
        super().__init__()
        self.tool_use_id = tool_use_id
        self.name_ = name
        self.workspace = workspace
        self.tool_input: dict[str, Any] | None = None
        self.state = "requested"
        self.duration_ms: int | None = None
        self.exit_code: int | None = None
        self.result: str | None = None
        self.is_error = False
        self.border_title = name
        self._state = Static("", classes="state")
        self._detail = Static("", classes="detail")
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
            parts.append(f"{self.duration_ms} ms")
        if self.exit_code is not None:
            parts.append(f"exit {self.exit_code}")
        self._state.update(Text(" · ".join(parts)))

    def set_input(self, tool_input: dict[str, Any] | None) -> None:
        self.tool_input = tool_input or {}
        line = tooldisplay.summary(self.name_, self.tool_input)
        self.border_title = f"{self.name_} {line}".strip()
        diff = tooldisplay.file_diff(self.name_, self.tool_input, self.workspace)
        if diff is not None:
            self._detail.update(Syntax(diff.rstrip("\n"), "diff", theme="ansi_dark"))
        elif self.name_ == "shell" and self.tool_input.get("command"):
            self._detail.update(Syntax(str(self.tool_input["command"]), "bash", theme="ansi_dark"))

    def set_state(self, state: str, duration_ms: int | None = None) -> None:
        self.state = state
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
        self.add_class("error" if is_error else "ok")
        if self.state in ("requested", "running", "allowed"):
            self.state = "error" if is_error else "done"
        self._refresh_state()
        preview, hidden = tooldisplay.truncate_lines(body, PREVIEW_LINES)
        widgets: list[Any] = [Static(Text(preview or "(no output)"))]
        if hidden:
            widgets.append(
                Collapsible(
                    Static(Text(body.rstrip("\n"))),
                    title=f"show all ({hidden} more line(s))",
                    collapsed=True,
                )
            )
        await self._output.mount_all(widgets)


class Note(Static):
    """A line from metis itself (errors, command output)."""

    DEFAULT_CSS = """
    Note { margin: 1 0 0 0; padding: 0 1; color: $text-muted; }
    Note.error { color: $error; }
    """


class PromptInput(TextArea):
    """The prompt: Enter sends, Shift+Enter / Ctrl+J add a line, ↑/↓ walk the history at the
    first/last line, Tab completes."""

    DEFAULT_CSS = """
    PromptInput { height: auto; max-height: 10; min-height: 3; border: round $accent; }
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


class StatusBar(Static):
    """Workspace · model · tokens of the last call · context used · session cost."""

    DEFAULT_CSS = """
    StatusBar { dock: bottom; height: 1; padding: 0 1; background: $panel; color: $text; }
    """

    def __init__(self) -> None:
        super().__init__("", id="status")
        self.fields: dict[str, str] = {}

    def show(self, **fields: str) -> None:
        self.fields.update(fields)
        order = ("model", "tokens", "context", "cost", "workspace")
        text = Text()
        for name in order:
            value = self.fields.get(name)
            if not value:
                continue
            if text:
                text.append("  │  ", style="dim")
            text.append(f"{name} ", style="dim")
            text.append(value, style="bold" if name in ("model", "cost") else "")
        self.update(text)
