"""`metis chat` as a full-screen app: Textual's Pilot drives `ChatApp` against a real daemon
(offline scripted model). Screenshots of the main screens go to tests/artifacts/."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.containers import Vertical, VerticalScroll
from textual.pilot import Pilot
from textual.widgets import Collapsible, OptionList, Static
from textual.widgets._collapsible import CollapsibleTitle

from metis.commands.daemon_client import resolve_daemon
from metis.commands.tui.app import ChatApp, finish
from metis.commands.tui.screens import ConfirmScreen, Decision, SessionPicker
from metis.commands.tui.slash_commands import COMMANDS, mcp_summary
from metis.commands.tui.transcript import OUTGROWN_NOTE
from metis.commands.tui.widgets import (
    PIECE_CHARS,
    AssistantMessage,
    Note,
    PromptInput,
    ThinkingBlock,
    ToolCard,
    UserMessage,
    block_starts,
    split_pieces,
)
from metis.server.runner import Daemon
from metis.testing import FakeProviderServer, FakeReply
from metis.testing.bench import bench_models_yaml
from tests.api import Api
from tests.core.tools.mcp_servers import MALFORMED, python_server
from tests.e2e.test_long_sessions import MODELS, OUTPUT, SMALL, WINDOW
from tests.e2e.test_turn_endings import CUT_OFF_REPLIES
from tests.helpers import insert_running_turn
from tests.ws_client import SLOW_SCRIPTED

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
SIZE = (110, 40)


def screenshot(app: ChatApp, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    app.save_screenshot(filename=f"{name}.svg", path=str(ARTIFACTS))


async def until(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


@asynccontextmanager
async def attached(app: ChatApp, size: tuple[int, int] = SIZE) -> AsyncIterator[Pilot[None]]:
    """The app running headless, once it reads its session's stream (what every test waits for
    before it types)."""
    async with app.run_test(size=size) as pilot:
        await until(lambda: app.stream.reader is not None)
        yield pilot


@pytest.fixture
def deep(tmp_path: Path) -> Path:
    """A workspace whose path is longer than a narrow terminal has room for."""
    path = tmp_path / "clients" / "acme" / "platform" / "services" / "billing" / "api"
    path.mkdir(parents=True)
    return path


def make_app(d: Daemon, workspace: Path, **kwargs: Any) -> ChatApp:
    target = resolve_daemon()
    return ChatApp(
        d.base_url, target.headers(), workspace=str(workspace), home=target.home, **kwargs
    )


def texts(app: ChatApp, kind: type) -> list[str]:
    return [w.text for w in app.query(kind)]


def notes(app: ChatApp) -> str:
    return "\n".join(str(n.render()) for n in app.query(Note))


async def type_text(pilot: Any, app: ChatApp, text: str) -> None:
    """Type into the prompt and press Enter (the press returns once the app is idle)."""
    app.prompt.focus()
    app.prompt.set_text(text)
    await pilot.press("enter")


def send(app: ChatApp, text: str) -> None:
    """Submit a prompt without waiting for the app to settle (to watch a turn run)."""
    app.prompt.post_message(PromptInput.Submitted(text))


async def restarted(d: Daemon) -> Daemon:
    """A stopped daemon started again on the same home and port, as `metis serve` would be."""
    again = Daemon(d.settings.model_copy(update={"port": d.port}))
    await again.start()
    return again


async def test_a_turn_streams_into_the_transcript_and_the_status_bar_matches_rest(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with app.run_test(size=SIZE) as pilot:
        await until(lambda: app.session_id and app.stream.reader is not None)
        send(app, "hello there, a longer sentence to stream")
        # streaming: part of the reply is shown while the turn runs, with the spinner
        await until(lambda: any(0 < len(t) < 20 for t in texts(app, AssistantMessage)))
        assert app.turn.id is not None
        await pilot.pause(0.2)
        spinner = str(app.query_one("#spinner").render())
        assert "working" in spinner and "local:scripted" in spinner
        screenshot(app, "chat-streaming")
        await until(lambda: app.turn.id is None)
        await pilot.pause()
        assert texts(app, UserMessage) == ["hello there, a longer sentence to stream"]
        assert texts(app, AssistantMessage) == [
            'You said: "hello there, a longer sentence to stream"'
        ]
        assert "turn completed" in notes(app)
        _, session = await api_of(d).call("GET", f"/sessions/{app.session_id}")
        [call] = await api_of(d).events(app.session_id, event_types="llm.call_completed")
        await until(lambda: app.status.fields.get("cost") == f"${session['cost_so_far_usd']}")
        fields = app.status.fields
        assert fields["model"] == f"{session['active_model']} (routing)"
        p = call["payload"]
        assert fields["tokens"] == f"{p['input_tokens']:,} in / {p['output_tokens']:,} out"
        window = 200000
        assert (
            fields["context"] == f"{100 * (p['input_tokens'] + p['output_tokens']) / window:.1f}%"
        )
        screenshot(app, "chat-turn")
        await type_text(pilot, app, "/quit")
    assert app.return_value == 0


async def test_quitting_an_unused_session_ends_it(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await pilot.press("ctrl+c")
        await pilot.press("ctrl+c")  # a second Ctrl-C when idle quits
        await until(lambda: app.return_value is not None)
    _, session = await api_of(d).call("GET", f"/sessions/{app.session_id}")
    assert session["ended_at"] is not None and session["turn_count"] == 0
    assert not app.continuable  # run_app does not offer `--session` for an ended session


async def test_without_a_daemon_the_app_says_so_and_the_prompt_sends_nothing(
    workspace: Path,
) -> None:
    target = resolve_daemon()
    app = ChatApp(
        "http://127.0.0.1:9", target.headers(), workspace=str(workspace), home=target.home
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(lambda: "cannot reach the daemon" in notes(app))
        assert "start it with `metis serve --detach`" in notes(app)
        assert app.prompt.disabled and app.session_id is None
        assert "no session" in str(app.status.render())
        await pilot.press("h", "i", "enter")
        assert not app.query(UserMessage)
        screenshot(app, "no-daemon")
        await pilot.press("ctrl+c")  # once: with no session open there is nothing to lose
    assert app.return_value == 1
    assert app.start_failure is not None and "cannot reach the daemon" in app.start_failure
    assert not app.continuable


CONFIRM_ALL = "tools:\n  confirmation:\n    per_tool: {read_file: prompt}\n"


async def wait_modal(app: ChatApp) -> ConfirmScreen:
    """The confirmation dialog shown, once its keys answer (ConfirmScreen.ARMING_S)."""
    await until(lambda: isinstance(app.screen, ConfirmScreen) and app.screen.is_mounted)
    await until(lambda: bool(app.screen.query(".keys")))
    assert isinstance(app.screen, ConfirmScreen)
    modal = app.screen
    await until(lambda: modal.armed and not modal.has_class("arming"))  # its keys not dimmed
    return modal


async def test_confirmations_y_a_and_n_with_a_reason(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """`use all tools` asks for write_file, patch_file and shell: allow once (the modal shows
    the diff), allow for the session, deny with a reason."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        send(app, "please use all tools")
        modal = await wait_modal(app)
        assert modal.request["tool_name"] == "write_file"
        body = modal.detail
        assert "+++ b/metis-demo.txt" in body and "+conformance" in body
        # the card behind the modal shows the same diff
        card = next(c for c in app.query(ToolCard) if c.name_ == "write_file")
        assert card.detail == body.rstrip("\n")
        assert card.query_one(".detail Static").region.height > 0
        screenshot(app, "confirm-write-file")
        await pilot.press("y")
        modal = await wait_modal(app)
        while modal.request["tool_name"] == "write_file":  # the same modal until it closes
            await pilot.pause(0.05)
            modal = await wait_modal(app)
        assert modal.request["tool_name"] == "patch_file"
        await pilot.press("a")
        await until(
            lambda: (
                isinstance(app.screen, ConfirmScreen) and app.screen.request["tool_name"] == "shell"
            )
        )
        await wait_modal(app)
        assert app.screen.detail == "conformance"
        # the command once, highlighted: not also as the summary line above it
        assert not any("conformance" in str(w.render()) for w in app.screen.query(Static))
        screenshot(app, "confirm-shell")
        await pilot.press("n")
        await pilot.press(*"not here")
        await pilot.press("enter")
        await until(lambda: app.turn.id is None and "turn completed" in notes(app))
        await pilot.pause(0.3)
        cards = {c.name_: c for c in app.query(ToolCard)}
        assert cards["write_file"].result is not None
        await until(lambda: cards["shell"].result is not None)
        assert str(cards["shell"]._state.render()) == "denied: not here"
        screenshot(app, "tool-cards")
    assert await api_of(d).decisions(app.session_id) == [
        ("allow", "once", None),
        ("allow", "session", None),
        ("deny", "once", "not here"),
    ]
    resumed = make_app(d, workspace, session_id=app.session_id)
    async with attached(resumed) as pilot:  # read back, the denial reads the same
        await pilot.pause()
        [shell] = [c for c in resumed.query(ToolCard) if c.name_ == "shell"]
        assert str(shell._state.render()) == "denied: not here"


async def test_keys_typed_as_the_dialog_opens_do_not_answer_it(
    start_daemon: Callable[..., Any],
    workspace: Path,
    api_of: Callable[[Daemon], Api],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A question can open while a message is being typed: the letters that follow at once
    (`a` allowed the tool for the whole session) answer nothing; in the dialog asked for again
    with Ctrl-O, `y` answers at once."""
    monkeypatch.setattr(ConfirmScreen, "ARMING_S", 1.5)  # a loaded machine is slow to look
    d = await start_daemon(config=CONFIRM_ALL)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        send(app, "please use server tool")
        await until(lambda: isinstance(app.screen, ConfirmScreen) and app.screen.is_mounted)
        modal = app.screen
        assert isinstance(modal, ConfirmScreen) and not modal.armed
        assert modal.has_class("arming")  # its keys dimmed meanwhile
        await pilot.press(*"an")
        assert app.screen is modal and not modal.query_one("#reason").has_class("asking")
        await pilot.press("escape")  # answers nothing: at once
        await until(lambda: app.screen is app.screen_stack[0])
        await pilot.press("ctrl+o")  # asked for: its keys answer at once
        await until(lambda: isinstance(app.screen, ConfirmScreen) and app.screen.is_mounted)
        assert app.screen.armed and not app.screen.has_class("arming")
        await pilot.press("y")
        await until(lambda: app.turn.id is None and "turn completed" in notes(app))
    assert await api_of(d).decisions(app.session_id) == [("allow", "once", None)]


async def test_an_answer_given_elsewhere_closes_the_modal(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon(config=CONFIRM_ALL)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        send(app, "please use server tool")
        modal = await wait_modal(app)
        request = modal.request
        status, _ = await api_of(d).answer(
            app.session_id, request["turn_id"], request["confirmation_request_id"]
        )
        assert status == 200
        await until(lambda: not isinstance(app.screen, ConfirmScreen))
        await until(lambda: app.turn.id is None)
        await pilot.pause()
        [card] = app.query(ToolCard)
        assert card.state.startswith("allowed") or card.result is not None
        # an answer that still went out (sent before the event came) says how it was settled
        await app.confirmations.answer(request, Decision("deny"))
        [settled] = [n for n in app.query(Note) if "was already" in str(n.render())]
        assert str(settled.render()) == "read_file was already allowed once"
        assert not settled.has_class("error")


async def test_answering_cancelling_and_sending_unanswered_say_so_and_keep_the_draft(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The daemon stops answering REST while a question is open (a stopped daemon would end
    the turn first): the answer, the cancel and a message each fail with a note, the app
    keeps running, the question stays for Ctrl-O and the typed message stays in the prompt."""
    d = await start_daemon(config=CONFIRM_ALL)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        send(app, "please use server tool")
        await wait_modal(app)
        app.api.url = "http://127.0.0.1:9"  # nothing listens there
        await pilot.press("y")
        await until(lambda: "the answer was not sent" in notes(app))
        assert app.is_running and app.confirmations.pending  # Ctrl-O asks again
        await pilot.press("escape")
        await until(lambda: "could not cancel the turn" in notes(app))
        assert "cancelling the turn…" not in notes(app)  # rewritten, not left standing
        await type_text(pilot, app, "a message nobody receives")
        await until(lambda: "a turn is running" in notes(app))
        assert app.prompt.text == "a message nobody receives"  # the draft is kept
        assert texts(app, UserMessage) == ["please use server tool"]
        screenshot(app, "daemon-unanswered")


async def test_after_a_daemon_restart_the_app_reattaches_and_the_stuck_turn_clears(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """The daemon stops in the middle of a turn and starts again seconds later: the app says
    it is disconnected meanwhile, re-attaches by itself, forgets the turn the restart ended,
    and the next message is answered."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        send(app, "a sentence that takes a while to stream back to the terminal")
        await until(lambda: any(texts(app, AssistantMessage)))
        await d.stop()
        await until(lambda: not app.stream.connected)
        assert "disconnected" in str(app.status.render())
        # said in words, not the close frame's code (server_shutdown)
        await until(lambda: "the daemon stopped: re-attaching…" in notes(app))
        screenshot(app, "disconnected")
        await asyncio.sleep(1.5)  # longer than the old three tries took to give up
        again = await restarted(d)
        try:
            await until(lambda: app.stream.connected, timeout=15)
            await until(lambda: app.turn.id is None)
            assert "re-attached" in notes(app)
            assert not app.status.fields.get("connection")
            await type_text(pilot, app, "after the restart")
            await until(
                lambda: 'You said: "after the restart"' in texts(app, AssistantMessage),
                timeout=20,
            )
            assert app.prompt.text == ""  # accepted: the draft is done with
            await d.stop()  # down again, idle this time: a message waits for the stream
        finally:
            await again.stop()
        await until(lambda: not app.stream.connected)
        await type_text(pilot, app, "while it is down")
        await until(lambda: "not connected to the daemon" in notes(app))
        assert app.prompt.text == "while it is down"
        assert "while it is down" not in texts(app, UserMessage)
        current = app.session_id
        await app.switch_to("sess_picked_before_it_went_down")  # as a /sessions pick does
        said = "cannot reach the daemon: is it running?"
        assert said in notes(app) and app.session_id == current
        assert "Connect call failed" not in notes(app)  # aiohttp's words, not the user's
        third = await restarted(d)
        try:  # a session opened before the old one re-attached: nothing says "disconnected"
            other = await api_of(third).create_session(workspace)
            await app.switch_to(other["id"])
            assert app.session_id == other["id"] and app.stream.connected
            assert not app.status.fields.get("connection")
        finally:
            await third.stop()


async def test_a_cancel_the_daemon_no_longer_knows_clears_the_turn(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The app believes a turn runs that is over for the daemon (its end never streamed):
    Esc says so and frees /new and sending."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "hello")
        await until(lambda: "turn completed" in notes(app))
        app.turn.id = "turn_gone"
        await pilot.press("escape")
        await until(lambda: "the turn is no longer running" in notes(app))
        assert app.turn.id is None
        first = app.session_id
        await type_text(pilot, app, "/new")
        await until(lambda: app.session_id != first and app.stream.reader is not None)


async def test_a_question_put_off_with_esc_is_noted_until_it_is_answered(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(config=CONFIRM_ALL)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        send(app, "please use server tool")
        await wait_modal(app)
        await pilot.pause(0.2)
        spinner = str(app.query_one("#spinner").render())
        assert "waiting for your answer" in spinner and "Ctrl-O" not in spinner  # asked now
        await pilot.press("escape")  # later: the question stays, said in a note
        await until(lambda: "read_file is waiting for your answer: Ctrl-O" in notes(app))
        await pilot.pause(0.2)
        assert "waiting for your answer (Ctrl-O)" in str(app.query_one("#spinner").render())
        await pilot.press("ctrl+o")
        await wait_modal(app)
        await pilot.press("y")
        await until(lambda: app.turn.id is None and "turn completed" in notes(app))
        await pilot.pause(0.1)
        assert "waiting for your answer" not in notes(app)  # answered: the note is gone
        [end] = [n for n in notes(app).splitlines() if n.startswith("turn completed")]
        assert end.endswith(" s · 2 model calls · 1 tool run · $0"), end


async def test_ctrl_o_with_no_question_waiting_says_so(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await pilot.press("ctrl+o")
        said = [n.message for n in app._notifications]
        assert said == ["no tool call is waiting for your answer"]
        assert app.screen is app.screen_stack[0] and app.focused is app.prompt


async def test_escape_cancels_the_running_turn(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        send(app, "a sentence that takes a while to stream back to the terminal")
        await until(lambda: any(texts(app, AssistantMessage)))
        await pilot.press("escape")
        await until(lambda: "turn cancelled · " in notes(app))
        assert app.turn.id is None
        shown = notes(app)
        # in the order it happened: asked to cancel, the reply cut short, the turn's end
        assert (
            shown.index("cancelling the turn…")
            < shown.index("cut short (cancelled)")
            < shown.index("turn cancelled · ")
        )
    cancelled = await api_of(d).events(app.session_id, event_types="turn.cancelled")
    assert [e["payload"]["reason"] for e in cancelled] == ["user_cancel"]


async def test_resuming_shows_the_earlier_conversation(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon()
    api = api_of(d)
    session = await api.create_session(workspace)
    await api.run_turn(session["id"], "first question")
    await api.create_session(workspace)  # created later, but the first one is used after it
    await api.run_turn(session["id"], "please use server tool")
    app = make_app(d, workspace, continue_latest=True)
    async with attached(app) as pilot:
        await pilot.pause()
        assert app.session_id == session["id"]
        assert texts(app, UserMessage) == ["first question", "please use server tool"]
        replies = texts(app, AssistantMessage)
        assert replies[0] == 'You said: "first question"'
        [card] = app.query(ToolCard)
        assert card.name_ == "read_file" and card.result is not None
        assert card.duration_ms is not None
        screenshot(app, "resumed")
        await type_text(pilot, app, "/quit")
    _, after = await api.call("GET", f"/sessions/{session['id']}")
    assert after["ended_at"] is None  # a resumed session is not this app's to end


async def test_slash_commands_model_cost_title_sessions_new_and_export(
    start_daemon: Callable[..., Any],
    workspace: Path,
    api_of: Callable[[Daemon], Api],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    d = await start_daemon()
    api = api_of(d)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        first = app.session_id
        # completion: "/mo" + Tab completes the common prefix, "/model sc" + Tab the alias
        app.prompt.set_text("/mo")
        await pilot.press("tab")
        assert app.prompt.text == "/model"
        app.prompt.set_text("/model sc")
        await pilot.press("tab")
        assert app.prompt.text == "/model scripted "
        await pilot.press("enter")
        await until(lambda: "(pinned)" in app.status.fields.get("model", ""))
        _, session = await api.call("GET", f"/sessions/{first}")
        assert session["sticky_model"] == "local:scripted"
        await type_text(pilot, app, "/model -")
        await until(lambda: "(routing)" in app.status.fields.get("model", ""))
        await type_text(pilot, app, "hello")
        await until(lambda: "turn completed" in notes(app))
        await type_text(pilot, app, "/cost")
        await until(lambda: "session cost $0" in notes(app))
        [end] = [n for n in notes(app).splitlines() if n.startswith("turn completed")]
        assert end.endswith(" s · 1 model call · 0 tools run · $0"), end
        assert " · 1 turn · 1 model call · " in notes(app)
        await type_text(pilot, app, "/models")
        await until(lambda: "local:scripted" in notes(app))
        # the declared models that cannot answer too, each with why
        assert "unset)" in notes(app) or "off (METIS_OFFLINE=1)" in notes(app), notes(app)
        [scripted] = [n for n in notes(app).splitlines() if n.startswith("local:scripted")]
        assert " 200,000 " in scripted, scripted  # the context window, thousands grouped
        assert not any("local:scripted" in t for t in texts(app, AssistantMessage))
        await type_text(pilot, app, "/title My demo session")
        await until(lambda: "title: My demo session" in notes(app))
        _, session = await api.call("GET", f"/sessions/{first}")
        assert session["title"] == "My demo session"
        await type_text(pilot, app, "/export md")
        await until(lambda: "exported to" in notes(app))
        await type_text(pilot, app, f"/export json {tmp_path / 'out.json'}")
        await until(lambda: (tmp_path / "out.json").exists())
        await type_text(pilot, app, "/help")
        await until(lambda: "/sessions" in notes(app))
        screenshot(app, "slash-commands")
        await type_text(pilot, app, "/new")
        await until(lambda: app.session_id != first and app.stream.reader is not None)
        assert texts(app, UserMessage) == []
        await type_text(pilot, app, "/sessions")
        await until(lambda: isinstance(app.screen, SessionPicker))
        await pilot.pause()
        screenshot(app, "session-picker")
        picker = app.screen
        assert isinstance(picker, SessionPicker)
        assert [s["id"] for s in picker.sessions][:2][-1] == first
        options = picker.query_one(OptionList)
        # the first choice is the newest session but the one shown: the one to switch to
        listed = [s["id"] for s in picker.sessions]
        assert app.screen.focused is picker.query_one("#search")
        assert options.highlighted == listed.index(first) == 1
        await pilot.press("up")  # the list moves while the search has the keys
        assert options.highlighted == 0 and listed[0] == app.session_id
        shown = options.get_option_at_index(0).prompt.renderables[1].plain
        assert shown.startswith("  this session · "), shown  # what its ● means
        await pilot.press("down")
        assert options.highlighted == 1
        await pilot.press(*"HELLO")  # searched by the daemon: words of the conversation
        await until(lambda: [s["id"] for s in picker.sessions] == [first])
        # titled otherwise: a third line shows where the words were said
        said = options.get_option_at_index(0).prompt.renderables[2]
        assert said.plain == "  in a prompt: hello"
        screenshot(app, "session-picker-search")
        await pilot.press(*" nowhere")
        await until(lambda: picker.sessions == [])
        await pilot.press("enter")  # nothing to switch to: the picker stays
        assert app.screen is picker and options.option_count == 1
        await pilot.press(*["backspace"] * len(" nowhere"))
        await until(lambda: [s["id"] for s in picker.sessions] == [first])
        await pilot.press("enter")
        await until(lambda: app.session_id == first and app.stream.reader is not None)
        await pilot.pause()
        assert texts(app, UserMessage) == ["hello"]
    assert (tmp_path / f"{first}.md").read_text().startswith("# My demo session")


async def test_mcp_shows_each_server_its_tools_and_why_one_is_not_ready_or_not_whole(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    config = (
        "mcp:\n  restart_initial_seconds: 30\n  servers:\n"
        f"    sloppy: {python_server(MALFORMED)}\n"
        f"    crashes: {python_server('-c', 'import sys; sys.exit(7)')}\n"
    )
    d = await start_daemon(config=config)
    servers = d.core.mcp.servers
    await until(lambda: servers["sloppy"].state == "ready" and servers["crashes"].last_error)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "/mcp")
        await until(lambda: "MCP servers" in notes(app))
        shown = notes(app)
        assert "MCP servers: 2, 1 ready" in shown
        assert "sloppy · ready · stdio · 1 tool" in shown
        assert "mcp__sloppy__good (prompt)" in shown
        assert "tool 'bad' (#1) skipped: not valid MCP" in shown
        assert "crashes · restarting · stdio · 0 tools · restarted 1×" in shown
        assert "last error: the server process exited with status 7" in shown
        # a long detail wraps under its indent (it wrapped to the left edge, as a server would)
        [note] = [n for n in app.query(Note) if "MCP servers" in str(n.render())]
        lines = str(note.render()).splitlines()
        assert len(lines) > 6 and note.region.height == len(lines)
        servers_said = [line for line in lines[1:] if not line.startswith("  ")]
        assert [line.split(" · ")[0] for line in servers_said] == ["sloppy", "crashes"]
        screenshot(app, "slash-mcp")
        # a restart is asked for at once, not after the 30 s backoff; a wrong name is said
        await type_text(pilot, app, "/mcp restart crashes")
        await until(lambda: "MCP server crashes: restarting" in notes(app))
        await until(lambda: servers["crashes"].restarts == 2)
        await type_text(pilot, app, "/mcp restart nowhere")
        await until(lambda: "no MCP server named 'nowhere'" in notes(app))
        await type_text(pilot, app, "/mcp stop crashes")
        await until(lambda: "unknown /mcp use 'stop crashes'" in notes(app))
        # config.yaml edited: the crashing server taken out, applied by a reload
        (d.settings.home / "config.yaml").write_text(
            f"mcp:\n  restart_initial_seconds: 30\n  servers:\n    sloppy: {python_server(MALFORMED)}\n"
        )
        await type_text(pilot, app, "/mcp reload")
        await until(lambda: "MCP servers: 1, 1 ready" in notes(app))
        assert "config.yaml applied: removed crashes" in notes(app)
        assert "crashes" not in servers and servers["sloppy"].restarts == 0


async def test_the_project_instructions_in_use_are_named_and_a_change_is_said(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    (workspace / "AGENTS.md").write_text("Use tabs.\n")
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        assert "; instructions: AGENTS.md; /help for commands" in notes(app)
        await type_text(pilot, app, "hello")
        await until(lambda: "turn completed" in notes(app))
        assert "from now on" not in notes(app)  # the file named at the start, unchanged
        (workspace / "AGENTS.md").unlink()
        (workspace / "CLAUDE.md").write_text("x" * 40_000)
        await type_text(pilot, app, "again")
        await until(lambda: notes(app).count("turn completed") == 2)
        assert (
            "project instructions from now on: CLAUDE.md (too long: the model gets its "
            "beginning)" in notes(app)
        )
        (workspace / "CLAUDE.md").unlink()
        await type_text(pilot, app, "and again")
        await until(lambda: notes(app).count("turn completed") == 3)
        assert "project instructions: none from now on" in notes(app)


def test_mcp_says_when_no_server_is_configured() -> None:
    assert mcp_summary([]) == "no MCP servers configured (config.yaml: mcp.servers)"


def test_a_reply_is_cut_into_pieces_only_between_top_level_blocks() -> None:
    text = (
        "intro paragraph\n\n```python\nx = 1\n\ny = 2\n```\n\n- one\n\n- two\n\n  more of two\n\n"
        "1. first\n\n2. second\n\n# Heading\n\nlast paragraph\n"
    )
    cuts = [text[i:].split("\n", 1)[0] for i in block_starts(text)]
    # never inside a fence, before a list item (it may continue a list) or an indented line
    assert cuts == ["```python", "# Heading", "last paragraph"]
    assert "".join(split_pieces(text * 200)) == text * 200
    assert all(len(piece) >= PIECE_CHARS for piece in split_pieces(text * 200)[:-1])


async def test_a_reply_of_5000_deltas_in_one_burst_reaches_the_transcript_whole(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The provider writes 5,000 text deltas at once (the bench: scripts/bench_tui.py): the
    transcript ends up showing all of the text, rendered in a few pieces, not one per block."""
    text = "".join(
        f"## Part {n}\n\nSome `code` and **bold** text for part {n}.\n\n"
        f"```python\ndef f_{n}() -> int:\n    return {n}\n```\n\n- a\n- b\n\n"
        for n in range(400)
    )[: 5000 * 8]
    async with FakeProviderServer() as fake:
        fake.enqueue("anthropic", FakeReply.say(text, chunk_chars=8, single_write=True))
        d = await start_daemon(models=bench_models_yaml(fake.anthropic_base_url))
        app = make_app(d, workspace)
        async with attached(app) as pilot:
            send(app, "go")
            await until(lambda: app.query(AssistantMessage), timeout=60)
            [reply] = app.query(AssistantMessage)
            # a burst is drawn over several frames: catch one in the middle
            await until(lambda: len(text) // 4 < len(reply.source) < len(text), timeout=60)
            screenshot(app, "long-reply-streaming")
            await until(lambda: "turn completed" in notes(app), timeout=60)
            assert reply.text == text
            await until(lambda: reply.source == text, timeout=60)
            pieces = reply.pieces
            assert len(text) // (2 * PIECE_CHARS) < len(pieces) < len(text) // (PIECE_CHARS // 2)
            await pilot.pause()
            screenshot(app, "long-reply")
            app.transcript.scroll_home(animate=False)  # pieces out of view are rendered again
            await pilot.pause()
            screenshot(app, "long-reply-top")


async def test_prompt_history_survives_a_restart(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """↑ walks back through what was sent (commands too) in an earlier run of the app on the
    same workspace; ↓ returns to the line being typed."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "first prompt")
        await until(lambda: "turn completed" in notes(app))
        await type_text(pilot, app, "/cost")
        await until(lambda: "session cost" in notes(app))
        await type_text(pilot, app, "/quit")
    again = make_app(d, workspace)
    async with attached(again) as pilot:
        again.prompt.focus()
        again.prompt.set_text("draft")
        await pilot.press("up")
        assert again.prompt.text == "/cost"
        await pilot.press("up")
        assert again.prompt.text == "first prompt"
        await pilot.press("up")  # the oldest stays
        assert again.prompt.text == "first prompt"
        await pilot.press("down", "down")
        assert again.prompt.text == "draft"
    other = workspace.parent / "other"  # not tmp_path itself: it holds METIS_HOME
    other.mkdir()
    elsewhere = make_app(d, other)  # another workspace: another history
    async with attached(elsewhere) as pilot:
        elsewhere.prompt.focus()
        await pilot.press("up")
        assert elsewhere.prompt.text == ""


async def test_a_shell_cards_long_output_opens_with_show_all(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The card shows the command and the first lines of its output; the rest is under a
    collapsed "show all", which a click opens (in place of the first lines) and closes."""
    async with FakeProviderServer() as fake:
        fake.enqueue(
            "anthropic",
            FakeReply.call("shell", {"command": "seq 1 30"}),
            FakeReply.say("printed 30 numbers"),
        )
        d = await start_daemon(
            models=bench_models_yaml(fake.anthropic_base_url),
            config="tools:\n  confirmation:\n    per_tool: {shell: auto}\n",
        )
        app = make_app(d, workspace)
        async with attached(app) as pilot:
            send(app, "count to 30")
            await until(lambda: "turn completed" in notes(app), timeout=30)
            [card] = app.query(ToolCard)
            await until(lambda: card.result is not None)
            await pilot.pause()
            assert card.name_ == "shell" and card.exit_code == 0
            assert card.result is not None and card.result.split() == [str(n) for n in range(1, 31)]
            preview = str(card.query(Static).filter(".output Static").first().render())
            assert preview.split() == [str(n) for n in range(1, 9)]
            more = card.query_one(Collapsible)
            assert more.collapsed and more.title == "show all (22 more lines)"
            screenshot(app, "shell-card")
            title = more.query_one(CollapsibleTitle)
            title.scroll_visible(animate=False)  # under the pointer whatever the layout did last
            await pilot.pause()
            assert await pilot.click(title)  # the click landed on the title
            await until(lambda: not more.collapsed)  # a loaded machine may take more than a frame
            await pilot.pause()
            full = more.query_one(Collapsible.Contents).query_one(Static)
            assert str(full.render()).split() == [str(n) for n in range(1, 31)]
            assert full.region.height == 30  # laid out, not clipped
            # the first lines are not shown twice: the whole output stands in for them
            first = card.query(Static).filter(".output Static").first()
            assert not first.display and first.region.height == 0
            screenshot(app, "shell-card-expanded")
            title.scroll_visible(animate=False)  # the grown card may have scrolled it away
            await pilot.pause()
            assert await pilot.click(title)
            await until(lambda: more.collapsed and first.display)


async def test_a_command_that_exits_non_zero_reads_failed_as_any_failed_call(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """A tool that fails says `failed` whichever event tells it: a missing file (`tool.failed`)
    and a command's non-zero exit (`tool.completed`, `is_error`) read alike, not `error` for
    one of them."""
    async with FakeProviderServer() as fake:
        fake.enqueue(
            "anthropic",
            FakeReply.call("read_file", {"path": "missing.txt"}),
            FakeReply.call("shell", {"command": "false"}),
            FakeReply.say("both failed"),
        )
        d = await start_daemon(
            models=bench_models_yaml(fake.anthropic_base_url),
            config="tools:\n  confirmation:\n    per_tool: {shell: auto}\n",
        )
        app = make_app(d, workspace)
        async with attached(app) as pilot:
            send(app, "fail twice")
            await until(lambda: "turn completed" in notes(app), timeout=30)
            cards = {c.name_: c for c in app.query(ToolCard)}
            await until(lambda: all(c.result is not None for c in cards.values()))
            await pilot.pause()
            assert [c.state for c in cards.values()] == ["failed", "failed"]
            shown = str(cards["shell"]._state.render())
            assert shown.startswith("failed · ") and shown.endswith(" · exit 1"), shown
            assert all(c.has_class("error") for c in cards.values())


async def test_a_failed_turns_figures_follow_its_reason_on_a_line_of_their_own(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """A refused key's reason fills lines of an 80-column note: the turn's time, calls and
    cost come on a line of their own, not at the end of the reason's last line."""
    async with FakeProviderServer(expected_keys={"anthropic": "another-key"}) as fake:
        d = await start_daemon(models=bench_models_yaml(fake.anthropic_base_url))
        app = make_app(d, workspace)
        async with attached(app, size=(80, 24)) as pilot:
            send(app, "hello")
            await until(lambda: "turn failed" in notes(app), timeout=30)
            await pilot.pause()
            [note] = [n for n in app.query(Note) if "turn failed" in str(n.render())]
            first, *_, figures = str(note.render()).splitlines()
            assert first.startswith("turn failed: ") and "refused the key" in first
            assert re.fullmatch(r"\d+\.\d s · 1 model call · 0 tools run · \$0", figures), figures
            screenshot(app, "turn-failed-80")


async def test_a_stream_that_cannot_be_replayed_reloads_the_transcript(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """The socket drops and the cursor is no longer replayable (cursor_expired): the app
    subscribes with a snapshot and shows the session afresh, with what it missed."""
    d = await start_daemon()
    api = api_of(d)
    other = await api.create_session(workspace)
    await api.run_turn(other["id"], "elsewhere")
    foreign = (await api.events(other["id"]))[-1]["id"]  # not an event of the app's session
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "first question")
        await until(lambda: "turn completed" in notes(app))
        ws = app.stream.ws
        assert ws is not None
        app.stream.last_event_id = foreign
        await ws.close()  # the reader re-attaches after 0.2 s: meanwhile a turn runs elsewhere
        await api.call(
            "POST",
            f"/sessions/{app.session_id}/turns",
            {"content": [{"type": "text", "text": "missed question"}]},
        )
        await until(lambda: "reloaded the session" in notes(app))
        await until(lambda: texts(app, UserMessage) == ["first question", "missed question"])
        await until(lambda: 'You said: "missed question"' in texts(app, AssistantMessage))
        assert app.stream.ws is not None and app.stream.ws is not ws
        await until(lambda: app.turn.id is None)
        await type_text(pilot, app, "after the reload")  # the new stream is live
        await until(lambda: 'You said: "after the reload"' in texts(app, AssistantMessage))
        assert texts(app, UserMessage).count("first question") == 1


async def test_an_ended_session_is_not_offered_and_opening_one_keeps_the_current_screen(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon()
    api = api_of(d)
    active = await api.create_session(workspace)
    await api.run_turn(active["id"], "still going")
    ended = await api.create_session(workspace)
    await api.run_turn(ended["id"], "all done")
    await api.call("DELETE", f"/sessions/{ended['id']}")
    app = make_app(d, workspace)
    async with attached(app, size=(60, 20)) as pilot:
        await type_text(pilot, app, "hello")
        await until(lambda: "turn completed" in notes(app))
        await type_text(pilot, app, "/sessions")
        await until(lambda: isinstance(app.screen, SessionPicker))
        picker = app.screen
        assert isinstance(picker, SessionPicker)
        assert {s["id"] for s in picker.sessions} == {app.session_id, active["id"]}
        await pilot.pause()
        rows = picker.query_one(OptionList)
        assert rows.virtual_size.height == 2 * len(picker.sessions)  # two lines each, unwrapped
        screenshot(app, "session-picker-narrow")
        await pilot.press("escape")
        # an ended session picked all the same (it ended while the list was open)
        current, reader, before = app.session_id, app.stream.reader, list(app.transcript.children)
        await app.switch_to(ended["id"])
        assert f"session {ended['id']} has ended" in notes(app)
        assert "{" not in notes(app)  # a sentence, not an error envelope
        assert app.session_id == current and app.stream.reader is reader and app.stream.connected
        assert list(app.transcript.children)[: len(before)] == before
        await type_text(pilot, app, "still here")
        await until(lambda: 'You said: "still here"' in texts(app, AssistantMessage))
    direct = make_app(d, workspace, session_id=ended["id"])  # metis chat --session <ended>
    async with direct.run_test(size=SIZE):
        await until(lambda: f"session {ended['id']} has ended" in notes(direct))
        assert direct.prompt.disabled
    assert not direct.continuable


async def test_a_session_picked_from_a_search_opens_at_the_message_found(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon()
    api = api_of(d)
    long = await api.create_session(workspace)
    for n in range(24):
        await api.run_turn(long["id"], "the zephyr cache again" if n == 2 else f"step {n}")
    app = make_app(d, workspace)
    async with attached(app, size=(80, 24)) as pilot:
        await type_text(pilot, app, "/sessions")
        await until(lambda: isinstance(app.screen, SessionPicker))
        await pilot.press(*"zephyr")
        picker = app.screen
        assert isinstance(picker, SessionPicker)
        await until(lambda: [s["id"] for s in picker.sessions] == [long["id"]])
        await pilot.press("enter")
        await until(lambda: [w for w in app.query(UserMessage) if w.has_class("found")])
        [found] = [w for w in app.query(UserMessage) if w.has_class("found")]
        assert found.text == "the zephyr cache again"

        def in_view() -> bool:
            top = app.transcript.scroll_y
            return top <= found.virtual_region.y < top + app.transcript.size.height

        await until(in_view)
        await pilot.pause()
        assert in_view() and app.transcript.scroll_y < app.transcript.max_scroll_y  # not the end
        screenshot(app, "session-opened-at-a-match")


async def test_thinking_comes_before_the_reply_it_leads_to(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """Live as when read back: the thinking block, then the reply in one piece below it."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "think about this")
        await until(lambda: bool(app.query(ThinkingBlock)))
        if not app.query(AssistantMessage):  # still thinking
            assert app.query_one(ThinkingBlock).title == "thinking…"
        await until(lambda: "turn completed" in notes(app), timeout=20)
        await pilot.pause()
        live = [type(w).__name__ for w in app.transcript.children]
        assert live[-3:] == ["ThinkingBlock", "AssistantMessage", "Note"]
        [reply] = texts(app, AssistantMessage)
        assert reply == 'You said: "think about this"'
        # over: its title no longer reads as under way (it kept "thinking…")
        assert app.query_one(ThinkingBlock).title == "thinking"
    resumed = make_app(d, workspace, session_id=app.session_id)
    async with attached(resumed):
        kinds = [type(w).__name__ for w in resumed.transcript.children]
        assert kinds[: len(live) - 2] == [k for k in live if k != "Note"][: len(live) - 2]
        assert kinds.index("ThinkingBlock") < kinds.index("AssistantMessage")
        assert resumed.query_one(ThinkingBlock).title == "thinking"


async def test_typing_a_slash_lists_every_command_on_its_own_line(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app, size=(60, 20)) as pilot:
        app.prompt.focus()
        await pilot.press("/")
        await pilot.pause()
        hints = app.query_one("#hints", Static)
        shown = str(hints.render())
        assert [line.split()[0] for line in shown.splitlines() if line.startswith("/")] == list(
            COMMANDS
        )
        assert hints.region.height >= len(COMMANDS)  # none cut off
        screenshot(app, "hints-narrow")


async def test_a_short_narrow_terminal_lists_the_commands_one_a_line_and_keeps_the_prompt(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """At 50 columns most commands' descriptions do not fit: each is cut, not wrapped (the
    wrapped list pushed the prompt off the screen); shorter still, the list is cut first."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app, size=(50, 20)) as pilot:
        app.prompt.focus()
        await pilot.press("/")
        await pilot.pause()
        hints = app.query_one("#hints", Static)
        assert hints.region.height == len(COMMANDS)  # one line each
        lines = [strip.text for strip in hints.render_lines(hints.region.reset_offset)]
        assert [line.split()[0] for line in lines] == list(COMMANDS)
        assert lines[0].rstrip().endswith("…")

        def prompt_shown() -> bool:
            prompt, status = app.prompt.region, app.status.region
            return (
                prompt.height >= 3
                and hints.region.bottom <= prompt.y < prompt.bottom <= (status.y) < app.size.height
            )

        assert prompt_shown()
        screenshot(app, "hints-short")
        await pilot.resize_terminal(50, 12)
        await pilot.pause()
        assert 0 < hints.region.height < len(COMMANDS) and prompt_shown()


async def test_a_narrow_status_bar_keeps_model_cost_and_context(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)  # a model with a context window
    app = make_app(d, workspace)
    async with attached(app, size=(60, 20)) as pilot:
        await type_text(pilot, app, "hello")
        await until(lambda: app.status.fields.get("context"))
        await pilot.pause()
        line = str(app.status.render())
        assert "local:scripted" in line and "$0" in line and "context " in line
        assert " in / " not in line  # the tokens are the first to go
        assert len(line) <= app.status.content_region.width


async def test_export_refuses_an_unknown_format_and_ctrl_p_opens_nothing(
    start_daemon: Callable[..., Any],
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "/export txt")
        await until(lambda: "unknown export format txt" in notes(app))
        assert not (tmp_path / "txt").exists()
        await pilot.press("ctrl+p")  # Textual's command palette would quit past /quit
        await pilot.pause()
        assert app.screen is app.screen_stack[0]


async def test_export_to_an_existing_directory_writes_the_default_name_inside_it(
    start_daemon: Callable[..., Any],
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`/export exports` and `/export ~` name directories (no trailing `/` needed); a bare word
    that is no directory is still refused as a format."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "exports").mkdir()
    (tmp_path / "home").mkdir()
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        name = f"{app.session_id}.md"
        await type_text(pilot, app, "/export exports")
        await until(lambda: f"exported to {tmp_path / 'exports' / name}" in notes(app))
        await type_text(pilot, app, "/export json ~")
        await until(lambda: "exported to" in notes(app).splitlines()[-1])
        assert (tmp_path / "home" / f"{app.session_id}.json").is_file()
        await type_text(pilot, app, "/export nodir")
        await until(lambda: "unknown export format nodir" in notes(app))
        assert not (tmp_path / "nodir").exists()


async def test_copy_puts_the_last_reply_or_its_code_blocks_on_the_clipboard(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "/copy")
        await until(lambda: "no reply to copy yet" in notes(app))
        await type_text(pilot, app, "try\n\n```sh\nls -la\n```\n\nand\n\n```\necho done\n```\n\nok")
        await until(lambda: "turn completed" in notes(app))
        reply = texts(app, AssistantMessage)[-1]
        app.prompt.set_text("/copy c")
        await pilot.press("tab")
        assert app.prompt.text == "/copy code "  # as a unique completion always ends
        await pilot.press("enter")
        await until(lambda: "copied the 2 code blocks of the last reply" in notes(app))
        assert app.clipboard == "ls -la\n\necho done"
        await type_text(pilot, app, "/copy")
        await until(lambda: "copied the last reply to the clipboard (13 lines)" in notes(app))
        assert app.clipboard == reply and reply.startswith('You said: "try')
        screenshot(app, "copy")
        await type_text(pilot, app, "/copy all")
        await until(lambda: "unknown /copy use 'all'" in notes(app))
        await type_text(pilot, app, "plain words")
        await until(lambda: notes(app).count("turn completed") == 2)
        await type_text(pilot, app, "/copy code")
        await until(lambda: "the last reply has no code block" in notes(app))
        assert app.clipboard == reply


async def test_resuming_marks_the_earlier_turns(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon()
    api = api_of(d)
    session = await api.create_session(workspace)
    await api.run_turn(session["id"], "one")
    await api.run_turn(session["id"], "two")
    app = make_app(d, workspace, session_id=session["id"])
    async with attached(app):
        markers = [str(n.render()) for n in app.query(".marker")]
        assert markers == ["── resumed: 2 earlier turns ──"]
        # the marker sits below the earlier conversation
        children = list(app.transcript.children)
        assert children.index(app.query_one(".marker")) > children.index(
            app.query(AssistantMessage).last()
        )
    fresh = make_app(d, workspace)
    async with attached(fresh):
        assert not fresh.query(".marker")


async def test_a_resumed_running_turn_counts_its_time_from_its_start_not_the_attach(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)
    api = api_of(d)
    sid = (await api.create_session(workspace))["id"]
    status, accepted = await api.submit(sid, "a reply long enough to still run " * 24)
    assert status == 202
    await asyncio.sleep(1.2)
    app = make_app(d, workspace, session_id=sid)
    async with attached(app) as pilot:
        assert app.turn.id == accepted["turn_id"]
        markers = [str(n.render()) for n in app.query(".marker")]
        assert markers == ["── resumed: 1 turn, the last still running ──"]
        await pilot.pause(0.2)
        spinner = str(app.query_one("#spinner").render())
        elapsed = float(spinner.split("working ", 1)[1].split(" s", 1)[0])
        assert elapsed >= 1.2, spinner


async def test_resuming_shows_how_each_turn_that_did_not_complete_ended(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """A turn cancelled and a turn a crash left running (failed by the next start's recovery)
    end, in the resumed transcript, with the line they had live, below their own messages."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    api = api_of(d)
    sid = (await api.create_session(workspace))["id"]
    status, accepted = await api.submit(sid, "a reply long enough to cancel " * 8)
    assert status == 202
    await api.call("POST", f"/sessions/{sid}/turns/{accepted['turn_id']}/cancel")
    await d.core.turns.wait_all()
    await api.run_turn(sid, "completed after it")
    await insert_running_turn(d.core.db, sid)  # as a crash leaves a turn (no message stored)
    await d.stop()
    again = await restarted(d)
    try:
        app = make_app(again, workspace, session_id=sid)
        async with attached(app):
            shown = [
                w
                for w in app.transcript.children
                if isinstance(w, (UserMessage, Note)) and "marker" not in w.classes
            ]
            lines = [str(w.render()) if isinstance(w, Note) else "you" for w in shown]
            assert lines[0] == "you" and lines[1].startswith("turn cancelled · ")
            assert lines[2] == "you" and "completed" not in "".join(lines)
            assert lines[3].startswith("turn failed: metis stopped while this turn was running · ")
            assert "error" in shown[3].classes
            screenshot(app, "resumed-turn-ends")
    finally:
        await again.stop()


async def test_the_status_bar_fits_the_workspace_in_a_narrow_terminal(
    start_daemon: Callable[..., Any], deep: Path
) -> None:
    d = await start_daemon()
    app = make_app(d, deep)
    async with attached(app, size=(90, 20)) as pilot:
        await pilot.pause()
        line = str(app.status.render())
        assert line.rstrip().endswith("/billing/api") and "…" in line
        assert len(line) <= app.status.content_region.width
        screenshot(app, "status-narrow")


async def test_at_80_columns_the_workspace_is_set_off_like_the_other_fields(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The tokens make the line too long for 80 columns: they go, the labels stay, and the
    workspace's separator is the labelled line's (it was the narrow one, ` │ `)."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with attached(app, size=(80, 24)) as pilot:
        await type_text(pilot, app, "hello")
        await until(lambda: app.status.fields.get("context"))
        await pilot.pause()
        line = str(app.status.render())
        assert "context " in line and " in / " not in line
        assert line.count("│") == line.count("  │  ") == 3, line


async def test_page_up_and_down_scroll_the_transcript_from_the_prompt(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The prompt keeps the focus, so PageUp / PageDown would move in its few lines: they
    scroll the transcript, and back at its end it follows the next reply again."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app, size=(80, 24)) as pilot:
        for i in range(1, 7):
            await type_text(pilot, app, f"message {i}")
            await until(lambda done=i: notes(app).count("turn completed") == done)
        await until(lambda: app.transcript.max_scroll_y > 0)
        bottom = app.transcript.max_scroll_y
        await until(lambda: app.transcript.scroll_y == bottom)
        await pilot.press("pageup")
        await until(lambda: app.transcript.scroll_y < bottom)
        assert app.focused is app.prompt and app.prompt.text == ""
        await pilot.press("pagedown")
        await until(lambda: app.transcript.scroll_y == bottom)
        await type_text(pilot, app, "one more")
        await until(lambda: notes(app).count("turn completed") == 7)
        await until(lambda: app.transcript.scroll_y == app.transcript.max_scroll_y > bottom)


async def test_scrolled_up_the_transcript_stays_put_as_cards_arrive_until_a_message_is_sent(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """Each tool card and note that arrived scrolled the transcript to its end, taking away
    the page being read; it now stays, and sending a message brings the end back."""
    async with FakeProviderServer() as fake:
        fake.enqueue("anthropic", FakeReply.say("\n\n".join(f"paragraph {i}" for i in range(40))))
        d = await start_daemon(
            models=bench_models_yaml(fake.anthropic_base_url),
            config="tools:\n  confirmation:\n    per_tool: {shell: auto}\n",
        )
        app = make_app(d, workspace)
        async with attached(app, size=(80, 24)) as pilot:
            await type_text(pilot, app, "a long reply")
            await until(lambda: notes(app).count("turn completed") == 1, timeout=30)
            calls = [FakeReply.call("shell", {"command": "sleep 0.3"}) for _ in range(2)]
            fake.enqueue("anthropic", *calls, FakeReply.say("done"))
            send(app, "two slow calls")
            await until(lambda: len(app.query(ToolCard)) == 1, timeout=30)
            await pilot.press("pageup")
            transcript = app.transcript
            await until(lambda: transcript.scroll_y < transcript.max_scroll_y)
            reading = transcript.scroll_y
            await until(lambda: notes(app).count("turn completed") == 2, timeout=30)
            await pilot.pause()
            assert len(app.query(ToolCard)) == 2
            assert transcript.scroll_y == reading < transcript.max_scroll_y  # not pulled down
            fake.enqueue("anthropic", FakeReply.say("here"))
            await type_text(pilot, app, "and now?")
            await until(lambda: notes(app).count("turn completed") == 3, timeout=30)
            await until(lambda: transcript.scroll_y == transcript.max_scroll_y)


async def test_what_arrives_below_a_transcript_scrolled_up_is_said_on_the_status_bar(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """Scrolled up, the transcript stays put: a turn sent from elsewhere (nothing typed here
    to bring the end back) is said on the bar until the end is scrolled to."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app, size=(80, 24)) as pilot:
        for i in range(4):
            await type_text(pilot, app, f"message {i}")
            await until(lambda done=i: notes(app).count("turn completed") == done + 1)
        await pilot.press("pageup")
        await until(lambda: app.transcript.scroll_y < app.transcript.max_scroll_y)
        assert not app.status.fields.get("below")
        await api_of(d).run_turn(str(app.session_id), "from elsewhere")
        await until(lambda: notes(app).count("turn completed") == 5)
        assert "↓ more below" in str(app.status.render())
        assert app.transcript.scroll_y < app.transcript.max_scroll_y
        screenshot(app, "more-below-80")
        await pilot.resize_terminal(60, 20)  # the model still shows whole beside it
        await pilot.pause()
        bar = str(app.status.render())
        assert bar.startswith("↓ more below") and "local:scripted (routing)" in bar, bar
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        for _ in range(5):
            await pilot.press("pagedown")
        await until(lambda: "more below" not in str(app.status.render()))


async def test_a_reply_growing_below_a_transcript_scrolled_up_is_said_on_the_status_bar(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """Not only a new card or note: text added to a reply already shown is news below too."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with attached(app, size=(80, 24)) as pilot:
        for i in range(3):
            await type_text(pilot, app, f"message {i}")
            await until(lambda done=i: notes(app).count("turn completed") == done + 1)
        send(app, "a reply long enough to go on streaming for a while " * 4)
        await until(lambda: len(texts(app, AssistantMessage)) == 4)
        await pilot.press("pageup")
        await until(lambda: not app.transcript.following)
        assert app.turn.id is not None  # still streaming: no card or note was added since
        await until(lambda: "↓ more below" in str(app.status.render()))
        assert app.turn.id is not None


async def test_a_call_cancelled_with_its_turn_says_cancelled_live_and_resumed(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The turn is cancelled while write_file waits for an answer: its card says `cancelled`
    (it said `failed: cancelled`, the event's code), and the same when read back (it said
    `error`)."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        send(app, "please use all tools")
        await wait_modal(app)
        await pilot.press("escape")  # decide later: the question stays
        await until(lambda: "write_file is waiting for your answer" in notes(app))
        await pilot.press("escape")  # the dialog is closed: Esc cancels the turn
        await until(lambda: "turn cancelled · " in notes(app))
        card = next(c for c in app.query(ToolCard) if c.name_ == "write_file")
        await until(lambda: card.result is not None)
        assert str(card._state.render()).split(" · ")[0] == "cancelled"
    resumed = make_app(d, workspace, session_id=app.session_id)
    async with attached(resumed) as pilot:
        await pilot.pause()
        card = next(c for c in resumed.query(ToolCard) if c.name_ == "write_file")
        assert str(card._state.render()).split(" · ")[0] == "cancelled"


async def test_models_at_80_columns_keeps_each_row_in_its_columns(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """A model that cannot answer has a long why (`no key (ANTHROPIC_API_KEY unset)`): at 80
    columns it goes under its row, indented, instead of wrapping to the note's left edge."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app, size=(80, 24)) as pilot:
        await type_text(pilot, app, "/models")
        await until(lambda: "availability" in notes(app))
        [note] = [n for n in app.query(Note) if "availability" in str(n.render())]
        lines = str(note.render()).splitlines()
        assert all(len(line) <= app.note_width for line in lines), lines
        # the note is laid out as written: no line of it wraps
        assert note.region.height == len(lines)
        row = next(i for i, line in enumerate(lines) if line.startswith("anthropic:"))
        assert lines[row].rstrip().endswith("-")  # its context: the why follows, indented
        assert lines[row + 1].startswith("    ") and lines[row + 1].strip().endswith(")")
        screenshot(app, "models-80")


async def test_the_confirmation_keys_read_whole_at_80_columns(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The dialog's keys wrapped inside one of them ("[n] deny (with a" / "reason)"): they are
    laid out a line for allowing, a line for the rest."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app, size=(80, 24)) as pilot:
        send(app, "please use all tools")
        modal = await wait_modal(app)
        await pilot.pause()
        keys = modal.query_one(".keys", Static)
        assert keys.region.height == 2
        assert str(keys.render()).splitlines() == [
            "[y] allow once   [a] allow for this session",
            "[n] deny (with a reason)   [Esc] decide later",
        ]
        screenshot(app, "confirm-80")
        await pilot.press("n", "enter")


async def test_help_at_80_columns_lists_commands_and_keys_in_columns(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """/help's lines wrapped to the note's left edge at 80 columns, and it left out Ctrl-Q,
    PageUp / PageDown and @alias: two lists in two columns, a long description wrapped within
    its column."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app, size=(80, 30)) as pilot:
        await type_text(pilot, app, "/help")
        await until(lambda: "Ctrl-Q" in notes(app))
        [note] = [n for n in app.query(Note) if "Ctrl-Q" in str(n.render())]
        lines = str(note.render()).splitlines()
        assert all(len(line) <= app.note_width for line in lines), lines
        assert note.region.height == len(lines)  # nothing wrapped by the terminal
        starts = [line.split()[0] for line in lines if line.startswith("/")]
        assert starts == list(COMMANDS)
        column = lines[0].index("pin a model")
        # a continuation line is indented to its description's column
        assert all(line[:column].isspace() for line in lines if line.startswith(" ")), lines
        for key in ("PageUp / PageDown", "Ctrl-C twice, Ctrl-Q", "@alias message", "Ctrl-O"):
            assert any(line.startswith(key) for line in lines), key
        assert "again, the next one" in str(note.render())  # Tab goes through the options
        screenshot(app, "help-80")


async def test_help_taller_than_the_transcript_opens_at_its_first_command(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """At 80x24 /help is taller than the transcript: it is shown from its first line (the
    commands), not its last (the keys, with the commands scrolled away); what comes next
    is followed again."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with attached(app, size=(80, 24)) as pilot:
        await type_text(pilot, app, "/help")
        await until(lambda: "Ctrl-Q" in notes(app))
        [note] = [n for n in app.query(Note) if "Ctrl-Q" in str(n.render())]
        transcript = app.transcript
        await until(
            lambda: transcript.scroll_y > 0 and transcript.scroll_y < transcript.max_scroll_y
        )
        assert note.outer_size.height > transcript.scrollable_content_region.height
        # its first line at the top, only its margin above it
        assert 0 <= note.virtual_region.y - transcript.scroll_y <= 1
        screenshot(app, "help-80x24")
        await type_text(pilot, app, "hello")
        await until(lambda: "turn completed" in notes(app), timeout=20)
        await pilot.pause()
        assert transcript.scroll_y == transcript.max_scroll_y  # the end followed again


async def test_a_refused_message_says_why_in_the_daemons_words_without_its_code(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "@sonnet hello")
        await until(lambda: "not sent: " in notes(app))
        [said] = [line for line in notes(app).splitlines() if line.startswith("not sent: ")]
        assert said.startswith("not sent: model 'sonnet' is not "), said
        assert "model_not_configured" not in notes(app)
        assert app.prompt.text == "@sonnet hello"
        await type_text(pilot, app, "/mcp restart nope")
        await until(lambda: "no MCP server named 'nope'" in notes(app))
        assert "mcp_server_not_found" not in notes(app)


async def test_at_80_columns_the_opening_note_fits_the_workspace_on_its_first_line(
    start_daemon: Callable[..., Any], deep: Path
) -> None:
    d = await start_daemon()
    app = make_app(d, deep)
    async with attached(app, size=(80, 24)) as pilot:
        await pilot.pause()
        [opening] = [n for n in app.query(Note) if "/help for commands" in str(n.render())]
        first = opening.render_lines(opening.region.reset_offset)[0].text.strip()
        assert first.startswith(f"session {app.session_id} on ")
        assert first.endswith("/billing/api;") and "…" in first, first


async def test_token_counts_group_their_thousands(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "word " * 1500)
        await until(lambda: "turn completed" in notes(app))
        [call] = await api_of(d).events(app.session_id, event_types="llm.call_completed")
        tokens = call["payload"]["input_tokens"]
        assert tokens >= 1500
        await until(lambda: app.status.fields.get("tokens", "").startswith(f"{tokens:,} in / "))
        await type_text(pilot, app, "/cost")
        await until(lambda: f" · {tokens:,} in / " in notes(app))


async def test_the_tokens_read_count_those_read_from_the_cache(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """With prompt caching most of a call's input is read from the cache: the bar and /cost
    say all the tokens read, not the few that were not cached."""
    usage = {"input_tokens": 12, "cache_read_tokens": 5000, "cache_write_tokens": 300}
    async with FakeProviderServer() as fake:
        fake.enqueue("anthropic", FakeReply.say("cached", usage={**usage, "output_tokens": 7}))
        d = await start_daemon(models=bench_models_yaml(fake.anthropic_base_url))
        app = make_app(d, workspace)
        async with attached(app) as pilot:
            await type_text(pilot, app, "go")
            await until(lambda: "turn completed" in notes(app))
            await until(lambda: app.status.fields.get("tokens") == "5,312 in / 7 out")
            await type_text(pilot, app, "/cost")
            await until(lambda: " · 5,312 in / 7 out tokens" in notes(app))


async def test_a_conversation_past_the_window_is_said_once_and_counted_on_the_bar(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """A small window (5,000 input tokens) and ~2,000-token replies: from the fourth turn on
    the model no longer sees the first messages; the transcript says so once, the bar counts
    them, and a re-attach finds the count again."""
    async with FakeProviderServer() as fake:  # the long-session tests' small model
        models = MODELS.format(anthropic=fake.anthropic_base_url, window=WINDOW, output=OUTPUT)
        d = await start_daemon(models=models)
        app = make_app(d, workspace, model=SMALL)
        async with attached(app) as pilot:
            for i in range(5):
                fake.enqueue("anthropic", FakeReply.say(f"answer {i} " + "r" * 8000))
                await type_text(pilot, app, f"question {i}")
                await until(lambda i=i: notes(app).count("turn completed") == i + 1)
            assert notes(app).count(OUTGROWN_NOTE) == 1
            assert app.status.fields["context"].endswith(" messages left out")
            screenshot(app, "window-outgrown")
            shown = app.status.fields["context"]
            await app.transcript.remove_children()
            await app.renderer.show_history()  # as a re-attach does
            await app.refresh_status(fetch=False)
            assert app.status.fields["context"] == shown


async def test_esc_puts_away_the_completions_when_no_turn_runs(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        app.prompt.focus()
        await pilot.press("/", "c", "o")
        hints = app.query_one("#hints", Static)
        assert hints.has_class("shown")
        await pilot.press("escape")
        assert not hints.has_class("shown") and app.prompt.text == "/co"  # the text stays
        await pilot.press("s")  # typing on lists them again
        assert hints.has_class("shown")


async def test_new_says_the_session_left_stays_active_unless_it_was_never_used(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        first = app.session_id
        await type_text(pilot, app, "hello")
        await until(lambda: "turn completed" in notes(app))
        await type_text(pilot, app, "/new")
        await until(lambda: app.session_id != first and app.stream.reader is not None)
        await until(
            lambda: f"session {first} stays active: /sessions goes back to it" in notes(app)
        )
        second = app.session_id
        await type_text(pilot, app, "/new")  # the second was never used: it is ended, not kept
        await until(lambda: app.session_id != second and app.stream.reader is not None)
        await pilot.pause()
        assert "stays active" not in notes(app)
    _, ended = await api_of(d).call("GET", f"/sessions/{second}")
    assert ended["ended_at"] is not None


async def test_a_result_that_could_not_be_read_is_shown_once_the_daemon_is_back(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """A call ends while REST does not answer (the daemon stopping just then): its card said
    how it ended over nothing, even after the app re-attached; it is filled once the stream is back."""
    d = await start_daemon(config=CONFIRM_ALL)
    app = make_app(d, workspace)
    async with attached(app):
        send(app, "please use server tool")
        modal = await wait_modal(app)
        request = modal.request
        app.api.url = "http://127.0.0.1:9"  # nothing listens there: the result is not read
        await api_of(d).answer(
            app.session_id, request["turn_id"], request["confirmation_request_id"]
        )
        await until(lambda: "turn completed" in notes(app))
        [card] = app.query(ToolCard)
        await until(lambda: card.state == "failed")  # ended: the file is not there
        assert card.result is None
        app.api.url = d.base_url
        await d.stop()
        await until(lambda: not app.stream.connected)
        again = await restarted(d)
        try:
            await until(lambda: app.stream.connected, timeout=15)
            await until(lambda: card.result is not None)
            assert "metis-demo.txt" in card.result
        finally:
            await again.stop()


async def test_a_retried_model_call_says_what_went_wrong_in_words(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    async with FakeProviderServer() as fake:
        fake.enqueue("anthropic", FakeReply.fail(429, retry_after=0.2))
        fake.enqueue("anthropic", FakeReply.say("answered after the retry"))
        d = await start_daemon(models=bench_models_yaml(fake.anthropic_base_url))
        app = make_app(d, workspace)
        async with attached(app) as pilot:
            await type_text(pilot, app, "hello")
            await until(lambda: "turn completed" in notes(app), timeout=20)
            [said] = [line for line in notes(app).splitlines() if "retrying" in line]
            assert said.endswith(": rate limited, retrying in 0.2 s"), said
            assert texts(app, AssistantMessage) == ["answered after the retry"]


async def test_a_long_diff_scrolls_within_the_dialog_above_its_keys_at_80x24(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """A 60-line write pushed the dialog's keys below its edge at 80x24: nothing said how to
    answer. The keys (and the reason asked after `n`) stay at the dialog's foot; the diff
    scrolls above them."""
    async with FakeProviderServer() as fake:
        content = "".join(f"line {i}\n" for i in range(60))
        fake.enqueue(
            "anthropic", FakeReply.call("write_file", {"path": "big.txt", "content": content})
        )
        fake.enqueue("anthropic", FakeReply.say("written"))
        d = await start_daemon(models=bench_models_yaml(fake.anthropic_base_url))
        app = make_app(d, workspace)
        async with attached(app, size=(80, 24)) as pilot:
            send(app, "write it")
            modal = await wait_modal(app)
            await pilot.pause()
            dialog = modal.query_one(Vertical).region
            keys = modal.query_one(".keys", Static).region
            assert dialog.contains_region(keys) and keys.height == 2
            diff = modal.query_one("#confirm-body", Static).parent
            assert isinstance(diff, VerticalScroll) and diff.max_scroll_y > 0
            # the whole diff within the dialog: scrolled to its end, its last line shows
            assert dialog.contains_region(diff.region) and diff.region.bottom <= keys.y
            screenshot(app, "confirm-long-diff")
            await pilot.press("n")
            await pilot.pause()
            reason = modal.query_one("#reason").region
            assert reason.height == 3 and dialog.contains_region(reason)
            assert diff.region.bottom <= modal.query_one(".keys", Static).region.y
            short = diff.region.height
            await pilot.resize_terminal(80, 40)  # a taller terminal gives the diff more room
            await until(lambda: diff.region.height > short)
            assert modal.query_one(Vertical).region.contains_region(diff.region)
            await pilot.press(*"too big", "enter")
            await until(lambda: "turn completed" in notes(app), timeout=20)


async def test_a_long_session_list_scrolls_above_the_pickers_keys_at_80x24(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon()
    api = api_of(d)
    for i in range(12):
        session = await api.create_session(workspace)
        await api.run_turn(session["id"], f"question number {i}")
    app = make_app(d, workspace)
    async with attached(app, size=(80, 24)) as pilot:
        await type_text(pilot, app, "/sessions")
        await until(lambda: isinstance(app.screen, SessionPicker))
        await pilot.pause()
        picker = app.screen
        dialog = picker.query_one(Vertical).region
        keys = picker.query_one(".keys", Static).region
        assert dialog.contains_region(keys), (keys, dialog)  # it was 20 rows below the edge
        # the list scrolls within the dialog: its last sessions can be reached, not clipped
        options = picker.query_one(OptionList)
        assert dialog.contains_region(options.region) and options.region.bottom <= keys.y
        assert options.max_scroll_y > 0
        screenshot(app, "session-picker-80")


async def test_leaving_while_a_turn_runs_says_it_goes_on(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(config=CONFIRM_ALL)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        send(app, "please use server tool")
        await wait_modal(app)  # the turn waits for an answer
        await pilot.press("ctrl+q")
        await until(lambda: app.return_value is not None)
    assert app.farewell() == (
        f"`metis chat --session {app.session_id}` continues this session "
        "(its turn is still running)"
    )
    idle = make_app(d, workspace)
    async with attached(idle) as pilot:
        await type_text(pilot, idle, "hello")
        await until(lambda: "turn completed" in notes(idle))
        await pilot.press("ctrl+q")
        await until(lambda: idle.return_value is not None)
    assert idle.farewell() == f"`metis chat --session {idle.session_id}` continues this session"


async def test_shift_tab_reaches_the_collapsed_thinking_and_enter_opens_it(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """Without a mouse, a collapsed part of the transcript is reached with Shift+Tab (as /help
    says), opened with Enter, and Shift+Tab comes round to the prompt again."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "think please")
        await until(lambda: "turn completed" in notes(app))
        thinking = app.query_one(ThinkingBlock)
        await pilot.press("shift+tab")
        assert isinstance(app.focused, CollapsibleTitle) and app.focused.parent is thinking
        await pilot.press("enter")
        assert not thinking.collapsed
        await pilot.press("shift+tab")  # the only collapsed part: straight back to the prompt
        assert app.focused is app.prompt
        assert app.prompt.text == ""  # the Enter opened the thinking, it sent nothing
        assert texts(app, UserMessage) == ["think please"]
        await pilot.press("shift+tab")
        assert app.focused is not app.prompt
        await pilot.press(*"hi")  # typed away from the prompt: it goes there, not nowhere
        assert app.focused is app.prompt and app.prompt.text == "hi"


async def test_with_nothing_collapsed_shift_tab_leaves_the_focus_in_the_prompt(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The transcript itself takes no focus: Shift+Tab with no collapsed part to reach moved
    the focus to it, where nothing showed it (the prompt's border only dimmed)."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "hello")
        await until(lambda: "turn completed" in notes(app), timeout=20)
        await pilot.press("shift+tab")
        assert app.focused is app.prompt
        await pilot.click("#transcript")  # a click on it leaves the typing where it was
        assert app.focused is app.prompt


async def test_model_completions_say_which_model_each_alias_names(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        app.prompt.focus()
        await pilot.press(*"/model ")
        hints = str(app.query_one("#hints", Static).render()).splitlines()
        assert hints == ["/model scripted  local:scripted", "/model -  routing decides"]
        app.prompt.set_text("")
        await pilot.press("@")
        hints = str(app.query_one("#hints", Static).render()).splitlines()
        assert hints == ["@scripted  local:scripted"]


async def test_tab_with_nothing_more_to_fill_in_goes_through_the_options(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """`/` + Tab did nothing (the commands share only the slash): Tab now puts each in the
    prompt in turn, the list staying whole with the one chosen marked; typing ends it."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        app.prompt.focus()
        await pilot.press("/")
        await pilot.press("tab")
        assert app.prompt.text == "/model"
        await pilot.press("tab", "tab")
        assert app.prompt.text == "/cost"
        await pilot.pause()
        listed = app.query_one("#hints", Static).content
        assert isinstance(listed, Text) and len(listed.plain.splitlines()) == len(COMMANDS)
        [chosen, *_] = [span for span in listed.spans if "reverse" in str(span.style)]
        assert listed.plain[chosen.start :].startswith("/cost  this session's cost")
        app.prompt.set_text("/mo")
        await pilot.press("tab")
        assert app.prompt.text == "/model"  # what both share, first
        await pilot.press("tab")
        assert app.prompt.text == "/models"
        await pilot.press("tab")
        assert app.prompt.text == "/model"


async def test_a_session_ended_elsewhere_says_so_in_the_status_bar_until_another_is_shown(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "hello")
        await until(lambda: "turn completed" in notes(app))
        await api_of(d).call("DELETE", f"/sessions/{app.session_id}")  # `metis sessions end`
        await until(lambda: "the session ended" in notes(app))
        assert app.status.fields["connection"] == "session ended"
        assert str(app.status.render()).startswith("session ended")
        await type_text(pilot, app, "/new")
        await until(lambda: not app.ended and app.stream.reader is not None)
        assert not app.status.fields["connection"]


async def test_a_message_that_starts_with_a_path_is_sent_not_taken_for_a_command(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "/etc/hosts looks odd, why?")
        await until(lambda: "turn completed" in notes(app))
        assert texts(app, UserMessage) == ["/etc/hosts looks odd, why?"]
        assert "unknown command" not in notes(app)
        await type_text(pilot, app, "/bogus")
        await until(lambda: "unknown command /bogus: /help lists them" in notes(app))


async def test_an_unknown_command_keeps_its_text_and_a_space_before_it_sends_it(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """`/tmp is full…` is no command and no path of two parts: it is not sent, nor lost; the
    note says how to send it, and with a space first it is a message."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        await type_text(pilot, app, "/tmp is full, please clean up")
        await until(lambda: "unknown command /tmp" in notes(app))
        assert "a message that starts with / is sent when a space comes before it" in notes(app)
        assert app.prompt.text == "/tmp is full, please clean up"
        assert not app.query(UserMessage)
        await type_text(pilot, app, " /tmp is full, please clean up")
        await until(lambda: "turn completed" in notes(app))
        assert texts(app, UserMessage) == [" /tmp is full, please clean up"]
        assert app.prompt.text == ""
        await type_text(pilot, app, "/title tidy")  # a known command: done with, cleared
        assert app.prompt.text == ""
        await until(lambda: "title: tidy" in notes(app))


async def test_cancelling_again_before_the_turns_end_arrives_asks_once(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """Esc, then Ctrl-C while the cancelled turn's end is still on its way (a slow provider):
    one cancel, one note; the second did not ask again nor say "no longer running"."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        send(app, "a sentence that takes a while to stream back to the terminal")
        await until(lambda: any(texts(app, AssistantMessage)))
        await app.stream.close()  # the turn's end is not read: it stays "on its way"
        await pilot.press("escape")
        await until(lambda: "cancelling the turn…" in notes(app))
        await pilot.press("ctrl+c")
        await pilot.pause(0.3)
        assert notes(app).count("cancelling the turn…") == 1
        assert "no longer running" not in notes(app)


async def test_a_crash_exits_non_zero_without_the_farewell_of_a_normal_exit(
    start_daemon: Callable[..., Any],
    workspace: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An unhandled exception ends the app (Textual's `return_code` 1): the command exits 1
    and says how to open the session again, not that all went well."""
    d = await start_daemon()
    app = make_app(d, workspace)

    def crash() -> None:
        raise RuntimeError("a defect")

    with pytest.raises(RuntimeError, match="a defect"):
        async with attached(app) as pilot:
            await type_text(pilot, app, "hello")
            await until(lambda: "turn completed" in notes(app))
            app.call_later(crash)
            await until(lambda: app.return_code is not None)
    assert finish(app) == 1
    out, err = capsys.readouterr()
    assert "continues this session" not in out + err
    assert f"`metis chat --session {app.session_id}` opens this session again" in err
    # a normal exit keeps its farewell and status
    calm = make_app(d, workspace, session_id=app.session_id)
    async with attached(calm) as pilot:
        await pilot.press("ctrl+q")
    assert finish(calm) == 0
    assert f"`metis chat --session {app.session_id}` continues" in capsys.readouterr().out


async def test_a_turn_cancelled_by_its_sessions_end_elsewhere_says_so(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """Ending the session elsewhere cancels its running turn: the turn's end says why, while
    a cancel asked in another client still reads as one the user asked for."""
    d = await start_daemon(config=CONFIRM_ALL)
    app = make_app(d, workspace)
    async with attached(app):
        send(app, "please use server tool")
        await wait_modal(app)
        turn_id = app.turn.id
        # another client's cancel: no why
        await api_of(d).call("POST", f"/sessions/{app.session_id}/turns/{turn_id}/cancel")
        await until(lambda: "turn cancelled · " in notes(app) and app.turn.id is None)
        send(app, "please use server tool")
        await until(lambda: app.turn.id not in (None, turn_id))
        await wait_modal(app)
        await api_of(d).call("DELETE", f"/sessions/{app.session_id}")  # `metis sessions end`
        await until(lambda: "the session ended" in notes(app))
        ends = [n for n in notes(app).splitlines() if n.startswith("turn cancelled")]
        assert ends[0].startswith("turn cancelled · ")
        assert ends[1].startswith("turn cancelled: the session was ended elsewhere · "), ends


async def test_a_turn_sent_from_elsewhere_shows_its_prompt_and_keeps_the_session(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """A session the app created, sent a turn by another client (`metis run --session`):
    its prompt is shown above its reply, and leaving keeps the session, as it keeps one this
    app sent a turn to. A daemon that cannot say whether a session had a turn keeps it too."""
    d = await start_daemon()
    app = make_app(d, workspace)
    async with attached(app) as pilot:
        content = {"content": [{"type": "text", "text": "sent by metis run"}]}
        await api_of(d).call("POST", f"/sessions/{app.session_id}/turns", content)
        await until(lambda: "turn completed" in notes(app))
        await type_text(pilot, app, "mine")
        await until(lambda: notes(app).count("turn completed") == 2)
        assert texts(app, UserMessage) == ["sent by metis run", "mine"]
        assert texts(app, AssistantMessage) == ['You said: "sent by metis run"', 'You said: "mine"']
        said = [w for w in app.transcript.children if isinstance(w, UserMessage | AssistantMessage)]
        assert [type(w) for w in said] == [UserMessage, AssistantMessage] * 2  # prompt first
        screenshot(app, "chat-turn-from-elsewhere")
        await pilot.press("ctrl+c", "ctrl+c")
        await until(lambda: app.return_value is not None)
    _, session = await api_of(d).call("GET", f"/sessions/{app.session_id}")
    assert session["ended_at"] is None
    assert app.farewell() == f"`metis chat --session {app.session_id}` continues this session"
    # a session with no turn, but a daemon that cannot be asked: kept, not ended blindly
    unsure = make_app(d, workspace)
    async with attached(unsure) as pilot:
        unsure.api.url = "http://127.0.0.1:9"  # nothing listens there
        await pilot.press("ctrl+q")
    _, session = await api_of(d).call("GET", f"/sessions/{unsure.session_id}")
    assert session["ended_at"] is None and unsure.continuable


async def test_a_reply_cut_off_by_the_output_limit_says_so_live_and_when_reopened(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    async with FakeProviderServer() as fake:
        fake.enqueue("anthropic", FakeReply(raw_sse=CUT_OFF_REPLIES["anthropic"]))
        d = await start_daemon(models=bench_models_yaml(fake.anthropic_base_url))
        app = make_app(d, workspace)
        cut_off = "the reply was cut off by the output limit (max_tokens)"
        async with attached(app) as pilot:
            await type_text(pilot, app, "write the notes")
            await until(lambda: "turn completed" in notes(app), timeout=20)
            states = {card.name_: card.state for card in app.query(ToolCard)}
            assert states["write_file"] == (
                "dropped: its arguments were cut off by the output limit; not run"
            )
            assert cut_off in notes(app)
            # neither failed: the read was never run (the turn ended), the write never made
            assert all(
                c.has_class("stopped") and not c.has_class("error") for c in app.query(ToolCard)
            )
            screenshot(app, "cut-off-reply")
        reopened = make_app(d, workspace, continue_latest=True)
        async with attached(reopened) as pilot:
            await pilot.pause()
            assert cut_off in notes(reopened)  # as it read live (the dropped call was never stored)
