"""Crash recovery while a tool runs.

A real `metis serve` subprocess is SIGKILLed while the model's shell call is sleeping. A daemon
restarted on the same METIS_HOME must fail the turn with `turn.failed{daemon_restart}` at the next
seq, store the interrupted result for the tool use, keep every committed message and event, keep
the spend of the call that completed, and run a new turn whose context carries the repaired
history.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from metis.testing.fake_provider import FakeProviderServer, FakeReply
from metis.testing.serving import (
    SERVE_START_DEADLINE_S,
    wait_until_serving,
)
from tests.api import Api, api_session, home_headers
from tests.e2e.test_costs import U1, U3, assert_store_invariants, cost_of, plain, prices
from tests.e2e.test_provider_turns import serve_auto_tools, session_on, types_of
from tests.processes import gone, live_group_members, noted_groups, the_noted_group

INTERRUPTED = "Tool call interrupted: metis stopped before the tool finished"
STARTED_FILE = ".shell-started"


async def test_daemon_killed_while_a_shell_tool_runs_recovers_on_restart(
    fake: FakeProviderServer,
    metis_home: Path,
    start_daemon: Callable[..., Any],
    workspace: Path,
    tmp_path: Path,
) -> None:
    proc, port = await serve_auto_tools(fake, metis_home, tmp_path / "serve.log")
    price = prices(fake)
    command = f"echo started > {STARTED_FILE}; echo started; sleep 30"
    fake.enqueue(
        "anthropic", FakeReply.call("shell", {"command": command, "timeout_seconds": 60}, usage=U1)
    )
    pgid = 0
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            await wait_until_serving(http, "/health")
            async with http.get("/health") as r:
                sandboxed = (await r.json())["shell_sandbox"] == "bubblewrap"
            api = Api(http, home_headers(metis_home))
            sid = await session_on(api, workspace, "anthropic")
            status, accepted = await api.submit(sid, "run the slow command")
            assert status == 202, accepted
            turn_id = accepted["turn_id"]
            # a fresh `metis serve` answers /health before its provider SDK is imported;
            # its first turn waits for that import
            called = await api.wait_for_event(
                sid, lambda e: e["type"] == "tool.called", SERVE_START_DEADLINE_S
            )
            assert called["turn_id"] == turn_id and called["payload"]["tool_name"] == "shell"
            started_file = workspace / STARTED_FILE
            for _ in range(200):  # the shell really runs
                if started_file.exists() and started_file.read_text().strip():
                    break
                await asyncio.sleep(0.02)
            pgid = await the_noted_group(metis_home)
            assert live_group_members(pgid)
            before_events = await api.events(sid)
            before_messages = (await api.messages(sid))["messages"]
            assert types_of(before_events)[-1] == "tool.called"
            assert [m["role"] for m in before_messages] == ["user", "assistant"]
            proc.send_signal(signal.SIGKILL)
            await proc.wait()

        if sandboxed:  # --die-with-parent: the sandbox died with the daemon
            assert await gone(pgid)
        else:  # the command's group, in its own session, outlived the killed daemon
            assert live_group_members(pgid)
        d = await start_daemon()
        # the restart reaps what is left before serving
        assert not live_group_members(pgid)
        assert noted_groups(metis_home) == []
        async with api_session(d) as http:
            api = Api(http)
            terminal = await api.wait_turn(sid, turn_id)

            # exactly one turn.failed{daemon_restart}, at the next seq; nothing lost or repeated
            assert terminal["type"] == "turn.failed", terminal
            payload = terminal["payload"]
            assert payload["reason"] == "daemon_restart" and payload["error_class"] is None
            assert terminal["actor"] == "system"
            assert terminal["seq"] == before_events[-1]["seq"] + 1
            started = next(e for e in before_events if e["type"] == "turn.started")
            assert terminal["parent_event_id"] == started["id"]
            events = await api.events(sid)
            assert events[: len(before_events)] == before_events
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
            assert [e for e in events if e["turn_id"] == turn_id][-1] == terminal
            assert types_of(events).count("turn.failed") == 1

            # the spend of the completed call survives the crash
            first_call = plain(cost_of(U1, price))
            assert payload["total_cost_usd"] == first_call and first_call != "0"
            assert payload["llm_call_count"] == 1 and payload["tool_call_count"] == 1
            assert payload["input_tokens"] == U1["input_tokens"]
            _, got = await api.call("GET", f"/sessions/{sid}")
            assert got["cost_so_far_usd"] == first_call and got["turn_count"] == 1
            assert got["current_turn_id"] is None

            # history intact, in order, plus the stored interrupted result of the tool use
            messages = (await api.messages(sid))["messages"]
            assert messages[: len(before_messages)] == before_messages
            assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
            assert messages[0]["id"] == accepted["user_message_id"]
            tool_use = before_messages[1]["content"][-1]
            assert (
                tool_use["type"] == "tool_use"
                and tool_use["id"] == called["payload"]["tool_use_id"]
            )
            result = messages[2]
            block = result["content"][0]
            assert block["type"] == "tool_result" and block["tool_use_id"] == tool_use["id"]
            assert block["is_error"] is True
            assert block["content"] == [{"type": "text", "text": INTERRUPTED}]
            assert result["metadata"]["tool_use_id"] == tool_use["id"]
            assert result["turn_id"] == turn_id
            db = sqlite3.connect(f"file:{metis_home / 'metis.db'}?mode=ro", uri=True)
            try:
                row = db.execute(
                    "SELECT status, is_error, result_message_id FROM tool_calls WHERE id=?",
                    (tool_use["id"],),
                ).fetchone()
                turn_row = db.execute(
                    "SELECT status, end_reason FROM turns WHERE id=?", (turn_id,)
                ).fetchone()
            finally:
                db.close()
            assert row[0] in ("completed", "failed", "cancelled") and row[1] == 1
            assert row[2] == result["id"]
            assert turn_row == ("failed", "daemon_restart")
            assert_store_invariants(metis_home, sid)

            # a new turn runs, and its context carries the repaired history
            fake.enqueue("anthropic", FakeReply.say("back again", usage=U3))
            _, after = await api.run_turn(sid, "are you there?")
            assert after["type"] == "turn.completed", after
            sent = fake.requests_for("anthropic")[-1].body["messages"]
            results = [
                b
                for m in sent
                if isinstance(m["content"], list)
                for b in m["content"]
                if b.get("type") == "tool_result"
            ]
            assert len(results) == 1 and results[0]["tool_use_id"] == tool_use["id"]
            assert results[0]["is_error"] is True and INTERRUPTED in str(results[0]["content"])
            _, got = await api.call("GET", f"/sessions/{sid}")
            assert got["turn_count"] == 2
            assert got["cost_so_far_usd"] == plain(cost_of(U1, price) + cost_of(U3, price))
            assert_store_invariants(metis_home, sid)

    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        if pgid:  # only if the test failed before the restart
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
