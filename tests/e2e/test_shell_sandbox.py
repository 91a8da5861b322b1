"""The shell sandbox seen from the daemon: status in /health and /server/version, a shell call
of a real turn contained, and the unsandboxed fallback (bwrap_path naming no executable) that
logs one warning and asks before every shell call, even under `execute: auto`."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api, api_session
from tests.e2e.test_provider_turns import AUTO_TOOLS, models_yaml, session_on
from tests.shell_sandbox import require_bwrap


async def status(api: Api) -> tuple[str, str]:
    _, health = await api.call("GET", "/health")
    _, version = await api.call("GET", "/server/version")
    return health["shell_sandbox"], version["shell_sandbox"]


async def test_a_turns_shell_call_runs_sandboxed(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], metis_home: Path, workspace: Path
) -> None:
    require_bwrap()
    d = await start_daemon(config=AUTO_TOOLS, models=models_yaml(fake))
    command = (
        f"ls -A {metis_home}; ls /proc/{os.getpid()}; "
        "echo made > made.txt; touch /etc/metis-e2e-probe"
    )
    fake.enqueue("anthropic", FakeReply.call("shell", {"command": command}), FakeReply.say("done"))
    async with api_session(d) as http:
        api = Api(http)
        assert await status(api) == ("bubblewrap", "bubblewrap")
        sid = await session_on(api, workspace, "anthropic")
        accepted, terminal = await api.run_turn(sid, "look around")
        assert terminal["type"] == "turn.completed", terminal
        events = await api.turn_events(sid, accepted["turn_id"])
        assert "tool.confirmation_requested" not in [e["type"] for e in events]
        result = next(m for m in (await api.messages(sid))["messages"] if m["role"] == "tool")
        text = result["content"][0]["content"][0]["text"]
    assert "models.yaml" not in text and "metis.db" not in text  # METIS_HOME is an empty tmpfs
    assert f"/proc/{os.getpid()}': No such file or directory" in text  # the daemon is invisible
    assert "Read-only file system" in text and not Path("/etc/metis-e2e-probe").exists()
    assert (workspace / "made.txt").read_text() == "made\n"
    # and the model was told so with the tool
    offered = {t["name"]: t for t in fake.requests[0].body["tools"]}
    assert "It runs in a sandbox" in offered["shell"]["description"]


async def test_without_bwrap_every_shell_call_is_confirmed_as_unsandboxed(
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    workspace: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    missing = tmp_path / "no-such-bwrap"
    config = AUTO_TOOLS + f"  shell:\n    bwrap_path: {missing}\n"
    with caplog.at_level(logging.WARNING, logger="metis.core.runtime"):
        d = await start_daemon(config=config, models=models_yaml(fake))
    warnings = [r.getMessage() for r in caplog.records if r.name == "metis.core.runtime"]
    assert warnings == [
        f"shell commands run unsandboxed (bubblewrap not found ({missing})): every shell call "
        "asks for confirmation"
    ]
    fake.enqueue(
        "anthropic",
        FakeReply.call("shell", {"command": "echo first > first.txt"}),
        FakeReply.call("read_file", {"path": "README.md"}),
        FakeReply.say("done"),
    )
    async with api_session(d) as http:
        api = Api(http)
        assert await status(api) == ("none", "none")
        sid = await session_on(api, workspace, "anthropic")
        _, accepted = await api.submit(sid, "run it")
        turn_id = accepted["turn_id"]
        requested = await api.wait_for_event(
            sid, lambda e: e["type"] == "tool.confirmation_requested"
        )
        payload = requested["payload"]
        assert payload["tool_name"] == "shell"
        assert payload["input_summary"] == "Run (unsandboxed): echo first > first.txt"
        offered = {t["name"]: t for t in fake.requests[0].body["tools"]}
        assert "sandbox" not in offered["shell"]["description"]  # nothing is promised
        assert not (workspace / "first.txt").exists()
        url = f"/sessions/{sid}/turns/{turn_id}/confirmations/{payload['confirmation_request_id']}"
        code, _ = await api.call("POST", url, {"decision": "allow", "scope": "session"})
        assert code == 200
        terminal = await api.wait_turn(sid, turn_id)
        assert terminal["type"] == "turn.completed", terminal
        assert (workspace / "first.txt").read_text() == "first\n"
        types = [e["type"] for e in await api.turn_events(sid, turn_id)]
        assert types.count("tool.confirmation_requested") == 1  # read_file stays auto

        # allowed for the session, yet the next shell call is asked again
        fake.enqueue("anthropic", FakeReply.call("shell", {"command": "echo again"}))
        _, accepted = await api.submit(sid, "once more")
        again = await api.wait_for_event(
            sid,
            lambda e: (
                e["type"] == "tool.confirmation_requested" and e["turn_id"] == accepted["turn_id"]
            ),
        )
        assert again["payload"]["input_summary"] == "Run (unsandboxed): echo again"
        await api.call("POST", f"/sessions/{sid}/turns/{accepted['turn_id']}/cancel")
        await api.wait_turn(sid, accepted["turn_id"])
