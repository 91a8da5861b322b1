"""Ending a session releases what this process held for it: a long-running daemon does not grow
with every session it ever served. Reads of an ended session go to the store and stay right."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.server.runner import Daemon
from tests.api import Api, api_session

# Long deltas: the test is about what stays after a turn, not about streaming.
MODELS = """
pricing_version: "test"
providers:
  local: {adapter: scripted, options: {chunk_chars: 256}}
models:
  - id: local:scripted
"""
ROUNDS = 5  # a leak of every ended session grows the RSS by ~80 MB: far past the 10 % bound
SESSIONS_PER_ROUND = 20
# The scripted model echoes the prompt, so each turn stores about twice this: ~20 MB a round.
PROMPT_CHARS = 500_000
LIMITS = {"limits": {"max_request_bytes": 4 * 1024 * 1024}}


def rss_bytes() -> int:
    """Resident memory once garbage is collected and malloc has handed free pages back (what
    is freed then is not counted, however the allocator happens to hold on to it)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)  # glibc
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def held_for(daemon: Daemon, session_id: str) -> list[str]:
    """The in-memory structures of the core that still hold something for `session_id`."""
    core = daemon.core
    held = []
    if core.session_cache.holds(session_id):
        held.append("live history cache")
    if session_id in core.costs.sessions:
        held.append("cost accumulator")
    if core.hub.holds(session_id):
        held.append("session hub")
    if core.broker.holds(session_id):
        held.append("confirmation broker")
    if core.dispatcher.holds(session_id):
        held.append("tool dispatcher")
    if core.instructions.holds(session_id):
        held.append("project instructions in use")
    if core.slots.current(session_id) is not None:
        held.append("turn slot")
    return held


async def run_round(api: Api, workspace: Path, round_no: int) -> list[str]:
    ended = []
    for i in range(SESSIONS_PER_ROUND):
        sid = (await api.create_session(workspace, initial_active_model="local:scripted"))["id"]
        prompt = f"round {round_no} session {i} " + "x" * PROMPT_CHARS
        _accepted, terminal = await api.run_turn(sid, prompt)
        assert terminal["type"] == "turn.completed", terminal
        status, body = await api.call("DELETE", f"/sessions/{sid}")
        assert status == 200, body
        ended.append(sid)
    return ended


async def test_ending_a_session_releases_its_memory(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    daemon = await start_daemon(models=MODELS, **LIMITS)
    async with api_session(daemon) as http:
        api = Api(http)
        ended = await run_round(api, workspace, 0)
        after_first = rss_bytes()
        for round_no in range(1, ROUNDS):
            ended = await run_round(api, workspace, round_no)
        after_last = rss_bytes()
        growth = (after_last - after_first) / after_first
        assert growth < 0.10, (
            f"RSS grew {growth:.0%} over {ROUNDS - 1} rounds of ~20 MB of ended sessions "
            f"({after_first >> 20} MiB -> {after_last >> 20} MiB)"
        )
        # Reads of an ended session come from the store, complete.
        sid = ended[-1]
        body = await api.messages(sid, limit=10)
        texts = [b["text"] for m in body["messages"] for b in m["content"] if b["type"] == "text"]
        assert len(texts) == 2 and texts[0].endswith("x" * 100) and texts[1].startswith("You said")
        status, view = await api.call("GET", f"/sessions/{sid}")
        assert status == 200 and view["ended_at"] is not None and view["cost_so_far_usd"] == "0"
        assert held_for(daemon, sid) == []


async def test_ending_a_session_drops_its_cached_history_and_reads_still_work(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    daemon = await start_daemon(models=MODELS)
    async with api_session(daemon) as http:
        api = Api(http)
        sid = (await api.create_session(workspace, initial_active_model="local:scripted"))["id"]
        await api.run_turn(sid, "hello there")
        assert daemon.core.session_cache.holds(sid) and daemon.core.instructions.holds(sid)
        status, body = await api.call("DELETE", f"/sessions/{sid}")
        assert status == 200, body
        assert held_for(daemon, sid) == []
        roles = [m["role"] for m in (await api.messages(sid))["messages"]]
        assert roles == ["user", "assistant"]
        status, view = await api.call("GET", f"/sessions/{sid}")
        assert status == 200 and view["ended_at"] is not None
        # Reading it again loads nothing back into memory.
        assert held_for(daemon, sid) == []
