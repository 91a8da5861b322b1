"""`metis status` as a real subprocess against a real daemon (offline scripted model)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metis.cli import main
from metis.commands import status as status_command
from metis.commands.daemon_client import DaemonTarget
from metis.commands.status import render
from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from metis.version import metis_version
from tests.api import Api
from tests.cli import metis
from tests.helpers import named_by_home_lock
from tests.ws_client import fake_models


async def test_status_says_where_the_daemon_runs_and_what_it_has(daemon: Daemon) -> None:
    url = ("--url", daemon.base_url)
    code, out, err = await metis("status", *url)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"metis {metis_version()} is running at ")
    assert lines[0].split(" at ")[1].startswith(f"{daemon.base_url} (up ")
    assert "  sessions:   none in use" in lines
    assert any(line.startswith("  models:     local:scripted (healthy)") for line in lines)
    assert "  routing:    the shipped default (there is no routing.yaml)" in lines
    assert "  MCP:        none configured" in lines
    assert any(line.startswith("  shell tool: ") for line in lines)
    code, out, err = await metis("status", "--json", *url)
    assert code == 0, err
    status = json.loads(out)
    assert status["running"] and status["active_sessions"] == status["active_turns"] == 0
    assert status["models"] == [{"id": "local:scripted", "availability": "healthy"}]
    assert status["routing"]["in_force"] == "shipped_default" and status["mcp"] == []


async def test_status_of_no_daemon_exits_3_and_of_a_wrong_key_1(daemon: Daemon) -> None:
    code, out, _ = await metis("status", "--url", "http://127.0.0.1:9")
    assert code == 3
    assert out.startswith("metis is not running: nothing answers at http://127.0.0.1:9")
    assert out.splitlines()[1] == (
        "Start it with `metis serve --detach` (or `metis serve` in another terminal)."
    )
    code, out, _ = await metis("status", "--json", "--url", "http://127.0.0.1:9")
    assert code == 3 and json.loads(out)["running"] is False
    code, out, err = await metis(
        "status", "--url", daemon.base_url, env={"METIS_API_KEY": "not-the-key"}
    )
    refused = f"metis: the daemon at {daemon.base_url} refused the key (METIS_API_KEY, else "
    assert (code, out) == (1, "") and err.startswith(refused), err  # as every command says it
    code, out, err = await metis(
        "status", "--json", "--url", daemon.base_url, env={"METIS_API_KEY": "not-the-key"}
    )
    assert code == 1 and err.startswith(refused), err
    said = json.loads(out)
    assert (said["running"], said["error"]) == (True, "key_refused") and refused[7:] in said[
        "message"
    ]
    code, _, err = await metis("status", "--url", "127.0.0.1:9")  # no scheme: not a URL
    assert code == 2 and "is not a daemon URL" in err and "Traceback" not in err
    code, out, _ = await metis("status", "--json", "--url", "127.0.0.1:9")
    said = json.loads(out)
    assert (code, said["running"], said["error"]) == (2, None, "invalid_url")
    assert said["message"] == "'127.0.0.1:9' is not a daemon URL (http://HOST:PORT)"


async def test_a_daemon_that_holds_its_home_but_does_not_answer_is_not_called_not_running(
    metis_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stopped (SIGSTOP) or stuck daemon: its lock is held and its port accepts, nothing
    answers. `metis serve` would be refused; status says what is there instead.

    Run in this process, so that the wait is 0.3 s rather than the 5 s a person is given
    (the lock is an flock, so the command's own look at it still finds it held)."""
    monkeypatch.setattr(status_command, "STATUS_TIMEOUT_S", 0.3)
    metis_home.mkdir(parents=True)
    silent = await asyncio.start_server(lambda *_: None, "127.0.0.1", 0)  # accepts, never answers
    url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    try:
        with named_by_home_lock(metis_home, url):  # held by this process
            code = await asyncio.to_thread(main, ["status", "--json"])
    finally:
        silent.close()
    out, err = capsys.readouterr()
    assert code == 1, err
    said = json.loads(out)
    assert (said["running"], said["error"]) == (True, "not_answering"), said
    assert f"(pid {os.getpid()}) holds {url} but did not answer within 0.3 s" in err
    assert "is not running" not in err + out


@pytest.fixture
def in_utc() -> Iterator[None]:
    """Local time is UTC for the test (its times' zone is then named UTC), and as it was after."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TZ", "UTC")
        time.tzset()
        yield
    time.tzset()


@pytest.mark.usefixtures("in_utc")
def test_the_status_names_sessions_in_use_turns_unhealthy_models_and_servers() -> None:
    body = {
        "/health": {"uptime_seconds": 7300.0, "active_sessions": 2, "active_turns": 1,
                    "shell_sandbox": "none"},
        "/server/version": {"version": "1.2.3"},
        "/models": {"offline_mode": False, "unconfigured": [{"id": "openai:gpt-5"}], "models": [
            {"id": "anthropic:sonnet", "availability": "healthy", "availability_detail": None},
            {"id": "openai:mini", "availability": "model_unavailable",
             "availability_detail": {"scope": "model", "trigger_reason": "rate_limit",
                                     "since": "2026-11-28T11:55:00Z",
                                     "recovers_at": "2026-11-28T12:00:00Z",
                                     "message": "openai \x1b[2Jrate-limited it"}},
        ]},
        "/routing/policy": {"errors": ["bad"], "in_force": "last_known_good",
                            "reason": "routing.yaml has errors; its last version is in force"},
        "/mcp": {"servers": [{"name": "git", "state": "ready"}, {"name": "fs", "state": "failed"}]},
    }  # fmt: skip
    target = DaemonTarget("http://127.0.0.1:8421", Path("/home/me/.metis"), None)
    lines = render(target, 4321, body).splitlines()
    assert lines[0] == "metis 1.2.3 is running at http://127.0.0.1:8421 (pid 4321, up 2 h 1 min)"
    assert lines[2:] == [
        "  sessions:   2 in use (1 turn running)",
        "  models:     anthropic:sonnet (healthy), openai:mini (unavailable: openai \\x1b[2Jrate-"
        "limited it, until 2026-11-28 12:00:00 UTC); 1 more declared without a key (see `metis "
        "models`)",
        "  routing:    routing.yaml has errors; its last version is in force (`metis routing"
        " check` says why)",
        "  MCP:        1 of 2 ready: git ready, fs failed",
        "  shell tool: NOT sandboxed (see docs/sandbox.md)",
        "Dashboard: `metis open`; chat: `metis chat`.",
    ]
    # at a terminal each fact wraps under its value's column, a command to type kept whole
    wrapped = render(target, 4321, body, width=80).splitlines()
    assert max(len(line) for line in wrapped) <= 80
    assert wrapped[wrapped.index("  MCP:        1 of 2 ready: git ready, fs failed") - 2 :][:2] == [
        "  routing:    routing.yaml has errors; its last version is in force",
        "              (`metis routing check` says why)",
    ]


def test_the_help_names_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for said in ("Exit 0 when it runs", "3 when nothing answers", "1 when it refuses the key"):
        assert said in text, said
    assert "2 for a bad config.yaml (with no daemon running) or a bad daemon URL" in text


async def test_an_unavailable_model_is_said_in_words(
    start_daemon: Callable[..., Any],
    workspace: Path,
    fake: FakeProviderServer,
    api_of: Callable[[Daemon], Api],
) -> None:
    """A model routing has set aside: why, in the provider's words, and until when (local
    time, its zone named), in `metis status` and `metis models`; never the daemon's detail
    object as Python prints it."""
    refused = FakeReply(status=401, error_type="authentication_error", error_message="bad key")
    fake.enqueue("anthropic", refused, refused, refused)
    d = await start_daemon(models=fake_models(fake))
    api, url = api_of(d), ("--url", d.base_url)
    _, ended = await api.run_turn((await api.create_session(workspace))["id"], "hi")
    assert ended["type"] == "turn.failed", ended
    code, out, err = await metis("status", *url, env={"TZ": "UTC"})
    assert code == 0, err
    [models] = [line for line in out.splitlines() if line.startswith("  models:")]
    assert "{" not in models and "'" not in models, models
    assert re.search(
        r"anthropic:claude-haiku-4-5 \(unavailable: anthropic refused the key .*, "
        r"until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)",
        models,
    ), models
    code, out, err = await metis("models", *url, env={"TZ": "UTC"})
    assert code == 0, err
    [row] = [line for line in out.splitlines() if line.startswith("anthropic:claude-haiku-4-5 ")]
    assert re.search(r" unavailable until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", row), row


def test_a_home_whose_name_holds_control_characters_is_printed_escaped(
    metis_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory may be named with an escape sequence: printed as is, it would set the
    terminal's title or colours; status and stop show it escaped."""
    home = metis_home.parent / "home\x1b]0;owned\x07\n"
    monkeypatch.setenv("METIS_HOME", str(home))
    assert main(["status", "--url", "http://127.0.0.1:9"]) == 3
    assert main(["stop"]) == 3
    out, err = capsys.readouterr()
    shown = str(metis_home.parent / "home\\x1b]0;owned\\x07\\n")
    assert f"(home {shown})" in out and f"no daemon is running on {shown}" in err
    assert "\x1b" not in out + err and "\x07" not in out + err
