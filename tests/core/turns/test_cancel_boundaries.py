"""Cancel cases C1 and C4 (described below), hit exactly through the real turn path.

C1: the cancel lands after `route.decided`, before `llm.call_started` — right after the 202
(the runner task has not run yet). C4: the cancel lands at the boundary — `llm.call_completed` of a
tool_use message is out, no tool has been called — from an inline bus subscriber, which runs
synchronously inside `emit`, exactly as a REST or WebSocket cancel would set the same state.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.core.events.envelope import AnyEvent
from metis.core.turns.service import TurnRequest
from metis.server.runner import Daemon


async def turn_types(daemon: Daemon, session_id: str, turn_id: str) -> list[str]:
    await daemon.core.flush()
    rows = await daemon.core.db.fetchall(
        "SELECT type FROM events WHERE session_id=? AND turn_id=? ORDER BY seq",
        (session_id, turn_id),
    )
    return [r["type"] for r in rows]


async def test_c1_cancel_before_the_first_llm_call(daemon: Daemon, workspace: Path) -> None:
    core = daemon.core
    session = await core.sessions.create(str(workspace))
    accepted = await core.turns.submit(TurnRequest(session.id, [{"type": "text", "text": "hello"}]))
    slot = core.slots.get(session.id)
    assert slot is not None and core.turns.request_cancel(slot, "user_cancel") is True
    await core.turns.wait_all()
    assert await turn_types(daemon, session.id, accepted.turn_id) == [
        "turn.started",
        "route.decided",
        "turn.cancelled",
    ]
    messages = await core.message_store.all_for_session(session.id)
    assert [m.role for m in messages] == ["user"]


async def test_c4_cancel_at_the_boundary_runs_no_tool(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    daemon = await start_daemon(
        config="tools:\n  confirmation:\n    default: {read: auto, write: auto, execute: auto}\n"
    )
    core = daemon.core

    def cancel_at_boundary(event: AnyEvent) -> None:
        if event.type == "llm.call_completed" and event.payload["stop_reason"] == "tool_use":
            slot = core.slots.get(event.session_id)
            assert slot is not None
            core.turns.request_cancel(slot, "user_cancel")

    core.bus.subscribe("test-boundary", cancel_at_boundary)
    session = await core.sessions.create(str(workspace))
    accepted = await core.turns.submit(
        TurnRequest(session.id, [{"type": "text", "text": "use all tools"}])
    )
    await core.turns.wait_all()
    types = await turn_types(daemon, session.id, accepted.turn_id)
    assert types[:5] == [
        "turn.started",
        "route.decided",
        "llm.call_started",
        "llm.call_completed",
        "tool.failed",
    ]
    assert types.count("tool.failed") == 6 and types[-1] == "turn.cancelled"
    assert "tool.called" not in types and "tool.confirmation_resolved" not in types
    assert "llm.call_failed" not in types and types.count("llm.call_started") == 1
    assert sorted(p.name for p in workspace.iterdir()) == ["README.md"]  # nothing was written
    results = [m for m in await core.message_store.all_for_session(session.id) if m.role == "tool"]
    assert len(results) == 6 and all(
        m.content[0].content[0].text == "Tool call cancelled" for m in results
    )
