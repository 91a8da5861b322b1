"""What a client saw survives a crash, with its numbers.

A real `metis serve` subprocess streams a slow scripted reply to a live WebSocket client and is
SIGKILLed, eight times, at a random point: 0–60 ms after the turn's 202, or 0–60 ms into the
stream. After each restart the client reconnects with `since` = the last event it saw. Checked
every round: the reconnect is never `cursor_expired`; everything the client has been shown
(live or replayed) is, event for event, the stored trace's prefix (same ids at the same seqs,
so no seq the client knows was given to another event); the trace has no holes; every
acknowledged turn's stored events start with `turn.started`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from pathlib import Path
from typing import Any

from tests.api import TERMINAL, Api
from tests.e2e.test_acknowledged_events import serving
from tests.ws_client import SLOW_SCRIPTED, STREAMING, Closed, Ws

ROUNDS = 8  # half of them mid-stream; a fresh seed every run (the suite runs it often)
KILL_WINDOW_S = 0.060
# About 30 deltas of two characters, 15 ms apart: a stream of ~0.5 s to kill in.
PROMPT = "tell me about durable event logs"
COMPARED = ("id", "seq", "type", "turn_id", "parent_event_id", "actor", "payload")


def _same(event: dict[str, Any]) -> dict[str, Any]:
    return {k: event[k] for k in COMPARED}


async def _record(client: Ws, frames: list[dict[str, Any]]) -> None:
    """Every frame until the socket drops (the daemon was killed)."""
    with contextlib.suppress(Closed, ConnectionError, asyncio.CancelledError):
        while True:
            frames.append(await client.recv(timeout=30))


def _check_prefix(seen: list[dict[str, Any]], stored: list[dict[str, Any]], note: str) -> None:
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1)), f"{note}: seq holes"
    assert len(stored) >= len(seen), f"{note}: the store lost events the client saw"
    for mine, kept in zip(seen, stored, strict=False):
        assert _same(mine) == _same(kept), f"{note}: seq {mine['seq']} names another event"


async def _subscribe(api: Api, sid: str, since: str, note: str) -> Ws:
    client = await Ws.open(api, sid)
    ack = await client.subscribe(since=since)
    assert ack["type"] == "subscribe_ack", f"{note}: reconnect since {since} refused: {ack}"
    return client


async def test_what_a_client_saw_survives_sigkill_with_its_seqs(
    metis_home: Path, workspace: Path, tmp_path: Path
) -> None:
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "models.yaml").write_text(SLOW_SCRIPTED)
    seed = int.from_bytes(os.urandom(4))
    rng = random.Random(seed)
    log = tmp_path / "serve.log"
    seen: list[dict[str, Any]] = []  # persistent events shown to the client, in order
    turns: list[str] = []
    sid = ""
    shown_before_kill = 0  # rounds whose kill fell after the client saw the turn's events
    for round_no in range(ROUNDS):
        note = f"round {round_no} (seed {seed})"
        async with serving(metis_home, log) as (api, kill):
            if not sid:
                sid = (await api.create_session(workspace))["id"]
                seen.extend(await api.events(sid))  # acknowledged with the 201: stored
            _check_prefix(seen, await api.events(sid), note)
            client = await _subscribe(api, sid, seen[-1]["id"], note)
            frames: list[dict[str, Any]] = []
            reader = asyncio.get_running_loop().create_task(_record(client, frames))
            status, accepted = await api.submit(sid, f"{PROMPT} #{round_no}")
            assert status == 202, accepted
            turns.append(accepted["turn_id"])
            if round_no % 2:  # mid-stream: once the reply is streaming
                async with asyncio.timeout(10):
                    while not any(e["type"] in STREAMING for e in _events(frames)):
                        await asyncio.sleep(0.002)
            await asyncio.sleep(rng.uniform(0, KILL_WINDOW_S))
            await kill()
            async with asyncio.timeout(10):
                await reader
            await client.close()
        shown = [e for e in _events(frames) if e["type"] not in STREAMING]
        for event in shown:
            assert event["seq"] == seen[-1]["seq"] + 1, f"{note}: the client's view has a hole"
            seen.append(event)
        shown_before_kill += any(e["turn_id"] == turns[-1] for e in shown)
    async with serving(metis_home, log) as (api, _kill):
        note = f"after the last restart (seed {seed})"
        stored = await api.events(sid)
        _check_prefix(seen, stored, note)
        client = await _subscribe(api, sid, seen[-1]["id"], note)
        await client.close()
    assert "bus.gap_detected" not in {e["type"] for e in stored}
    for turn_id in turns:
        mine = [e["type"] for e in stored if e["turn_id"] == turn_id]
        assert mine[0] == "turn.started" and mine[-1] in TERMINAL, (turn_id, mine)
    assert shown_before_kill >= ROUNDS // 2, "the kills missed the window they are meant to hit"


def _events(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f["event"] for f in frames if f.get("type") == "event" and not f.get("catch_up")]
