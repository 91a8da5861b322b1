"""SQLite store: migrations, batched trace writes with projections, gap scan and recovery."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from metis.config import Settings
from metis.core.canonical.content import TextBlock
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message, MessageMetadata
from metis.core.canonical.times import now_us
from metis.core.errors import ConfigError
from metis.core.runtime import Core
from metis.core.store.db import Database
from metis.core.store.messages import insert_message
from metis.core.store.migrations import LATEST_VERSION
from metis.core.turns.recovery import fail_orphaned_turns
from tests.helpers import insert_running_turn, insert_session

GAP = {"missing_from_seq": 1, "missing_to_seq": 1, "detected_by": "writer"}


async def test_migration_creates_the_schema_from_an_empty_file(tmp_path: Path) -> None:
    db = Database(tmp_path / "m.db")
    await db.open()
    tables = {
        r["name"] for r in await db.fetchall("SELECT name FROM sqlite_master WHERE type='table'")
    }
    assert {"sessions", "messages", "turns", "events", "tool_calls", "confirmations"} <= tables
    assert (await db.fetchone("PRAGMA journal_mode"))[0] == "wal"
    assert (await db.fetchone("PRAGMA user_version"))[0] == LATEST_VERSION
    await db.close()
    db2 = Database(tmp_path / "m.db")
    await db2.open()  # re-open an existing file: no migration, data intact
    assert db2.schema_version == LATEST_VERSION
    await db2.close()


async def test_a_newer_schema_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {LATEST_VERSION + 1}")
    conn.close()
    with pytest.raises(ConfigError, match="newer"):
        await Database(path).open()


async def test_reader_connection_is_query_only(core: Core) -> None:
    with pytest.raises(sqlite3.OperationalError):
        await core.db.fetchall("DELETE FROM sessions")


async def test_thousand_events_flush_in_few_transactions(core: Core) -> None:
    sid = await insert_session(core.db)
    before = core.writer.transactions
    for _ in range(1000):
        core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
    await core.flush()
    assert core.writer.transactions - before <= 12
    row = await core.db.fetchone(
        "SELECT COUNT(*) AS n, MAX(seq) AS m FROM events WHERE session_id=?", (sid,)
    )
    assert row["n"] == 1000 and row["m"] == 1000


async def test_timer_flushes_without_an_explicit_flush(core: Core) -> None:
    sid = await insert_session(core.db)
    core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
    for _ in range(100):
        await asyncio.sleep(0.01)
        if (await core.db.fetchone("SELECT COUNT(*) FROM events WHERE session_id=?", (sid,)))[0]:
            return
    pytest.fail("event was not flushed by the timer")


async def test_a_raising_or_slow_subscriber_does_not_delay_the_writer(core: Core) -> None:
    sid = await insert_session(core.db)
    gate = asyncio.Event()

    def broken(event: object) -> None:
        raise RuntimeError("boom")

    async def slow(event: object) -> None:
        await gate.wait()

    core.bus.subscribe("broken", broken)
    core.bus.subscribe_queued("slow", slow)
    for _ in range(50):
        core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
    await asyncio.wait_for(core.writer.flush(), 2)
    assert (await core.db.fetchone("SELECT COUNT(*) FROM events WHERE session_id=?", (sid,)))[
        0
    ] == 50
    gate.set()


async def test_failed_flush_past_retries_becomes_a_visible_gap(core: Core) -> None:
    sid = await insert_session(core.db)

    async def no_sleep(_: float) -> None:
        return None

    core.writer.sleep = no_sleep
    core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
    await core.flush()
    core.writer.fail_next_flushes = 4  # the first try and all three retries
    core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
    core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
    await core.flush()
    rows = await core.db.fetchall(
        "SELECT seq, payload_json FROM events WHERE session_id=? ORDER BY seq", (sid,)
    )
    assert [r["seq"] for r in rows] == [1, 4]
    assert json.loads(rows[1]["payload_json"]) == {
        "missing_from_seq": 2,
        "missing_to_seq": 3,
        "detected_by": "writer",
    }


def _llm_completed(turn_id: str, cost: str) -> dict:
    return {
        "request_id": "r",
        "attempt": 1,
        "message_id": "m",
        "model": "local:scripted",
        "provider": "local",
        "stop_reason": "end_turn",
        "input_tokens": 10,
        "cache_read_tokens": 1,
        "cache_write_tokens": 2,
        "output_tokens": 5,
        "cost_usd": cost,
        "pricing_version": "p",
        "latency_ms": 1,
        "first_token_ms": 1,
        "tool_use_count": 0,
        "thinking_block_count": 0,
        "usage_estimated": False,
    }


async def test_projections_sum_tokens_and_decimal_cost_per_turn_and_session(core: Core) -> None:
    sid = await insert_session(core.db)
    tid = await insert_running_turn(core.db, sid)
    started = {
        "request_id": "r",
        "attempt": 1,
        "message_id": "m",
        "model": "m",
        "provider": "p",
        "estimated_input_tokens": 1,
        "max_output_tokens": 1,
    }
    for cost in ("0.0000001", "0.1", "0.0000891"):
        core.bus.emit(sid, "llm.call_started", started, actor="agent", turn_id=tid)
        core.bus.emit(
            sid, "llm.call_completed", _llm_completed(tid, cost), actor="agent", turn_id=tid
        )
    totals = core.costs.turn(tid).turn_payload(5)
    core.bus.emit(
        sid, "turn.completed", {**totals, "stop_reason": "end_turn"}, actor="agent", turn_id=tid
    )
    await core.flush()
    turn = await core.db.fetchone("SELECT * FROM turns WHERE id=?", (tid,))
    session = await core.db.fetchone("SELECT * FROM sessions WHERE id=?", (sid,))
    assert turn["status"] == "completed" and turn["stop_reason"] == "end_turn"
    assert turn["cost_usd"] == "0.1000892" == session["cost_so_far_usd"]
    assert (
        turn["llm_call_count"] == 3
        and turn["input_tokens"] == 30
        and session["output_tokens"] == 15
    )
    assert core.costs.session(sid).cost == Decimal("0.1000892")


async def test_startup_gap_scan_reports_each_hole_once(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    core = Core(settings)
    await core.start()
    sid = await insert_session(core.db)
    for _ in range(5):
        core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
    await core.stop()
    conn = sqlite3.connect(settings.db_path)
    conn.execute("DELETE FROM events WHERE session_id=? AND seq=3", (sid,))
    conn.commit()
    conn.close()
    for _ in range(2):  # a second restart must not report the same hole again
        core = Core(settings)
        await core.start()
        await core.stop()
    conn = sqlite3.connect(settings.db_path)
    rows = conn.execute(
        "SELECT seq, payload_json FROM events WHERE session_id=? AND payload_json LIKE '%startup_scan%'",
        (sid,),
    ).fetchall()
    conn.close()
    assert len(rows) == 1
    assert json.loads(rows[0][1])["missing_from_seq"] == 3 and rows[0][0] == 6


async def test_running_turn_fails_at_restart_with_daemon_restart(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    core = Core(settings)
    await core.start()
    sid = await insert_session(core.db)
    tid = await insert_running_turn(core.db, sid)
    async with core.db.write() as conn:
        await conn.execute(
            "UPDATE sessions SET pending_model_set=1, pending_model='local:scripted' WHERE id=?",
            (sid,),
        )
        await conn.execute(
            "INSERT INTO tool_calls (id, session_id, turn_id, message_id, name, status, input_sha256, created_at_us) "
            "VALUES ('tu_x', ?, ?, 'm', 'shell', 'running', 'h', 1)",
            (sid, tid),
        )
    core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
    await core.flush()
    await core.db.close()  # simulate a crash: no orderly stop
    core = Core(settings)
    await core.start()
    try:
        turn = await core.db.fetchone("SELECT status, end_reason FROM turns WHERE id=?", (tid,))
        assert (turn["status"], turn["end_reason"]) == ("failed", "daemon_restart")
        events = await core.db.fetchall(
            "SELECT seq, type FROM events WHERE session_id=? ORDER BY seq", (sid,)
        )
        assert [(e["seq"], e["type"]) for e in events] == [
            (1, "bus.gap_detected"),
            (2, "turn.failed"),
        ]
        session = await core.db.fetchone(
            "SELECT active_model, pending_model_set FROM sessions WHERE id=?", (sid,)
        )
        assert (session["active_model"], session["pending_model_set"]) == ("local:scripted", 0)
        call = await core.db.fetchone(
            "SELECT status, result_message_id FROM tool_calls WHERE id='tu_x'"
        )
        assert call["status"] == "failed" and call["result_message_id"]
        result = await core.message_store.get(call["result_message_id"])
        assert result is not None and "interrupted" in result.content[0].content[0].text
    finally:
        await core.stop()


async def test_closing_never_loses_a_batch_the_loop_is_writing(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    for _ in range(5):
        core = Core(settings)
        await core.start()
        sid = await insert_session(core.db)
        for _ in range(300):
            core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
        await asyncio.sleep(0)  # let the background loop pick up a batch
        await asyncio.sleep(0)
        await core.stop()
        conn = sqlite3.connect(settings.db_path)
        count = conn.execute("SELECT COUNT(*) FROM events WHERE session_id=?", (sid,)).fetchone()[0]
        conn.close()
        assert count == 300


async def test_flush_waits_for_a_batch_already_being_written(core: Core) -> None:
    sid = await insert_session(core.db)
    for _ in range(150):
        core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
    await asyncio.sleep(0)  # the loop takes the first 100 (size trigger) and starts writing
    await core.flush()
    assert (await core.db.fetchone("SELECT COUNT(*) FROM events WHERE session_id=?", (sid,)))[
        0
    ] == 150


async def test_a_new_database_says_once_what_it_was_set_up_at(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="metis.core.store.db")
    db = Database(tmp_path / "new.db")
    await db.open()
    await db.close()
    said = [r.getMessage() for r in caplog.records if r.name == "metis.core.store.db"]
    assert said == [f"set up {tmp_path / 'new.db'} at schema version {LATEST_VERSION}"]


async def test_an_older_schema_upgrades_with_data_intact_and_a_backup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from metis.core.store.migrations import MIGRATIONS

    caplog.set_level("INFO", logger="metis.core.store.db")

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.execute(
        "INSERT INTO sessions (id, workspace_path, routing_policy_version, status, created_at_us, updated_at_us) "
        "VALUES ('sess_x', '/tmp', 'v', 'active', 1, 1)"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    db = Database(path)
    await db.open()
    try:
        assert db.schema_version == LATEST_VERSION
        assert (await db.fetchone("SELECT id FROM sessions"))["id"] == "sess_x"
    finally:
        await db.close()
    backup = tmp_path / "old.db.pre-v1.bak"
    assert backup.exists()
    said = [r.getMessage() for r in caplog.records if r.name == "metis.core.store.db"]
    assert said == [
        f"backing up {path} to {backup} before migrating",
        *(f"migrated {path} to schema version {v}" for v in range(2, LATEST_VERSION + 1)),
    ]
    check = sqlite3.connect(backup)
    assert check.execute("PRAGMA user_version").fetchone()[0] == 1
    check.close()


async def test_a_transaction_commits_its_work_or_rolls_it_all_back(core: Core) -> None:
    sid = await insert_session(core.db)

    def rename(conn: sqlite3.Connection) -> int:
        conn.execute("UPDATE sessions SET workspace_path='/a' WHERE id=?", (sid,))
        return conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]

    assert await core.db.transaction(rename) == 1

    def fail_halfway(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE sessions SET workspace_path='/b' WHERE id=?", (sid,))
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await core.db.transaction(fail_halfway)
    row = await core.db.fetchone("SELECT workspace_path FROM sessions WHERE id=?", (sid,))
    assert row is not None and row["workspace_path"] == "/a"
    assert not core.db.writer.in_transaction


async def test_a_release_applies_a_queued_swap_and_writes_nothing_without_one(
    core: Core,
) -> None:
    store = core.session_store
    sid = await insert_session(core.db)
    stale = await insert_session(core.db)
    async with core.db.write() as conn:  # a flag left by an earlier process
        await conn.execute(
            "UPDATE sessions SET pending_model_set=1, pending_model='m0' WHERE id=?", (stale,)
        )
    released: list[str] = []

    async def row(session_id: str) -> tuple[str | None, int, int]:
        r = await core.db.fetchone(
            "SELECT active_model, pending_model_set, updated_at_us FROM sessions WHERE id=?",
            (session_id,),
        )
        assert r is not None
        return r["active_model"], r["pending_model_set"], r["updated_at_us"]

    before = await row(sid)
    await store.apply_pending_and_release(sid, before[2] + 1, lambda: released.append(sid))
    assert released == [sid] and await row(sid) == before  # nothing queued: no write

    assert await store.set_sticky_or_queue(sid, "m1", 5, lambda: "turn_1") == "turn_1"
    assert (await row(sid))[:2] == (None, 1)
    await store.apply_pending_and_release(sid, 6, lambda: released.append(sid))
    assert await row(sid) == ("m1", 0, 6)

    await store.apply_pending_and_release(stale, 7, lambda: released.append(stale))
    assert await row(stale) == ("m0", 0, 7)
    assert released == [sid, sid, stale]


async def test_a_patch_applied_after_the_turn_ended_beats_one_queued_during_it(
    core: Core,
) -> None:
    """Last PATCH wins: between a turn's terminal event and its slot release a
    PATCH applies directly; the release must not then apply the older queued value over it."""
    store = core.session_store
    sid = await insert_session(core.db)
    assert await store.set_sticky_or_queue(sid, "queued", 5, lambda: "turn_1") == "turn_1"
    assert await store.set_sticky_or_queue(sid, "latest", 6, lambda: None) is None
    await store.apply_pending_and_release(sid, 7, lambda: None)
    r = await core.db.fetchone(
        "SELECT active_model, pending_model_set FROM sessions WHERE id=?", (sid,)
    )
    assert r is not None and (r["active_model"], r["pending_model_set"]) == ("latest", 0)


async def test_start_up_applies_a_swap_queued_behind_a_turn_that_already_completed(
    core: Core,
) -> None:
    """A crash between a turn's final flush and its release leaves the turn completed and its
    swap queued; recovery applies it, so the next turn routes to the model the PATCH chose."""
    sid = await insert_session(core.db)
    async with core.db.write() as conn:
        await conn.execute(
            "UPDATE sessions SET pending_model_set=1, pending_model='local:scripted' WHERE id=?",
            (sid,),
        )
    await fail_orphaned_turns(core.store, core.bus, core.costs)  # no running turn at all
    row = await core.db.fetchone(
        "SELECT active_model, pending_model_set FROM sessions WHERE id=?", (sid,)
    )
    assert row is not None and (row["active_model"], row["pending_model_set"]) == (
        "local:scripted",
        0,
    )


async def test_spend_of_a_committed_reply_whose_events_were_lost_survives_a_crash(
    make_settings: Callable[..., Settings],
) -> None:
    """A reply is committed with its usage before `llm.call_completed` reaches the store (up to
    50 ms later); a crash in between must not drop the call's spend from turn and session."""
    settings = make_settings()
    core = Core(settings)
    await core.start()
    sid = await insert_session(core.db)
    tid = await insert_running_turn(core.db, sid)
    usage = {"input_tokens": 100, "output_tokens": 20, "cost_usd": "0.6"}
    reply = Message(
        id=new_ulid(),
        session_id=sid,
        turn_id=tid,
        role="assistant",
        content=[TextBlock(text="hi")],
        created_at_us=now_us(),
        metadata=MessageMetadata(
            model="local:scripted",
            provider="local",
            routing={"policy": "global_default"},
            usage=usage,
            stop_reason="end_turn",
        ),
    )
    async with core.db.write() as conn:
        await insert_message(conn, reply)
    await core.db.close()  # the crash: no llm.call_completed was ever stored
    core = Core(settings)
    await core.start()
    try:
        events, _ = await core.event_store.page(
            sid, after_seq=0, until_seq=None, types=None, limit=5
        )
        [failed] = events
        assert failed.type == "turn.failed"
        payload = failed.payload
        assert payload["total_cost_usd"] == "0.6" and payload["input_tokens"] == 100
        session = await core.db.fetchone(
            "SELECT cost_so_far_usd, output_tokens FROM sessions WHERE id=?", (sid,)
        )
        assert (session["cost_so_far_usd"], session["output_tokens"]) == ("0.6", 20)
        assert core.costs.session(sid).cost == Decimal("0.6")
    finally:
        await core.stop()
