"""`metis run` as a real subprocess against a real daemon (offline scripted model): what it
does when the run cannot be made, at a terminal, and with the confirmation flags."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import shlex
import signal
import sys
from asyncio.subprocess import Process
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api
from tests.cli import at_a_terminal, metis, start_metis, terminal_lines
from tests.e2e.test_turn_endings import CUT_OFF_REPLIES
from tests.ws_client import SLOW_SCRIPTED, fake_models


async def test_ctrl_c_while_the_prompt_is_typed_at_a_terminal_stops_the_run(
    daemon: Daemon,
) -> None:
    controller, terminal = pty.openpty()
    try:
        proc = await start_metis("run", "-", "--url", daemon.base_url, stdin=terminal)
        assert proc.stderr is not None
        said = await asyncio.wait_for(proc.stderr.readline(), 20)
        assert b"reading the prompt from stdin" in said
        proc.send_signal(signal.SIGINT)  # what the terminal sends for Ctrl-C
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        os.close(terminal)
        os.close(controller)
    assert proc.returncode == 130
    assert err.decode() == "metis: interrupted: no prompt was sent\n"


async def test_sigterm_while_the_prompt_is_read_ends_the_run_with_its_json(
    daemon: Daemon,
) -> None:
    controller, terminal = pty.openpty()  # a prompt being typed: the run waits in its read
    try:
        proc = await start_metis("run", "-", "--json", "--url", daemon.base_url, stdin=terminal)
        assert proc.stderr is not None
        said = await asyncio.wait_for(proc.stderr.readline(), 20)
        assert b"reading the prompt from stdin" in said
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        os.close(terminal)
        os.close(controller)
    assert proc.returncode == 143, err
    assert json.loads(out) == {
        "status": "error",
        "reason": "terminated",
        "message": "terminated: no prompt was sent",
    }
    assert err.decode() == "metis: terminated: no prompt was sent\n"


async def run_all_tools(daemon: Daemon, workspace: Path, **streams: Any) -> Process:
    """`metis run "use all tools"`: the scripted model's reply, then a note per tool call."""
    run = ("run", "use all tools", "--workspace", str(workspace), "--url", daemon.base_url)
    return await start_metis(*run, **streams)


async def test_at_a_terminal_a_note_starts_a_line_of_its_own_not_the_end_of_the_reply(
    daemon: Daemon, workspace: Path
) -> None:
    controller, terminal = pty.openpty()
    try:
        proc = await run_all_tools(daemon, workspace, stdout=terminal, stderr=terminal)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        lines = terminal_lines(controller, terminal)
    finally:
        os.close(controller)
    first = lines.index("Calling read_file, write_file, patch_file, list_dir, grep_files, shell.")
    assert lines[first + 1] == "metis: tool read_file metis-demo.txt"
    assert "metis: tool list_dir (the workspace root)" in lines  # its default path, said
    # the next reply is set apart from the notes by one blank line, as from a reply
    last_note = lines.index("metis: deny shell: conformance")
    assert lines[last_note + 1 : last_note + 3] == ["", "Tool results received:"]


async def test_into_one_pipe_2_and_1_a_note_starts_a_line_of_its_own_too(
    daemon: Daemon, workspace: Path
) -> None:
    """`metis run … 2>&1 | tee log`: the reply and the notes reach one reader, as at a
    terminal."""
    proc = await run_all_tools(daemon, workspace, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, out
    lines = out.decode().splitlines()
    first = lines.index("Calling read_file, write_file, patch_file, list_dir, grep_files, shell.")
    assert lines[first + 1] == "metis: tool read_file metis-demo.txt"


async def test_at_a_terminal_a_replys_escape_sequences_are_shown_and_into_a_pipe_kept(
    daemon: Daemon, workspace: Path
) -> None:
    """The scripted model says the prompt back: an escape sequence in it reaches stdout, which
    a terminal would obey (set its title, clear the screen); a script reads it as written. The
    same for an export."""
    prompt = "title \x1b]0;PWNED\x07 and clear \x1b[2J"
    run = ("run", prompt, "--workspace", str(workspace), "--url", daemon.base_url)
    code, lines, _ = await at_a_terminal(*run, width=100)
    assert code == 0 and lines == ['You said: "title \\x1b]0;PWNED\\x07 and clear \\x1b[2J"']
    code, out, _ = await metis(*run)
    assert (code, out) == (0, f'You said: "{prompt}"\n')
    code, out, _ = await metis(*run, "--json")
    said = json.loads(out)
    assert said["text"] == f'You said: "{prompt}"'  # as written
    export = ("sessions", "export", said["session_id"], "--url", daemon.base_url)
    code, lines, _ = await at_a_terminal(*export, width=100)
    assert code == 0 and "\\x1b]0;PWNED\\x07" in "\n".join(lines)
    assert not any("\x1b" in line for line in lines)


async def test_a_refused_run_leaves_no_session_behind(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """An unknown model is refused by the daemon once the session exists: that empty session is
    purged. An empty prompt is refused before anything is asked of the daemon."""
    run = ("run", "--workspace", str(workspace), "--url", daemon.base_url)
    code, out, err = await metis(*run, "hi", "--model", "nosuch")
    # words for a person; the code is for scripts (`--json`)
    assert (code, out) == (2, "") and err.startswith("metis: unknown model 'nosuch'\n"), err
    for prompt in ("", "  \n"):
        code, out, err = await metis(*run, prompt)
        assert (code, out, err) == (2, "", "metis: the prompt is empty\n")
    _, listing = await api_of(daemon).call("GET", "/sessions")
    assert listing["sessions"] == []


async def test_run_json_describes_a_refused_request(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    api, url = api_of(daemon), ("--url", daemon.base_url)
    code, out, _ = await metis("run", "hi", "--model", "nosuch", "--json", *url)
    assert code == 2
    assert json.loads(out) == {
        "status": "refused",
        "reason": "model_not_configured",
        "message": "unknown model 'nosuch'",
    }
    ended = (await api.create_session(workspace))["id"]
    await api.call("DELETE", f"/sessions/{ended}")
    code, out, _ = await metis("run", "hi", "--session", ended, "--json", *url)
    assert code == 2 and json.loads(out)["reason"] == "session_already_ended"
    code, out, _ = await metis("run", "hi", "--workspace", "/", "--json", *url)
    assert code == 2 and json.loads(out)["reason"] == "invalid_workspace"
    code, out, _ = await metis("run", "hi", "--json", "--url", "http://127.0.0.1:9")
    assert code == 1 and json.loads(out)["status"] == "error"


async def test_run_json_describes_a_usage_or_address_error_too(metis_home: Path) -> None:
    """A script that asked for JSON reads one object whatever stopped the run, here before any
    daemon is asked; the usage is still said on stderr."""
    for args, env, reason, said in (
        (["--json"], {}, "usage_error", "the following arguments are required: prompt"),
        (["hi", "--json", "--bogus"], {}, "usage_error", "unrecognized arguments: --bogus"),
        (["hi", "--json", "--port", "70000"], {}, "usage_error", "70000"),
        (["hi", "--json"], {"METIS_PORT": "abc"}, "invalid_address", "METIS_PORT='abc'"),
    ):
        code, out, err = await metis("run", *args, env=env)
        assert code == 2, err
        failure = json.loads(out)
        assert (failure["status"], failure["reason"]) == ("refused", reason), failure
        assert said in failure["message"] and said in err
    code, out, err = await metis("run", "hi", "--bogus")  # without --json: stderr only
    assert (code, out) == (2, "") and "unrecognized arguments: --bogus" in err


async def test_arguments_that_are_not_utf8_are_said_before_anything_is_sent(
    daemon: Daemon, tmp_path: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """A prompt or a workspace name in another encoding reaches Python as lone surrogates,
    which JSON cannot carry: said as such (exit 2), not as the daemon's 'malformed JSON'."""
    latin1 = os.fsdecode(b"caf\xe9")  # what a Latin-1 terminal hands over
    plain, workspace = tmp_path / "plain", tmp_path / os.fsdecode(b"ws\xff")
    plain.mkdir()
    workspace.mkdir()
    url = ("--url", daemon.base_url)
    for args in ((latin1, "--workspace", str(plain)), ("hi", "--workspace", str(workspace))):
        code, out, err = await metis("run", *args, "--json", *url)
        assert code == 2, err
        assert json.loads(out)["reason"] == "not_utf8" and "is not UTF-8 text" in err
    code, _, err = await metis("sessions", "list", "--search", latin1, *url)
    assert code == 2 and "is not UTF-8 text" in err and "malformed JSON" not in err, err
    _, listing = await api_of(daemon).call("GET", "/sessions")
    assert listing["sessions"] == []  # nothing was made


async def test_a_reply_stdout_cannot_take_is_one_line_and_the_session_still_ends(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    run = ("run", "hi", "--workspace", str(workspace), "--url", daemon.base_url)
    for json_flag in ([], ["--json"]):
        with open("/dev/full", "wb") as full:  # every write fails: no space left
            code, _, err = await metis(*run, *json_flag, stdout=full.fileno())
        assert (code, err.splitlines()[-1]) == (
            1,
            "metis: cannot write the output: No space left on device",
        ), err
        assert "Traceback" not in err
    _, listing = await api_of(daemon).call("GET", "/sessions", params={"status": "all"})
    assert [s["ended_at"] is not None for s in listing["sessions"]] == [True, True]


async def test_deny_all_is_named_as_the_reason_of_its_denials(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    run = ("run", "use all tools", "--workspace", str(workspace), "--url", daemon.base_url)
    code, out, err = await metis(*run, "--deny-all", "--keep", "--json")
    assert code == 0, err
    sid = json.loads(out)["session_id"]
    assert await api_of(daemon).decisions(sid) == [("deny", "once", "metis run --deny-all")] * 3
    code, out, err = await metis(*run, "--keep", "--json")
    assert code == 0, err
    sid = json.loads(out)["session_id"]
    assert await api_of(daemon).decisions(sid) == [("deny", "once", "metis run without --yes")] * 3


async def test_a_session_in_another_workspace_than_the_one_given_is_refused(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api], tmp_path: Path
) -> None:
    api = api_of(daemon)
    sid = (await api.create_session(workspace))["id"]
    run = ("run", "hi", "--session", sid, "--url", daemon.base_url)
    code, out, err = await metis(*run, "--workspace", str(tmp_path))
    assert (code, out) == (2, "")
    assert f"session {sid} works in {workspace}, not in {tmp_path} (--workspace)" in err, err
    _, session = await api.call("GET", f"/sessions/{sid}")
    assert session["turn_count"] == 0
    code, out, err = await metis(*run, "--workspace", str(workspace))  # the same: no objection
    assert (code, out) == (0, 'You said: "hi"\n'), err


async def test_ctrl_c_during_the_turn_cancels_it_and_reports_it_as_cancelled(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)
    prompt = "a reply long enough to be cut off " * 4
    run = ("run", prompt, "--keep", "--workspace", str(workspace), "--url", d.base_url)
    proc = await start_metis(*run)
    assert proc.stdout is not None
    started = await asyncio.wait_for(proc.stdout.read(1), 30)  # the reply is streaming
    proc.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    said = err.decode()
    assert proc.returncode == 1, said
    assert (started + out).decode().endswith("\n")
    assert "metis: cancelling the turn (Ctrl-C again leaves at once)\n" in said
    assert "metis: turn cancelled · session sess_" in said and "(kept)" in said
    assert "Traceback" not in said
    [session] = (await api_of(d).call("GET", "/sessions"))[1]["sessions"]
    _, session = await api_of(d).call("GET", f"/sessions/{session['id']}")
    assert session["current_turn_id"] is None and session["ended_at"] is None


async def test_sigterm_during_the_turn_cancels_it_and_ends_the_session_it_made(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """What `timeout` or `kill` sends: the turn is cancelled, not left running in a session
    nobody follows, and the session the run made is ended as after any turn."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    prompt = "a reply long enough to be cut off " * 4
    proc = await start_metis("run", prompt, "--workspace", str(workspace), "--url", d.base_url)
    assert proc.stdout is not None
    await asyncio.wait_for(proc.stdout.read(1), 30)  # the reply is streaming
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    said = err.decode()
    assert proc.returncode == 1, said
    assert "metis: terminated: cancelling the turn\n" in said and "Traceback" not in said
    assert "metis: turn cancelled · session sess_" in said and "(kept)" not in said
    [session] = (await api_of(d).call("GET", "/sessions?status=all"))[1]["sessions"]
    _, session = await api_of(d).call("GET", f"/sessions/{session['id']}")
    assert session["current_turn_id"] is None and session["ended_at"] is not None


async def test_a_session_ended_elsewhere_during_the_turn_is_not_said_to_be_kept(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)
    api = api_of(d)
    sid = (await api.create_session(workspace))["id"]
    prompt = "a reply long enough to be cut off " * 4
    proc = await start_metis("run", prompt, "--session", sid, "--url", d.base_url)
    assert proc.stdout is not None
    await asyncio.wait_for(proc.stdout.read(1), 30)  # the reply is streaming
    status, _ = await api.call("DELETE", f"/sessions/{sid}")  # the dashboard's End, say
    assert status == 200
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    said = err.decode()
    assert proc.returncode == 1, said
    assert f"metis: turn cancelled · session {sid} (ended elsewhere) · $" in said, said


async def test_a_daemon_stopped_during_a_kept_run_reports_the_turn_with_its_ids(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)
    prompt = "a reply long enough to be cut off " * 4
    run = ("run", prompt, "--keep", "--json", "--workspace", str(workspace), "--url", d.base_url)
    proc = await start_metis(*run)
    async with asyncio.timeout(30):  # the turn runs
        while not len(d.core.slots):
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # and streams
    await d.stop()  # `metis stop`, say
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1, err
    ended = json.loads(out)
    assert ended["session_id"].startswith("sess_") and ended["turn_id"], ended
    assert (ended["status"], ended["reason"]) == ("cancelled", "server_shutdown"), ended


async def test_a_failed_turn_is_said_in_words_on_stderr_and_by_its_code_in_json(
    start_daemon: Callable[..., Any], workspace: Path, fake: FakeProviderServer
) -> None:
    # a request the provider refuses as invalid: the turn fails at once, never retried
    refused = FakeReply(status=400, error_type="invalid_request_error", error_message="too long")
    fake.enqueue("anthropic", refused, refused)
    d = await start_daemon(models=fake_models(fake))
    run = ("run", "hi", "--workspace", str(workspace), "--url", d.base_url)
    code, out, err = await metis(*run)
    assert (code, out) == (1, ""), err
    [line] = [said for said in err.splitlines() if said.startswith("metis: turn ")]
    assert line.startswith("metis: turn failed: "), line
    assert " · session sess_" in line and line.endswith(" · $0"), line
    code, out, err = await metis(*run, "--json")
    ended = json.loads(out)
    assert (code, ended["status"]) == (1, "failed"), err
    assert f"failed: {ended['message']} · " in line and ended["reason"] == "provider_error"


async def test_a_standard_stream_closed_at_start_is_dev_null_not_a_traceback(
    daemon: Daemon, workspace: Path
) -> None:
    """`metis … >&-` or `<&-`: Python leaves the stream None, and the first file opened would
    take its number."""
    base = f"{shlex.quote(sys.executable)} -m metis.cli"
    url = f"--url {daemon.base_url}"
    for line, code in (
        (f"{base} sessions list {url} >&-", 0),
        (f"{base} status {url} >&-", 0),
        (f"{base} run - --workspace {shlex.quote(str(workspace))} {url} <&-", 2),
    ):
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", f"exec {line}", stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        said = err.decode()
        assert proc.returncode == code and "Traceback" not in said, (line, said)
    assert said == "metis: the prompt on stdin is empty\n"


async def test_json_gives_the_turns_usage_buckets_the_cached_ones_too(
    start_daemon: Callable[..., Any], workspace: Path, fake: FakeProviderServer
) -> None:
    usage = {"input_tokens": 12, "cache_read_tokens": 5000, "cache_write_tokens": 300}
    fake.enqueue("anthropic", FakeReply.say("cached", usage={**usage, "output_tokens": 7}))
    d = await start_daemon(models=fake_models(fake))
    run = ("run", "hi", "--json", "--workspace", str(workspace), "--url", d.base_url)
    code, out, err = await metis(*run)
    said = json.loads(out)
    assert code == 0, err
    assert {name: said[name] for name in (*usage, "output_tokens")} == {**usage, "output_tokens": 7}


async def test_a_reply_cut_off_by_the_output_limit_is_said_and_exits_3(
    start_daemon: Callable[..., Any], workspace: Path, fake: FakeProviderServer
) -> None:
    """Text, then a write_file whose arguments the limit cut: the call never ran, so it is not
    reported as a tool call, and a script learns the reply is partial."""
    cut = FakeReply(raw_sse=CUT_OFF_REPLIES["anthropic"])
    fake.enqueue("anthropic", cut, cut)
    d = await start_daemon(models=fake_models(fake))
    run = ("run", "hi", "--workspace", str(workspace), "--url", d.base_url)
    code, out, err = await metis(*run)
    assert (code, out) == (3, "Reading, then writing.\n"), err
    notes = [line for line in err.splitlines() if line.startswith("metis: ")]
    assert notes[:4] == [
        "metis: tool read_file README.md",
        "metis: tool write_file dropped: its arguments were cut off by the output limit; not run",
        "metis: reply cut off by the output limit (max_tokens)",
        # complete, but the turn ends with the reply: answered, never run
        "metis: tool read_file not run: the reply was cut off by the output limit",
    ], err
    code, out, err = await metis(*run, "--json")
    ended = json.loads(out)
    assert code == 3, err
    assert (ended["status"], ended["stop_reason"], ended["truncated"]) == (
        "completed",
        "max_tokens",
        True,
    )
    assert [(call["name"], call["not_run"]) for call in ended["tool_calls"]] == [
        ("read_file", True)
    ]
    assert ended["dropped_tool_calls"] == ["write_file"]
    assert "metis: reply cut off by the output limit (max_tokens)" in err.splitlines()
