"""`metis run` and `metis sessions` as real subprocesses against a real daemon (offline
scripted model); exports compared with what the store serves over REST."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from markdown_it import MarkdownIt

from metis.server.runner import Daemon
from tests.api import Api
from tests.cli import at_a_terminal, metis, start_metis
from tests.helpers import HOLD
from tests.ws_client import SLOW_SCRIPTED


async def test_run_streams_the_reply_and_ends_its_session(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    code, out, err = await metis(
        "run", "hello from a script", "--workspace", str(workspace), "--url", daemon.base_url
    )
    assert code == 0, err
    assert out == 'You said: "hello from a script"\n'
    assert "turn completed" in err
    _, listing = await api_of(daemon).call("GET", "/sessions")
    [session] = listing["sessions"]
    assert session["ended_at"] is not None and session["turn_count"] == 1
    assert session["title"] == "hello from a script"


async def test_run_continues_a_kept_session_and_refuses_an_ended_one(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api], tmp_path: Path
) -> None:
    api, url = api_of(daemon), ("--url", daemon.base_url)
    code, out, err = await metis(
        "run", "step one", "--keep", "--json", "--workspace", str(workspace), *url
    )
    assert code == 0, err
    sid = json.loads(out)["session_id"]
    code, out, err = await metis("run", "step two", "--session", sid, *url)
    assert (code, out) == (0, 'You said: "step two"\n'), err
    assert f"session {sid} (kept)" in err
    code, out, err = await metis(
        "run", "step three", "--continue", "--workspace", str(workspace), *url
    )
    assert (code, out) == (0, 'You said: "step three"\n'), err
    _, session = await api.call("GET", f"/sessions/{sid}")
    assert session["turn_count"] == 3 and session["ended_at"] is None
    # nothing to continue on another workspace: a new session, kept for the next step
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out, err = await metis("run", "fresh", "--continue", "--workspace", str(elsewhere), *url)
    assert code == 0 and "no active session on this workspace to continue" in err
    _, listing = await api.call("GET", "/sessions", params={"workspace_path": str(elsewhere)})
    [kept] = listing["sessions"]
    assert kept["ended_at"] is None and kept["id"] != sid
    # an ended session takes no turn: refused, exit 2, the daemon's reason said
    await api.call("DELETE", f"/sessions/{sid}")
    code, out, err = await metis("run", "step four", "--session", sid, *url)
    assert (code, out) == (2, "") and f"session {sid} has ended" in err, err


async def test_run_reads_the_prompt_from_stdin_for_a_dash(daemon: Daemon, workspace: Path) -> None:
    prompt = "review this diff:\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old 'quoted' \"line\"\n+new\n"
    run = ("run", "-", "--workspace", str(workspace), "--url", daemon.base_url)
    proc = await start_metis(*run, stdin=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(prompt.encode()), 60)
    assert proc.returncode == 0, err
    assert out.decode() == f'You said: "{prompt.rstrip()}"\n'  # its last line end dropped
    code, out, err = await metis(*run)  # stdin is empty (/dev/null)
    assert (code, out) == (2, "") and "the prompt on stdin is empty" in err, err


async def test_run_json_with_yes_and_deny_all(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(config=HOLD)
    run = ("run", "please use server tool", "--workspace", str(workspace), "--url", d.base_url)
    code, out, err = await metis(*run, "--json", "--yes")
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "completed" and result["model"] == "local:scripted"
    assert [t["name"] for t in result["tool_calls"]] == ["read_file"]
    assert "allow read_file" in err
    first, _, second = result["text"].partition("\n\n")
    assert first and second, result  # two replies (before and after the tool), apart
    code, out, err = await metis(*run, "--json", "--deny-all")
    assert code == 0, err
    assert "user_denied" in json.loads(out)["text"] or "denied" in json.loads(out)["text"]
    assert "deny read_file" in err


async def test_run_exits_non_zero_when_the_turn_fails(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """A model reference that is not configured: the turn is refused (exit 2, a usage error),
    and an unreachable daemon is exit 1."""
    d = await start_daemon()
    code, _, err = await metis(
        "run", "hi", "--workspace", str(workspace), "--url", d.base_url, "--model", "nope"
    )
    assert code == 2 and "unknown model 'nope'" in err and "model_not_configured" not in err
    code, _, err = await metis("run", "hi", "--url", "http://127.0.0.1:9")
    assert code == 1 and err.strip() == (
        "metis: cannot reach the daemon at http://127.0.0.1:9; start it with "
        "`metis serve --detach` (or `metis serve` in another terminal)"
    )
    code, _, err = await metis("run", "hi", "--url", "127.0.0.1:9")  # no scheme
    assert code == 2 and "is not a daemon URL" in err and "Traceback" not in err


async def test_run_ends_the_reply_line_when_the_daemon_stops_mid_turn(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """A daemon stopping cancels the turn and says so: the cut-off reply's line is ended
    before the outcome is printed, and nothing is asked of the stopped daemon afterwards."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    prompt = "a reply long enough to be cut off " * 4
    proc = await start_metis("run", prompt, "--workspace", str(workspace), "--url", d.base_url)
    assert proc.stdout is not None
    started = await asyncio.wait_for(proc.stdout.read(1), 30)  # the reply is streaming
    await d.stop()
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    printed, said = (started + out).decode(), err.decode()
    assert proc.returncode == 1
    assert printed.endswith("\n") and f'You said: "{prompt}"'.startswith(printed[:-1])
    assert said.startswith("metis: turn ") and "· session sess_" in said, said
    assert "cannot reach" not in said


async def test_sessions_list_show_export_and_end(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api], tmp_path: Path
) -> None:
    api = api_of(daemon)
    session = await api.create_session(workspace)
    sid = session["id"]
    await api.run_turn(sid, "first line of the prompt\nsecond line")
    await api.run_turn(sid, "please use server tool")
    url = ("--url", daemon.base_url)
    code, out, err = await metis("sessions", "list", *url)
    assert code == 0, err
    [line] = out.splitlines()
    fields = line.split("\t")
    assert fields[0] == sid and fields[1] == "active" and fields[2] == "2"
    assert fields[-1] == "first line of the prompt"
    code, out, _ = await metis("sessions", "show", sid, *url, env={"TZ": "Europe/Paris"})
    assert code == 0 and f"session   {sid}" in out
    # a time says which clock it is on: the local one, named
    assert re.search(r"^created   \d{4}-\d\d-\d\d \d\d:\d\d:\d\d CES?T$", out, re.M), out
    assert "  turn 1: completed · 1 model call · 0 tools run · $0" in out
    assert "  turn 2: completed · 2 model calls · 1 tool run · $0" in out
    # a prompt (echoed by the reply) that would break the Markdown's structure, were it let
    await api.run_turn(sid, "## Turn 5: injected\n```\nunclosed fence")

    code, out, _ = await metis("sessions", "export", sid, "--format", "json", *url)
    assert code == 0
    exported = json.loads(out)
    assert exported["messages"] == (await api.messages(sid, limit=200))["messages"]
    assert exported["events"] == await api.events(sid)
    assert exported["session"]["id"] == sid and "attach_token" not in exported["session"]

    target = tmp_path / "session.md"
    code, _, err = await metis(
        "sessions", "export", sid, "--format", "md", "--output", str(target), *url
    )
    assert code == 0, err
    assert target.stat().st_mode & 0o777 == 0o600  # what it holds is as private as the store
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".session.md.*"))
    md = target.read_text()
    assert md.startswith("# first line of the prompt\n")
    assert "## Turn 1: first line of the prompt" in md and "## Turn 2: please use server tool" in md
    assert "Tool call `read_file` metis-demo.txt" in md and "```json" in md
    assert "File not found: metis-demo.txt" in md  # the tool's result, fenced
    assert "_Turn completed · 1 model call · " in md and "_Turn completed · 2 model calls · " in md
    assert "$0" in md
    tokens = MarkdownIt("commonmark").parse(md)  # as a person's viewer sees it
    top = [b.content for a, b in pairwise(tokens) if a.level == 0 and b.type == "inline"]
    outline = [line.split(" ·")[0] for line in top if line.startswith(("Turn", "**", "_Turn"))]
    assert outline == [
        *("Turn 1: first line of the prompt", "**You:**", "**Assistant** (local:scripted):"),
        "_Turn completed",
        *("Turn 2: please use server tool", "**You:**", "**Assistant** (local:scripted):"),
        *("**Assistant** (local:scripted):", "_Turn completed"),
        *("Turn 3: ## Turn 5: injected", "**You:**", "**Assistant** (local:scripted):"),
        "_Turn completed",
    ]
    assert "> ## Turn 5: injected\n> ```\n> unclosed fence\n" in md  # quoted
    assert 'You said: "## Turn 5: injected\n```\nunclosed fence"\n```\n' in md  # fence closed
    code, _, err = await metis("sessions", "export", sid, "--output", str(tmp_path), *url)
    assert code == 0 and (tmp_path / f"{sid}.md").read_text() == md, err  # into a directory

    code, out, err = await metis("sessions", "title", sid, "Flaky test hunt", *url)
    assert code == 0 and out == f"{sid}: Flaky test hunt\n", err
    # a title of two lines refused: test_client_commands_fail_with_a_message_not_a_traceback
    code, out, _ = await metis("sessions", "title", sid, "--clear", *url)
    assert out == f"{sid}: first line of the prompt\n"

    code, out, _ = await metis("sessions", "end", sid, *url)
    assert code == 0 and out.startswith(f"ended {sid}")
    code, out, err = await metis("sessions", "list", *url)
    assert out == "" and "no active sessions (--all lists every session)" in err
    code, out, _ = await metis("sessions", "list", "--all", "--json", *url)
    assert [s["id"] for s in json.loads(out)["sessions"]] == [sid]
    code, out, _ = await metis("sessions", "list", "--ended", *url)
    assert [line.split("\t")[0] for line in out.splitlines()] == [sid]
    code, out, _ = await metis("sessions", "list", "--all", "--search", "SECOND prompt", *url)
    assert code == 0 and [line.split("\t")[0] for line in out.splitlines()] == [sid]
    code, out, err = await metis("sessions", "list", "--search", "prompt", *url)
    assert out == "" and "no active sessions match 'prompt' (--all lists" in err, err
    code, _, err = await metis("sessions", "list", "--search", "x" * 201, *url)
    assert code == 2 and "--search: at most 200 characters" in err, err

    code, _, err = await metis("sessions", "purge", sid, *url)
    assert code == 2 and "add --yes to purge (`metis sessions end` keeps them)" in err, err
    code, out, err = await metis("sessions", "purge", sid, "--yes", *url)
    assert code == 0 and out.startswith(f"purged {sid}: ") and " messages, " in out, err
    assert out.rstrip().endswith(" events deleted"), out
    status, _ = await api.call("GET", f"/sessions/{sid}")
    assert status == 404
    code, _, err = await metis("sessions", "show", "sess_01M7YA76RDGJRJS6TX6XK99B3P", *url)
    assert (code, err) == (1, "metis: session sess_01M7YA76RDGJRJS6TX6XK99B3P not found\n")


async def test_run_sets_each_reply_of_a_turn_apart(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(config=HOLD)
    run = ("run", "please use server tool", "--workspace", str(workspace), "--url", d.base_url)
    code, out, err = await metis(*run, "--yes")
    assert code == 0, err
    first, _, second = out.rstrip("\n").partition("\n\n")
    assert first and second, out  # two replies (before and after the tool), apart
    # and in --json's text: test_run_json_with_yes_and_deny_all reads the same run's JSON


async def test_client_commands_fail_with_a_message_not_a_traceback(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api], tmp_path: Path
) -> None:
    api = api_of(daemon)
    session = await api.create_session(workspace)
    url = ("--url", daemon.base_url)
    # an id is checked before it goes into a path: this one would have purged the session
    code, _, err = await metis("sessions", "end", f"{session['id']}?purge=true", *url)
    assert code == 2 and "not a session id" in err, err
    status, kept = await api.call("GET", f"/sessions/{session['id']}")
    assert status == 200 and kept["ended_at"] is None
    code, _, err = await metis("sessions", "export", "../../etc/passwd", *url)
    assert code == 2 and "not a session id: '../../etc/passwd'" in err, err
    code, _, err = await metis("sessions", "title", session["id"], "two\nlines", *url)
    assert (code, err) == (
        2,
        "metis: request validation failed: title: a title is one line of text: no line "
        "breaks, control or bidi characters\n",
    )
    asked = "metis: give a title, or --clear to title the session by its first prompt again\n"
    for title in ([" "], []):
        code, _, err = await metis("sessions", "title", session["id"], *title, *url)
        assert (code, err) == (2, asked)
    code, _, err = await metis("sessions", "title", session["id"], "new", "--clear", *url)
    assert (code, err) == (2, "metis: give a title or --clear, not both\n")
    status, kept = await api.call("GET", f"/sessions/{session['id']}")
    assert kept["title"] is None
    # an export replaces a file, never a link or a device (as root, /dev/null would have been)
    target = tmp_path / "target.md"
    target.write_text("kept\n")
    (tmp_path / "link.md").symlink_to(target)
    os.mkfifo(tmp_path / "pipe")
    for name, what in (("link.md", "a symlink"), ("pipe", "not a regular file")):
        code, _, err = await metis(
            "sessions", "export", session["id"], "--output", str(tmp_path / name), *url
        )
        assert (code, err) == (
            1,
            f"metis: cannot write {tmp_path / name}: {what}; an export only creates or "
            "replaces a file\n",
        )
    assert (tmp_path / "link.md").is_symlink() and target.read_text() == "kept\n"
    # a wrong key is said as such, not as "no session to continue", and in the same words by
    # every command
    refused = f"the daemon at {daemon.base_url} refused the key (METIS_API_KEY, else "
    with pytest.MonkeyPatch.context() as env:
        env.setenv("METIS_API_KEY", "not-the-key")
        code, out, _ = await metis("chat", "--plain", "--continue", str(workspace), *url)
        assert code == 1 and out.startswith(f"error> {refused}"), out
        assert "to continue" not in out
        # `metis status` in these words: test_status_of_no_daemon_exits_3_and_of_a_wrong_key_1
        for command in (("sessions", "list"), ("mcp", "list"), ("run", "hi")):
            code, _, err = await metis(*command, *url)
            assert code == 1 and err.startswith(f"metis: {refused}"), (command, err)
        code, out, _ = await metis("run", "hi", "--json", *url)
        assert code == 1 and json.loads(out)["message"].startswith(refused), out
    code, _, err = await metis("sessions", "list", "--url", daemon.base_url.split("//")[1])
    assert code == 2 and "is not a daemon URL" in err and "Traceback" not in err
    target = tmp_path / "absent" / "x.md"
    code, _, err = await metis("sessions", "export", session["id"], "--output", str(target), *url)
    assert (code, err) == (1, f"metis: cannot write {target}: No such file or directory\n")
    assert "Traceback" not in err
    other = web.Application()  # something else listening where a daemon was expected
    runner = web.AppRunner(other)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        code, _, err = await metis("sessions", "list", "--url", f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
    assert code == 1 and "does not answer as a metis daemon (HTTP 404" in err, err
    assert "Traceback" not in err
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader of stdout is gone before the command writes
    try:
        code, _, err = await metis("sessions", "list", *url, stdout=write_end)
    finally:
        os.close(write_end)
    assert code == 141 and err == "", err


async def test_sessions_purge_ended_removes_only_ended_sessions_and_asks_first(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api], tmp_path: Path
) -> None:
    api, url = api_of(daemon), ("--url", daemon.base_url)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    active = (await api.create_session(workspace))["id"]
    ended = [(await api.create_session(w))["id"] for w in (workspace, workspace, elsewhere)]
    for sid in ended:
        await api.call("DELETE", f"/sessions/{sid}")
    code, _, err = await metis("sessions", "purge", "--ended", "--workspace", str(workspace), *url)
    assert code == 2 and f"2 ended sessions (ended in {workspace})" in err, err
    assert "sessions end" not in err, err  # no advice to end what has ended
    for days in ("1", "1000000", "99999999999"):  # further back than dates go: none either
        code, _, err = await metis("sessions", "purge", "--ended", "--days", days, "--yes", *url)
        assert code == 0 and f"no ended sessions to purge (ended {days} or more" in err, err
    purge = ("sessions", "purge", "--ended", "--workspace", str(workspace), "--yes", *url)
    code, out, err = await metis(*purge)
    assert code == 0, err
    assert [line.split(":")[0] for line in out.splitlines()] == [f"purged {s}" for s in ended[:2]]
    for sid in ended[:2]:
        assert (await api.call("GET", f"/sessions/{sid}"))[0] == 404
    for sid in (active, ended[2]):  # an active session, and one of another workspace, stay
        assert (await api.call("GET", f"/sessions/{sid}"))[0] == 200
    code, _, err = await metis("sessions", "purge", active, "--ended", "--yes", *url)
    assert code == 2 and "not both" in err, err


async def test_sessions_list_and_show_print_control_characters_escaped(
    daemon: Daemon, api_of: Callable[[Daemon], Api], tmp_path: Path
) -> None:
    """A directory name may hold an escape sequence: printed raw it would rewrite the screen."""
    workspace = tmp_path / "ws\x1b[2J\x1b[31mred"
    workspace.mkdir()
    sid = (await api_of(daemon).create_session(workspace))["id"]
    url = ("--url", daemon.base_url)
    for command in (("sessions", "list"), ("sessions", "show", sid)):
        code, out, err = await metis(*command, *url)
        assert code == 0, err
        assert "\x1b" not in out and "ws\\x1b[2J\\x1b[31mred" in out, out


async def test_sessions_list_at_a_terminal_shows_two_lines_a_session_cut_to_its_width(
    daemon: Daemon, api_of: Callable[[Daemon], Api], tmp_path: Path
) -> None:
    """Into a pipe, one tab-separated line a session (for scripts); at a terminal, the title with
    its outcome, then the id, date and workspace, never wider than the terminal."""
    api = api_of(daemon)
    workspace = tmp_path / "clients" / "acme" / "platform" / "services" / "billing"
    workspace.mkdir(parents=True)
    sid = (await api.create_session(workspace))["id"]
    await api.run_turn(sid, "explain how the routing engine picks a model for every turn we run")
    for width in (100, 60):
        lines = await _listed_at_a_terminal(daemon, width)
        assert len(lines) == 2 and all(len(line) <= width for line in lines), lines
        assert lines[0].startswith("explain how the routing engine")
        assert lines[0].endswith(" · active · 1 turn · $0")
        assert lines[1].startswith(f"  {sid} · ") and lines[1].endswith("/services/billing")
        assert "/…/" in lines[1]  # directories elided from the middle, whole
        assert (" · 20" in lines[1]) == (width == 100), lines  # narrow: the date gives way
    assert lines[0].endswith("… · active · 1 turn · $0")  # 60 columns: the title is cut
    # found by words of a later prompt: a third line shows them where they were said
    await api.run_turn(sid, "now a word on the Fallback chain")
    lines = await _listed_at_a_terminal(daemon, 60, "--search", "fallback")
    assert len(lines) == 3 and lines[2] == "  in a prompt: now a word on the Fallback chain", lines
    await api.run_turn(sid, "then check the Gateway timeouts of every service in the cluster")
    lines = await _listed_at_a_terminal(daemon, 60, "--search", "gateway")
    assert len(lines) == 3 and lines[2].startswith("  in a prompt: then check the Gateway")
    assert len(lines[2]) == 60 and lines[2].endswith("…")  # cut to the terminal's width
    # words its title shows already: nothing said twice
    lines = await _listed_at_a_terminal(daemon, 60, "--search", "routing engine")
    assert len(lines) == 2, lines
    # a session whose tool call waits for its user says so
    status, accepted = await api.submit(sid, "use all tools")
    assert status == 202, accepted
    await api.wait_for_event(sid, lambda e: e["type"] == "tool.confirmation_requested")
    lines = await _listed_at_a_terminal(daemon, 100)
    assert re.search(r" · active, [1-9] to confirm · 4 turns · ", lines[0]), lines
    code, out, err = await metis("sessions", "show", sid, "--url", daemon.base_url)
    assert code == 0, err
    waits = out.splitlines()[-1]
    assert waits.startswith("  turn 4: running, waiting for an answer to "), out
    assert "write_file" in waits and f"metis sessions end {sid}" in waits


async def test_a_workspace_path_with_a_newline_or_a_tab_keeps_its_session_on_one_line(
    daemon: Daemon, api_of: Callable[[Daemon], Api], tmp_path: Path
) -> None:
    workspace = tmp_path / "odd\nname\twith\x1b[31m"
    workspace.mkdir()
    sid = (await api_of(daemon).create_session(workspace))["id"]
    shown = str(tmp_path / "odd\\nname\\twith\\x1b[31m")
    code, out, err = await metis("sessions", "list", "--url", daemon.base_url)
    assert code == 0, err
    [line] = out.splitlines()
    assert line.split("\t")[0] == sid and line.split("\t")[5] == shown, line
    code, out, err = await metis("sessions", "show", sid, "--url", daemon.base_url)
    assert code == 0 and f"workspace {shown}\n" in out, err
    lines = await _listed_at_a_terminal(daemon, 200)
    assert len(lines) == 2 and lines[1].endswith(shown), lines


async def _listed_at_a_terminal(daemon: Daemon, width: int, *options: str) -> list[str]:
    """What `metis sessions list [options]` shows on a terminal `width` columns wide."""
    code, lines, err = await at_a_terminal(
        "sessions", "list", "--url", daemon.base_url, *options, width=width
    )
    assert code == 0, err
    return lines
