"""Database: where its statements run, and the WAL checkpoints the writer leaves to its thread."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from metis.core.errors import StoreBusy
from metis.core.store.db import CHECKPOINT_EVERY, Database


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(tmp_path / "m.db")
    await database.open()
    await database.transaction(lambda conn: conn.execute("CREATE TABLE notes (n INTEGER)"))
    yield database
    await database.close()


def rows_in_main_file(db: Database, copy: Path) -> int:
    """The rows the database file holds by itself, without its WAL: what checkpoints moved."""
    shutil.copyfile(db.path, copy)
    conn = sqlite3.connect(copy)
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name='notes'").fetchone() is None:
            return 0  # not even the table left the WAL yet
        return int(conn.execute("SELECT count(*) FROM notes").fetchone()[0])
    finally:
        conn.close()


async def add_notes(db: Database, count: int) -> None:
    for n in range(count):
        await db.transaction(lambda conn, n=n: conn.execute("INSERT INTO notes VALUES (?)", (n,)))


async def test_commits_stay_in_the_wal_until_a_checkpoint_every_so_many_commits(
    db: Database, tmp_path: Path
) -> None:
    """The writer never checkpoints inside a commit (that would sync the file on the event
    loop); the checkpoint after every CHECKPOINT_EVERY commits moves them into the file."""
    await add_notes(db, CHECKPOINT_EVERY - 2)  # the CREATE TABLE above was one commit
    assert rows_in_main_file(db, tmp_path / "before.db") == 0
    await add_notes(db, 1)
    for _ in range(500):  # the checkpoint runs in the background, on the writer's thread
        with contextlib.suppress(sqlite3.DatabaseError):  # a copy taken while it writes
            if rows_in_main_file(db, tmp_path / "after.db") == CHECKPOINT_EVERY - 1:
                break
        await asyncio.sleep(0.01)
    assert rows_in_main_file(db, tmp_path / "after.db") == CHECKPOINT_EVERY - 1


async def test_the_wal_file_stays_bounded_under_a_steady_stream_of_commits(db: Database) -> None:
    """SQLite starts the WAL over only at a write that finds it wholly checkpointed; checkpoints
    that let commits run beside them never get there, and the file grew with every commit."""
    wal = Path(f"{db.path}-wal")
    for n in range(40 * CHECKPOINT_EVERY):
        await db.transaction(lambda conn, n=n: conn.execute("INSERT INTO notes VALUES (?)", (n,)))
        await asyncio.sleep(0)  # the loop goes on between two writes, as between two requests
    page_frames = 4096 + 24
    assert wal.stat().st_size <= 4 * CHECKPOINT_EVERY * page_frames  # ~40x that before


async def test_closing_waits_for_a_running_checkpoint_and_keeps_every_commit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.db"
    db = Database(path)
    await db.open()
    await db.transaction(lambda conn: conn.execute("CREATE TABLE notes (n INTEGER)"))
    await add_notes(db, CHECKPOINT_EVERY + 5)  # a checkpoint starts on the way
    await db.close()  # at once, while it may still run
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == CHECKPOINT_EVERY + 5
    conn.close()


async def test_a_read_by_key_does_not_wait_for_a_read_under_way_and_sees_the_latest_commit(
    db: Database,
) -> None:
    """`fetchone` reads on the writer while no write holds it: it answers while another read
    has the reader, with what was just committed; `fetchall` sees the same."""
    await add_notes(db, 20)
    await db.transaction(lambda conn: conn.execute("INSERT INTO notes VALUES (-1)"))
    async with db._read_lock:  # a listing under way has the reader
        row = await asyncio.wait_for(db.fetchone("SELECT count(*) FROM notes"), 1)
    assert row is not None and row[0] == 21
    assert len(await db.fetchall("SELECT n FROM notes")) == 21


async def test_a_read_by_key_during_an_open_write_sees_only_what_is_committed(
    db: Database,
) -> None:
    """While a `write()` transaction holds the writer, a read by key goes to the reader: it
    neither waits for that transaction nor sees its uncommitted rows."""
    await add_notes(db, 3)
    inserted, release = asyncio.Event(), asyncio.Event()

    async def open_write() -> None:
        async with db.write() as conn:
            await conn.execute("INSERT INTO notes VALUES (99)")
            inserted.set()
            await release.wait()

    writing = asyncio.ensure_future(open_write())
    await inserted.wait()
    row = await asyncio.wait_for(db.fetchone("SELECT count(*) FROM notes"), 1)
    assert row is not None and row[0] == 3  # not the open transaction's row
    release.set()
    await writing
    row = await db.fetchone("SELECT count(*) FROM notes")
    assert row is not None and row[0] == 4


async def test_a_failing_transaction_on_the_loop_writes_nothing_and_raises(db: Database) -> None:
    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO notes VALUES (1)")
        raise sqlite3.IntegrityError("refused")

    with pytest.raises(sqlite3.IntegrityError, match="refused"):
        await db.transaction(half_then_fail)
    row = await db.fetchone("SELECT count(*) FROM notes")
    assert row is not None and row[0] == 0
    await add_notes(db, 1)  # the writer is usable again
    row = await db.fetchone("SELECT count(*) FROM notes")
    assert row is not None and row[0] == 1


async def test_a_commit_refused_at_the_end_is_rolled_back_and_the_next_transaction_runs(
    db: Database,
) -> None:
    """A deferred constraint is checked by COMMIT itself: the refused transaction must not stay
    open, or the next one could not begin (or would commit its rows along)."""

    def create(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE parents (id INTEGER PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE children (parent INTEGER REFERENCES parents(id)"
            " DEFERRABLE INITIALLY DEFERRED)"
        )

    await db.transaction(create)
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        await db.transaction(lambda conn: conn.execute("INSERT INTO children VALUES (7)"))
    await add_notes(db, 1)
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        async with db.write() as conn:  # the transaction that awaits between its statements
            await conn.execute("INSERT INTO children VALUES (8)")
    children = await db.fetchone("SELECT count(*) FROM children")
    notes = await db.fetchone("SELECT count(*) FROM notes")
    assert children is not None and children[0] == 0
    assert notes is not None and notes[0] == 1
    await add_notes(db, 1)  # the writer is free again after the second refusal too


@pytest.fixture
def other_writer(db: Database) -> Iterator[sqlite3.Connection]:
    """Another process's connection to the same file (`metis trace prune`, an `sqlite3` shell)."""
    conn = sqlite3.connect(db.path, isolation_level=None)
    yield conn
    conn.close()


async def test_a_write_waits_for_another_process_holding_the_write_lock_without_freezing_the_loop(
    db: Database, other_writer: sqlite3.Connection
) -> None:
    other_writer.execute("BEGIN IMMEDIATE")
    inline = asyncio.ensure_future(add_notes(db, 1))
    awaiting = asyncio.ensure_future(awaiting_write(db))
    ticks = 0
    for _ in range(10):  # the loop goes on: timers fire, reads answer
        await asyncio.sleep(0.01)
        ticks += 1
        assert await db.fetchone("SELECT 1") is not None
    assert ticks == 10 and not inline.done() and not awaiting.done()
    other_writer.execute("COMMIT")
    await asyncio.wait_for(asyncio.gather(inline, awaiting), 5)
    row = await db.fetchone("SELECT count(*) FROM notes")
    assert row is not None and row[0] == 2


async def awaiting_write(db: Database) -> None:
    async with db.write() as conn:
        await conn.execute("INSERT INTO notes VALUES (-1)")


async def test_a_write_gives_up_after_its_wait_with_store_busy_and_the_writer_stays_usable(
    db: Database, other_writer: sqlite3.Connection
) -> None:
    db.write_wait_s = 0.05
    other_writer.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreBusy, match="locked by another process") as refused:
        await add_notes(db, 1)
    # still the SQLITE_BUSY it replaces, for the store's callers that catch sqlite3 errors
    assert isinstance(refused.value, sqlite3.OperationalError)
    assert refused.value.sqlite_errorcode == sqlite3.SQLITE_BUSY
    assert refused.value.details["waited_s"] >= 0.05
    with pytest.raises(StoreBusy):
        await awaiting_write(db)
    other_writer.execute("ROLLBACK")
    await add_notes(db, 1)
    await awaiting_write(db)
    row = await db.fetchone("SELECT count(*) FROM notes")
    assert row is not None and row[0] == 2


SECRET = "erase-me-5c1e"


def files_holding(db: Database, text: str) -> list[str]:
    """The database's files (the file, its WAL) whose bytes contain `text`."""
    return [
        f.name
        for f in sorted(db.path.parent.glob(f"{db.path.name}*"))
        if text.encode() in f.read_bytes()
    ]


async def add_secrets(db: Database) -> None:
    """Rows beside kept ones, some moved into the file by a checkpoint, some only in the WAL."""
    await db.transaction(lambda conn: conn.execute("CREATE TABLE texts (t TEXT)"))
    for n in range(CHECKPOINT_EVERY + 8):
        text = f"{SECRET} {n}" if n % 2 else f"kept {n}"
        await db.transaction(
            lambda conn, t=text: conn.execute("INSERT INTO texts VALUES (?)", (t,))
        )
    await asyncio.sleep(0.05)  # the periodic checkpoint, in the background
    assert files_holding(db, SECRET) == ["m.db", "m.db-wal"]


async def erase_secrets(db: Database) -> None:
    async with db.erasing() as conn:
        await conn.execute("DELETE FROM texts WHERE t LIKE ?", (f"{SECRET}%",))


async def test_an_erasing_write_leaves_what_it_deleted_in_neither_file(db: Database) -> None:
    await add_secrets(db)
    await erase_secrets(db)
    assert files_holding(db, SECRET) == []
    assert Path(f"{db.path}-wal").stat().st_size == 0
    row = await db.fetchone("SELECT count(*) FROM texts")
    assert row is not None and row[0] == (CHECKPOINT_EVERY + 8) // 2
    # only that write overwrote: the writer's later deletes are plain again (and cheaper)
    row = await db.fetchone("PRAGMA secure_delete")
    assert row is not None and row[0] == 0


async def test_a_reader_keeping_the_wal_does_not_fail_the_erasure_a_later_checkpoint_empties_it(
    db: Database, other_writer: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process's open read holds frames the checkpoint may not drop: the erasure waits
    for it a while, then stands committed with the WAL left; the next periodic checkpoint,
    once the reader is gone, truncates it."""
    await add_secrets(db)
    db.truncate_wait_ms = 50
    other_writer.execute("BEGIN")
    other_writer.execute("SELECT count(*) FROM texts").fetchone()  # a read snapshot, held
    await asyncio.wait_for(erase_secrets(db), 5)
    assert "the WAL could not be emptied (a reader still uses it)" in caplog.text
    assert "m.db-wal" in files_holding(db, SECRET)
    row = await db.fetchone("SELECT count(*) FROM texts WHERE t LIKE ?", (f"{SECRET}%",))
    assert row is not None and row[0] == 0
    other_writer.execute("COMMIT")
    await add_notes(db, CHECKPOINT_EVERY)
    for _ in range(100):
        if not files_holding(db, SECRET):
            break
        await asyncio.sleep(0.02)
    assert files_holding(db, SECRET) == []
