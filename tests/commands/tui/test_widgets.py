"""The transcript's widgets and the confirmation, mounted in a bare Textual app (Pilot): what
they show of text written by a model, a tool or a file."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from textual.app import App
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Input

from metis.commands.failures import error_text
from metis.commands.tui.screens import ConfirmScreen
from metis.commands.tui.widgets import (
    AssistantMessage,
    StatusBar,
    ThinkingBlock,
    ToolCard,
    UserMessage,
)

# set the clipboard, set the window's title, clear the screen, move the cursor home
ESCAPES = "\x1b]52;c;ZXZpbA==\x1b\\ \x1b]0;PWNED\x07 \x1b[2J\r"


class _Bare(App[None]):
    def __init__(self, *widgets: Widget) -> None:
        super().__init__()
        self.widgets = widgets

    def compose(self) -> Any:
        with VerticalScroll():
            yield from self.widgets


def _shown(widget: Widget) -> str:
    """Every character the widget and those inside it give the terminal for their regions."""
    return "".join(
        segment.text
        for shown in [widget, *widget.query("*")]
        if shown.display and shown.region.height
        for y in range(shown.region.height)
        for segment in shown.render_line(y)
    )


async def test_control_sequences_of_model_and_tool_text_are_shown_not_obeyed() -> None:
    reply = AssistantMessage(None)
    thinking = ThinkingBlock(f"thought {ESCAPES}", live=False)
    card = ToolCard("toolu_1", "shell", None)
    app = _Bare(UserMessage(f"prompt {ESCAPES}"), thinking, reply, card)
    async with app.run_test(size=(120, 60)) as pilot:
        thinking.collapsed = False
        reply.append(f"**reply** {ESCAPES}")
        reply.finish()
        card.set_input({"command": f"printf '{ESCAPES}'\nls"})
        await card.set_result(f"out {ESCAPES}", is_error=False, exit_code=0)
        for _ in range(100):  # the reply is drawn at the next frame (later on a busy machine)
            await pilot.pause(0.05)
            if reply.shown == len(reply.text):
                break
        await pilot.pause()
        shown = _shown(app.screen)
        for seen in ("prompt ", "thought ", "reply ", "printf '", "out "):
            assert seen + "\\x1b]52;c;ZXZpbA==\\x1b\\ \\x1b]0;PWNED\\x07" in shown, seen
        assert not {"\x1b", "\x07", "\r"} & set(shown)


async def test_a_tool_cards_title_is_its_input_as_written_never_markup() -> None:
    inputs = {
        "read_file": {"path": "src/[id]/page.tsx"},
        "shell": {"command": "sed 's/[/]//' f"},  # `[/]` closed no tag: Textual raised
        "grep_files": {"pattern": "[@click=app.quit]x"},
    }
    cards = [ToolCard(f"toolu_{name}", name, None) for name in inputs]
    async with _Bare(*cards).run_test(size=(100, 30)) as pilot:
        for card, tool_input in zip(cards, inputs.values(), strict=True):
            card.set_input(tool_input)
        await pilot.pause()
        titles = [Content.from_markup(card.border_title or "").plain for card in cards]
    assert titles == [
        "read_file src/[id]/page.tsx",
        "shell sed 's/[/]//' f",
        "grep_files [@click=app.quit]x",
    ]


async def test_a_shell_command_the_title_cannot_hold_whole_is_shown_in_the_card() -> None:
    command = "find . -maxdepth 1 -name 'nothing-*' -print | sort | head -n 5 && echo done"
    long, short = ToolCard("toolu_1", "shell", None), ToolCard("toolu_2", "shell", None)
    app = _Bare(long, short)
    async with app.run_test(size=(60, 30)) as pilot:
        long.set_input({"command": command})
        short.set_input({"command": "ls -la"})
        await pilot.pause()
        assert long.detail == command and short.detail is None
        assert "echo done" in _shown(long)  # wrapped, not cut at the card's edge
        await pilot.resize_terminal(200, 30)  # wide enough: the title holds it, once
        await pilot.pause()
        assert long.detail is None and "echo done" not in _shown(long)
        assert Content.from_markup(long.border_title or "").plain == f"shell {command}"


async def test_a_confirmation_on_a_40_by_12_terminal_shows_the_path_and_the_diff(
    tmp_path: Path,
) -> None:
    content = "".join(f"line {i} of the new notes file\n" for i in range(80))
    request = {
        "confirmation_request_id": "conf_1",
        "tool_name": "write_file",
        "side_effects": "write",
        "input_summary": f"Write {len(content):,} bytes to notes/todo.txt",
        "allowed_scopes": ["once", "session"],
    }
    screen = ConfirmScreen(request, {"path": "notes/todo.txt", "content": content}, str(tmp_path))
    app = _Bare()
    async with app.run_test(size=(40, 12)) as pilot:
        app.push_screen(screen)
        await pilot.pause(0.2)
        shown = _shown(screen)
        diff = screen.query_one(VerticalScroll)
        keys = screen.query_one(".keys")
        assert "notes/todo.txt" in shown and "+line 0 of" in shown
        assert diff.region.height >= 3, diff.region
        assert keys.region.bottom <= app.screen.size.height  # the answers still show
        assert "[y] allow once  [a] session" in _shown(keys)


def test_a_call_that_timed_out_is_said_in_words() -> None:
    """The session picker's search says it as the app's other calls do, not `()`."""
    assert error_text(TimeoutError()) == "the daemon did not answer in time"


async def test_a_call_of_a_second_or_more_says_its_time_in_seconds_as_the_turn_does() -> None:
    quick, slow = ToolCard("toolu_1", "read_file", None), ToolCard("toolu_2", "shell", None)
    async with _Bare(quick, slow).run_test(size=(80, 20)) as pilot:
        quick.set_state("done", 42)
        slow.set_state("cancelled", 1142)
        await pilot.pause()
        assert str(quick._state.render()) == "done · 42 ms"
        assert str(slow._state.render()) == "cancelled · 1.1 s"


async def test_denying_shows_the_keys_that_work_while_the_reason_is_typed(
    tmp_path: Path,
) -> None:
    """After `n`, `y` and `a` are letters of the reason: the keys line says Enter denies and
    Esc puts the question off, and the field's hint is whole at 60 columns."""
    request = {
        "confirmation_request_id": "conf_1",
        "tool_name": "shell",
        "side_effects": "execute",
        "command_summary": "make test",
        "allowed_scopes": ["once", "session"],
    }
    screen = ConfirmScreen(request, {"command": "make test"}, str(tmp_path))
    app = _Bare()
    async with app.run_test(size=(60, 20)) as pilot:
        app.push_screen(screen)
        async with asyncio.timeout(5):
            while not screen.armed:
                await pilot.pause(0.05)
        await pilot.press("n")
        await pilot.pause(0.2)
        keys = _shown(screen.query_one(".keys"))
        assert "[Enter] deny" in keys and "[Esc] decide later" in keys and "[y]" not in keys
        reason = screen.query_one("#reason", Input)
        assert "reason for denying (optional)" in _shown(reason)
        await pilot.press(*"yay")
        assert reason.value == "yay" and app.screen is screen


async def test_a_tables_long_words_are_folded_at_60_columns_never_cut() -> None:
    """A reply's table wider than the terminal: a word too long for its column goes on over
    the next lines; cut with an ellipsis (`/v1/in…`), the rest of it showed nowhere."""
    path = "/v1/" + "invoices/" * 10 + "lines"
    reply = AssistantMessage(None)
    app = _Bare(reply)
    async with app.run_test(size=(60, 30)) as pilot:
        reply.append(f"| endpoint | method |\n| --- | --- |\n| {path} | POST |\n")
        reply.finish()
        async with asyncio.timeout(5):
            while reply.shown < len(reply.text):
                await pilot.pause(0.05)
        await pilot.pause()
        lines = ["".join(s.text for s in reply.render_line(y)) for y in range(reply.size.height)]
        assert not any("…" in line for line in lines), lines
        firsts = [line.split()[0] for line in lines if line.strip()]  # the first column's
        start = next(i for i, cell in enumerate(firsts) if cell.startswith("/v1/"))
        assert "".join(firsts[start:]) == path, lines


async def test_a_confirmations_tool_name_is_shown_as_written_never_obeyed() -> None:
    """An MCP server names its tools: the dialog's title shows the name's escape sequences,
    as the card's title does, rather than handing them to the terminal."""
    request = {
        "confirmation_request_id": "conf_1",
        "tool_name": f"mcp_tool{ESCAPES}",
        "side_effects": "execute",
        "input_summary": "{}",
        "allowed_scopes": ["once"],
    }
    screen = ConfirmScreen(request, {}, None)
    app = _Bare()
    async with app.run_test(size=(120, 30)) as pilot:
        app.push_screen(screen)
        await pilot.pause(0.2)
        shown = _shown(screen)
        assert "mcp_tool\\x1b]52;c;ZXZpbA==\\x1b\\ \\x1b]0;PWNED\\x07" in shown
        assert not {"\x1b", "\x07", "\r"} & set(shown)


async def test_at_60_columns_a_lost_connection_leaves_a_long_models_name_whole() -> None:
    """`disconnected: re-attaching…` and a long model's name did not fit 60 columns: the
    name was cut; the state is said in its first word then, and the name shows whole."""
    bar = StatusBar()
    async with _Bare(bar).run_test(size=(60, 10)) as pilot:
        bar.show(
            connection="disconnected: re-attaching…",
            model="anthropic:claude-sonnet-4-6 (routing)",
            cost="$0.003102",
            workspace="/home/me/code/api",
        )
        await pilot.pause()
        shown = str(bar.render())
        assert shown.startswith("disconnected │ anthropic:claude-sonnet-4-6 (routing)"), shown
        await pilot.resize_terminal(120, 10)  # room enough: the whole state
        await pilot.pause()
        assert str(bar.render()).startswith("disconnected: re-attaching…")
