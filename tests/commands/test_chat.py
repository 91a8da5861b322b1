"""`metis chat`: the terminal client against a real daemon and the offline scripted model.

Most tests drive `ChatSession` in-process (input lines on a queue, output in a buffer, Ctrl-C as
`interrupt()`); one runs the real command in a subprocess with piped stdin.
"""

from __future__ import annotations

import asyncio
import io
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.commands.chat import ChatSession, Renderer
from metis.commands.daemon_client import resolve_daemon
from metis.core.canonical.times import now_us
from metis.core.store.prune import prune_events
from metis.server.runner import Daemon
from metis.server.ws import handoff
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api
from tests.cli import start_metis
from tests.e2e.test_turn_endings import CUT_OFF_REPLIES
from tests.helpers import HOLD, model_changed
from tests.ws_client import SLOW_SCRIPTED, fake_models

# A queue that `overflow` overflows (and the rest of a reply does not), and a replay limit the
# events missed meanwhile exceed.
SMALL_QUEUES = "websocket:\n  queue_max_events: 100\n  replay_max_events: 1\n"


class Terminal:
    """Lines in, labelled text out."""

    def __init__(self) -> None:
        self.lines: asyncio.Queue[str | None] = asyncio.Queue()
        self.out = io.StringIO()

    def type(self, *lines: str) -> None:
        for line in lines:
            self.lines.put_nowait(line + "\n")

    @property
    def text(self) -> str:
        return self.out.getvalue()

    def labelled(self, label: str) -> list[str]:
        return [line for line in self.text.splitlines() if line.startswith(f"{label}> ")]

    async def wait_for(self, needle: str, timeout: float = 10.0, count: int = 1) -> None:
        async with asyncio.timeout(timeout):
            while self.text.count(needle) < count:
                await asyncio.sleep(0.01)


def overflow(d: Daemon, session_id: str) -> None:
    """More events at once than SMALL_QUEUES holds: the chat's socket closes client_too_slow."""
    for _ in range(150):
        model_changed(d.core, session_id)


@pytest.fixture
def chat_with(start_daemon: Callable[..., Any], workspace: Path) -> Callable[..., Any]:
    async def make(**files: Any) -> tuple[Daemon, Terminal, ChatSession]:
        d = await start_daemon(**files)
        term = Terminal()
        chat = ChatSession(
            d.base_url, str(workspace), term.lines, term.out, headers=resolve_daemon().headers()
        )
        return d, term, chat

    return make


async def test_a_turn_streams_labelled_and_quit_leaves_the_session_open(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> None:
    d, term, chat = await chat_with()
    term.type("hello there", "/quit")
    assert await asyncio.wait_for(chat.run(), 15) == 0
    assert term.labelled("you") == ["you> hello there", "you> /quit"]
    assert term.labelled("assistant") == ['assistant> You said: "hello there"']
    assert term.labelled("route") == ["route> local:scripted"]
    [done] = term.labelled("turn")
    assert done.startswith("turn> completed in ")
    assert done.endswith(" s · 1 model call · 0 tools run · $0"), done
    assert term.labelled("metis")[-1].startswith("metis> bye;")
    _, session = await api_of(d).call("GET", f"/sessions/{chat.session_id}")
    assert session["ended_at"] is None and session["turn_count"] == 1


async def test_quitting_before_the_first_turn_ends_the_session_it_created(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> None:
    d, term, chat = await chat_with()
    term.type("/quit")
    assert await asyncio.wait_for(chat.run(), 15) == 0
    assert (
        term.labelled("metis")[-1] == f"metis> bye; session {chat.session_id} was never used: ended"
    )
    _, session = await api_of(d).call("GET", f"/sessions/{chat.session_id}")
    assert session["ended_at"] is not None and session["turn_count"] == 0


async def test_quitting_a_continued_session_before_a_turn_leaves_it_open(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api], workspace: Path
) -> None:
    d, term, _ = await chat_with()
    created = await api_of(d).create_session(workspace)
    chat = ChatSession(
        d.base_url,
        None,
        term.lines,
        term.out,
        session_id=created["id"],
        headers=resolve_daemon().headers(),
    )
    term.type("/quit")
    assert await asyncio.wait_for(chat.run(), 15) == 0
    _, session = await api_of(d).call("GET", f"/sessions/{created['id']}")
    assert session["ended_at"] is None  # not this chat's to end


async def test_tool_calls_show_and_a_confirmation_is_answered_in_the_terminal(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> None:
    d, term, chat = await chat_with(config=HOLD)
    term.type("please use server tool", "y", "please use server tool again", "n", "", "/quit")
    assert await asyncio.wait_for(chat.run(), 15) == 0
    tool = term.labelled("tool")
    assert tool[0].startswith("tool> read_file {") and tool[1] == "tool> running read_file"
    confirm = term.labelled("confirm")
    assert confirm[0].startswith("confirm> read_file (read) wants: ")
    assert any(
        c.startswith("confirm> allow read_file: ") and c.endswith("? [y/a/n]") for c in confirm
    )
    # an answer typed here is said once, by its `you>` line, not again as its event
    assert "confirm> allow" not in confirm and "confirm> deny" not in confirm
    # in words, not the event's code: a denied call did not fail, it never ran
    assert "tool> read_file not run: Tool call denied" in tool, tool
    assert term.labelled("you")[1:2] == ["you> allow"]
    events = await api_of(d).events(chat.session_id, event_types="tool.confirmation_resolved")
    assert [e["payload"]["decision"] for e in events] == ["allow", "deny"]


async def test_ctrl_c_cancels_the_running_turn_with_a_cancel_frame(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> None:
    d, term, chat = await chat_with(models=SLOW_SCRIPTED)
    term.type("a sentence that takes a while to stream back")
    running = asyncio.ensure_future(chat.run())
    await term.wait_for("assistant> ")
    chat.interrupt()  # what SIGINT does in the terminal
    await term.wait_for("turn> cancelled")
    assert "metis> cancelling the turn…" in term.text
    assert "metis> the reply was cut short (cancelled)" in term.text
    chat.interrupt()  # at the prompt: leave
    assert await asyncio.wait_for(running, 10) == 0
    cancelled = await api_of(d).events(chat.session_id, event_types="turn.cancelled")
    assert [e["payload"]["reason"] for e in cancelled] == ["user_cancel"]


async def test_a_failed_model_call_is_said_in_words(
    chat_with: Callable[..., Any], fake: FakeProviderServer
) -> None:
    """The provider's refusal in its words; the event's code (`invalid_request`) is for
    scripts."""
    refused = FakeReply(status=400, error_type="invalid_request_error", error_message="too long")
    fake.enqueue("anthropic", refused, refused)
    _, term, chat = await chat_with(models=fake_models(fake))
    term.type("hi", "/quit")
    assert await asyncio.wait_for(chat.run(), 15) == 0
    [failed] = term.labelled("llm")
    assert failed == "llm> call failed: anthropic HTTP 400 (invalid_request_error): too long"


async def test_model_commands_patch_the_session(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> None:
    d, term, chat = await chat_with()
    term.type("/model local:scripted", "/model", "/model -", "/model nope", "/help", "/quit")
    assert await asyncio.wait_for(chat.run(), 15) == 0
    assert term.labelled("model") == [
        "model> local:scripted",
        "model> local:scripted",
        "model> local:scripted (routing decides)",
    ]
    assert any("unknown model" in line for line in term.labelled("error"))
    assert any("/model <ref>" in line for line in term.labelled("metis"))
    _, session = await api_of(d).call("GET", f"/sessions/{chat.session_id}")
    assert session["sticky_model"] is None


async def test_the_session_ending_elsewhere_ends_the_chat(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> None:
    d, term, chat = await chat_with()
    running = asyncio.ensure_future(chat.run())
    await term.wait_for("/help for commands")
    await api_of(d).call("DELETE", f"/sessions/{chat.session_id}")
    assert await asyncio.wait_for(running, 10) == 0
    assert "metis> the session ended" in term.text


async def test_a_dropped_stream_is_reattached_with_since(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> None:
    d, term, chat = await chat_with()
    running = asyncio.ensure_future(chat.run())
    await term.wait_for("/help for commands")
    await d.core.hub.close_session(chat.session_id, code="client_too_slow", ws_code=1008)
    await api_of(d).run_turn(chat.session_id, "while the chat was away")
    await term.wait_for("missed events follow")
    await term.wait_for("turn> completed")  # the missed turn, replayed
    term.type("after the drop", "/quit")
    assert await asyncio.wait_for(running, 10) == 0
    assert "metis> this client fell too far behind the stream; re-attaching" in term.text
    assert term.labelled("assistant") == ['assistant> You said: "after the drop"']
    assert len(term.labelled("turn")) == 2


async def test_the_chat_waits_out_a_daemon_restart_and_goes_on(
    chat_with: Callable[..., Any],
) -> None:
    """The daemon is gone for a second and a half (longer than the old three quick attempts
    lasted); the chat keeps trying, further apart, says the reason once, and carries on."""
    d, term, chat = await chat_with()
    running = asyncio.ensure_future(chat.run())
    await term.wait_for("/help for commands")
    await d.stop()
    await term.wait_for("metis> the daemon stopped; re-attaching")
    await term.wait_for("error> re-attach failed: cannot reach the daemon: is it running?")
    await asyncio.sleep(1.5)
    again = Daemon(d.settings.model_copy(update={"port": d.port}))
    await again.start()
    try:
        term.type("after the restart", "/quit")
        assert await asyncio.wait_for(running, 20) == 0
    finally:
        await again.stop()
    assert len(term.labelled("error")) == 1  # one reason, however many attempts
    assert term.labelled("assistant") == ['assistant> You said: "after the restart"']


async def test_a_turn_too_large_to_replay_is_caught_up_from_a_snapshot(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream overflows mid-reply (client_too_slow) and the turn ends while more events
    were missed than the daemon replays (replay_too_large): the snapshot's reply and the turn's
    outcome are shown, and the chat goes on."""
    d, term, chat = await chat_with(config=SMALL_QUEUES, models=SLOW_SCRIPTED)
    text = "a sentence that takes a while to stream back to the terminal"
    term.type(text)
    running = asyncio.ensure_future(chat.run())
    await term.wait_for("assistant> ")

    async def until_the_turn_ended(kind: str) -> None:
        if kind == "replay" and chat.turn_id is not None:
            await api_of(d).wait_turn(chat.session_id, chat.turn_id)

    monkeypatch.setattr(handoff.HOOKS, "before_load", until_the_turn_ended)
    overflow(d, chat.session_id)
    await term.wait_for("turn> completed")
    term.type("short")
    await term.wait_for('"short"')
    await term.wait_for("turn> completed", count=2)
    chat.interrupt()  # at the prompt: leave
    assert await asyncio.wait_for(running, 10) == 0
    assert (
        "metis> this client fell too far behind the stream; re-attaching\n"
        "metis> cannot replay what was missed (replay_too_large); catching up from a snapshot\n"
        f'assistant> You said: "{text}"\n'
        "turn> completed in " in term.text
    )
    assert term.labelled("assistant")[-1] == 'assistant> You said: "short"'
    assert not term.labelled("error")


async def test_an_expired_cursor_is_caught_up_from_a_snapshot_and_the_turn_followed_live(
    chat_with: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of events overflows the socket's queue mid-reply (client_too_slow) and, before
    the re-attach's replay is read, the chat's cursor is pruned (cursor_expired): the snapshot
    shows the turn still running, the catch-up frames and the live deltas finish the reply, and
    the outcome arrives live."""
    d, term, chat = await chat_with(config=SMALL_QUEUES, models=SLOW_SCRIPTED)
    text = "a sentence that takes a while to stream back, long enough to outlast the re-attach"
    term.type(text)
    running = asyncio.ensure_future(chat.run())
    await term.wait_for("assistant> ")

    async def prune_the_cursor(kind: str) -> None:
        if kind == "replay":  # all but the newest event, which the chat has not seen
            await d.core.flush()
            await prune_events(d.core.db, now_us())

    monkeypatch.setattr(handoff.HOOKS, "before_load", prune_the_cursor)
    overflow(d, chat.session_id)
    await term.wait_for("turn> completed")
    chat.interrupt()  # at the prompt: leave
    assert await asyncio.wait_for(running, 10) == 0
    assert (
        "metis> this client fell too far behind the stream; re-attaching\n"
        "metis> cannot replay what was missed (cursor_expired); catching up from a snapshot\n"
        "metis> the turn is still running\n" in term.text
    )
    assert term.labelled("assistant")[-1] == f'assistant> You said: "{text}"'
    assert not term.labelled("error")


async def test_a_confirmation_missed_with_the_stream_is_asked_from_the_snapshot(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream overflows mid-reply, and the confirmation request is emitted while the
    re-attach's replay (too large) is being refused: the request only exists in the snapshot,
    from which it is asked, once; the answer lets the turn finish live."""
    d, term, chat = await chat_with(config=HOLD + SMALL_QUEUES, models=SLOW_SCRIPTED)
    term.type("please use server tool")
    running = asyncio.ensure_future(chat.run())
    await term.wait_for("assistant> ")

    async def until_the_request_is_pending(kind: str) -> None:
        if kind == "replay":
            async with asyncio.timeout(10):
                while not d.core.broker.pending(chat.session_id):
                    await asyncio.sleep(0.01)

    monkeypatch.setattr(handoff.HOOKS, "before_load", until_the_request_is_pending)
    overflow(d, chat.session_id)
    await term.wait_for("? [y/a/n]")
    term.type("y")
    await term.wait_for("turn> completed")
    chat.interrupt()  # at the prompt: leave
    assert await asyncio.wait_for(running, 10) == 0
    assert (
        "(replay_too_large); catching up from a snapshot\n"
        "assistant> Calling read_file.\n"  # the reply cut short, whole from the snapshot
        "metis> the turn is still running\n" in term.text
    )
    assert term.labelled("confirm") == [  # no "wants:" line: the request never came as an event
        "confirm> allow read_file: Read metis-demo.txt? [y/a/n]",
    ]
    assert term.labelled("you")[1] == "you> allow"
    events = await api_of(d).events(chat.session_id, event_types="tool.confirmation_resolved")
    assert [e["payload"]["decision"] for e in events] == ["allow"]


async def test_a_socket_closed_instead_of_answering_the_subscribe_is_attached_again(
    chat_with: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-attach's own queue overflows while its replay loads, so the daemon closes the
    socket instead of answering: that attach failed, the next one recovers, the chat goes on."""
    d, term, chat = await chat_with(config=SMALL_QUEUES)
    running = asyncio.ensure_future(chat.run())
    await term.wait_for("/help for commands")
    loads: list[str] = []

    async def overflow_the_first_load(kind: str) -> None:
        loads.append(kind)
        if len(loads) == 1:
            overflow(d, chat.session_id)

    monkeypatch.setattr(handoff.HOOKS, "before_load", overflow_the_first_load)
    overflow(d, chat.session_id)
    async with asyncio.timeout(10):
        while loads != ["replay", "replay", "snapshot"]:  # past the last attach's hand-off point
            await asyncio.sleep(0.01)
    term.type("hello again", "/quit")
    assert await asyncio.wait_for(running, 10) == 0
    assert (
        "error> re-attach failed: this client fell too far behind the stream while attaching"
    ) in term.text
    assert term.labelled("assistant") == ['assistant> You said: "hello again"']


async def test_an_unreachable_daemon_is_reported(workspace: Path) -> None:
    term = Terminal()
    chat = ChatSession("http://127.0.0.1:9", str(workspace), term.lines, term.out)
    assert await chat.run() == 1
    assert term.labelled("error")[0].startswith("error> cannot reach the daemon")
    assert "start it with `metis serve --detach`" in term.labelled("error")[0]


def test_unknown_event_and_frame_types_are_skipped() -> None:
    """Forward compatibility (test 14): a client ignores what it does not know."""
    out = io.StringIO()
    renderer = Renderer(out)
    renderer.event({"type": "brand.new_thing", "payload": {"x": 1}, "novel": True})
    renderer.event({"type": "text.delta", "payload": {"text": "hi", "extra": 1}})
    renderer.event({"type": "turn.cancelled", "payload": {"reason": "user_cancel"}})
    assert out.getvalue() == "assistant> hi\nturn> cancelled\n"


def test_model_text_cannot_drive_the_terminal() -> None:
    """Escape sequences and carriage returns from the daemon are shown escaped, so a reply or
    a tool input cannot redraw the screen (e.g. fake the confirmation prompt)."""
    out = io.StringIO()
    renderer = Renderer(out)
    renderer.event({"type": "text.delta", "payload": {"text": "ok\r\x1b[2Kconfirm> ls"}})
    assert out.getvalue() == "assistant> ok\\r\\x1b[2Kconfirm> ls"


async def test_sigint_cancels_the_turn_of_the_real_command(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)
    proc = await start_metis(
        "chat", str(workspace), "--url", d.base_url, stdin=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"a sentence that takes a while to stream back to me\n")
    await proc.stdin.drain()
    seen = b""
    async with asyncio.timeout(20):
        while b"assistant> " not in seen:
            seen += await proc.stdout.read(64)
        proc.send_signal(signal.SIGINT)
        while b"turn> cancelled" not in seen:
            seen += await proc.stdout.read(64)
    proc.stdin.close()
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0
    assert b"metis> bye;" in seen + out


async def test_the_command_runs_over_piped_stdin(daemon: Daemon, workspace: Path) -> None:
    proc = await start_metis(
        "chat", str(workspace), "--url", daemon.base_url, stdin=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(b"hello from a pipe\n/quit\n"), 30)
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert 'assistant> You said: "hello from a pipe"' in text
    assert "turn> completed in " in text and "you> hello from a pipe" in text


async def test_an_invalid_confirmation_answer_is_asked_again(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> None:
    d, term, chat = await chat_with(config=HOLD)
    term.type("please use server tool", "maybe", "", "n", "", "/quit")
    assert await asyncio.wait_for(chat.run(), 15) == 0
    assert term.text.count("confirm> please answer y, a or n: allow read_file?") == 2
    events = await api_of(d).events(chat.session_id, event_types="tool.confirmation_resolved")
    assert [e["payload"]["decision"] for e in events] == ["deny"]


async def test_a_allows_for_the_session_and_n_asks_for_a_reason(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> None:
    """`please use all tools` asks for write_file, patch_file and shell: `y` allows once, `a`
    for the session (REST scope session), `n` is followed by an optional reason sent with it."""
    d, term, chat = await chat_with()
    term.type("please use all tools", "y", "a", "n", "not here", "/quit")
    assert await asyncio.wait_for(chat.run(), 30) == 0
    assert term.labelled("you")[1:4] == [
        "you> allow",
        "you> allow for this session",
        "you> deny: not here",
    ]
    confirm = term.labelled("confirm")
    assert "confirm> reason for denying (optional, Enter skips)?" in confirm
    assert "confirm> allow for this session" not in confirm
    assert "confirm> deny: not here" not in confirm
    assert await api_of(d).decisions(chat.session_id) == [
        ("allow", "once", None),
        ("allow", "session", None),
        ("deny", "once", "not here"),
    ]


async def test_a_line_typed_during_a_turn_is_echoed_when_it_is_sent(
    chat_with: Callable[..., Any], workspace: Path
) -> None:
    d, term, _ = await chat_with(models=SLOW_SCRIPTED)
    chat = ChatSession(
        d.base_url,
        str(workspace),
        term.lines,
        term.out,
        prompt=True,  # at a terminal: the terminal echoes what is typed at the prompt
        headers=resolve_daemon().headers(),
    )
    term.type("a sentence that takes a while to stream back")
    running = asyncio.ensure_future(chat.run())
    await term.wait_for("assistant> ")
    term.type("typed while streaming")  # its terminal echo was lost in the reply
    await term.wait_for("turn> completed", count=2)
    term.type("/quit")
    assert await asyncio.wait_for(running, 10) == 0
    assert "you> typed while streaming" in term.text


async def test_an_ended_session_says_it_cannot_be_continued_and_how_to_read_it(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api], workspace: Path
) -> None:
    d, term, _ = await chat_with()
    api = api_of(d)
    ended = (await api.create_session(workspace))["id"]
    await api.call("DELETE", f"/sessions/{ended}")
    chat = ChatSession(
        d.base_url, None, term.lines, term.out, session_id=ended, headers=resolve_daemon().headers()
    )
    assert await asyncio.wait_for(chat.run(), 15) == 1
    assert term.labelled("error") == [
        f"error> session {ended} has ended; it cannot be continued "
        f"(`metis sessions export {ended}` shows it)"
    ]


async def test_the_end_of_input_denies_the_pending_confirmations_and_the_chat_ends(
    chat_with: Callable[..., Any], api_of: Callable[[Daemon], Api], capsys: Any
) -> None:
    """Piped input that ends while the turn asks for confirmations: no one is left to answer,
    so each call is denied ("input ended"), said on stderr, the turn ends and so does the chat
    (instead of waiting for answers for ever)."""
    d, term, chat = await chat_with()
    term.type("please use all tools")
    term.lines.put_nowait(None)  # the end of input
    assert await asyncio.wait_for(chat.run(), 15) == 0
    assert await api_of(d).decisions(chat.session_id) == [("deny", "once", "input ended")] * 3
    said = capsys.readouterr().err
    for tool in ("write_file", "patch_file", "shell"):
        assert f"metis: the input ended before `allow {tool}?` was answered: denied" in said
    assert "turn> completed in " in term.text
    _, session = await api_of(d).call("GET", f"/sessions/{chat.session_id}")
    assert session["current_turn_id"] is None and session["pending_confirmations"] == []


async def test_piped_input_ending_at_a_confirmation_lets_the_real_command_exit(
    daemon: Daemon, workspace: Path
) -> None:
    proc = await start_metis(
        "chat", "--plain", str(workspace), "--url", daemon.base_url, stdin=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(b"use all tools\n"), 20)
    assert proc.returncode == 0, err.decode()
    assert out.decode().count("confirm> deny: input ended") == 3
    assert "metis> bye;" in out.decode()


async def test_tool_outcomes_name_their_tool_and_the_instruction_file_is_named(
    chat_with: Callable[..., Any], workspace: Path
) -> None:
    (workspace / "AGENTS.md").write_text("Answer briefly.\n")
    (workspace / "metis-demo.txt").write_text("the scripted model's read_file reads it\n")
    _, term, chat = await chat_with()
    term.type("please use server tool", "/quit")
    assert await asyncio.wait_for(chat.run(), 15) == 0
    assert term.labelled("metis")[0].endswith(
        "(model: local:scripted); instructions: AGENTS.md; /help for commands"
    )
    [done] = [line for line in term.labelled("tool") if " done (" in line]
    assert done.startswith("tool> read_file done (") and done.endswith(" bytes)")


async def test_a_reply_cut_off_by_the_output_limit_says_so_and_its_dropped_call(
    chat_with: Callable[..., Any], fake: FakeProviderServer
) -> None:
    fake.enqueue("anthropic", FakeReply(raw_sse=CUT_OFF_REPLIES["anthropic"]))
    _, term, chat = await chat_with(models=fake_models(fake))
    term.type("write the notes", "/quit")
    assert await asyncio.wait_for(chat.run(), 15) == 0
    tools = term.labelled("tool")
    assert tools[:3] == [
        'tool> read_file {"path": "README.md"}',
        "tool> write_file dropped: its arguments were cut off by the output limit; not run",
        "tool> read_file not run: the reply was cut off by the output limit",
    ], tools
    assert "metis> the reply was cut off by the output limit (max_tokens)" in term.labelled("metis")
    [ended] = term.labelled("turn")
    assert ended.startswith("turn> completed") and "0 tools run" in ended, ended
