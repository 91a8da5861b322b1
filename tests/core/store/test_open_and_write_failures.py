"""The store's file in bad shape: what a start-up or a write says about it.

Real SQLite files only. A file that cannot serve must stop the daemon with a sentence naming
the file, and a failed write must raise what failed, never an error of the clean-up after it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from metis.core.store.db import Database, StoreUnusable
from metis.core.store.migrations import LATEST_VERSION, MIGRATIONS
from tests.cli import metis

_SESSION = (
    "INSERT INTO sessions (id, workspace_path, routing_policy_version, status, created_at_us, "
    "updated_at_us) VALUES (?, ?, 'v', 'active', 1, 1)"
)


def _version_one_file(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.execute(_SESSION, ("sess_x", "/tmp"))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()


async def test_an_upgrade_interrupted_after_its_backup_runs_again_and_keeps_both_backups(
    tmp_path: Path,
) -> None:
    """An upgrade that stopped after its backup (a crash, a full disk, a failing step) left
    the file at its old version beside `metis.db.pre-v1.bak`; the next start upgrades it."""
    path = tmp_path / "metis.db"
    _version_one_file(path)
    earlier = tmp_path / "metis.db.pre-v1.bak"
    conn = sqlite3.connect(path)
    conn.execute("VACUUM INTO ?", (str(earlier),))
    conn.execute(_SESSION, ("sess_after_the_first_backup", "/tmp"))
    conn.commit()
    conn.close()
    before = earlier.read_bytes()

    db = Database(path)
    await db.open()
    try:
        assert db.schema_version == LATEST_VERSION
        rows = await db.fetchall("SELECT id FROM sessions ORDER BY id")
        assert [r["id"] for r in rows] == ["sess_after_the_first_backup", "sess_x"]
    finally:
        await db.close()
    assert earlier.read_bytes() == before  # an existing backup is never overwritten
    again = tmp_path / "metis.db.pre-v1-2.bak"
    check = sqlite3.connect(again)
    try:
        assert check.execute("PRAGMA user_version").fetchone()[0] == 1
        assert check.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 2
    finally:
        check.close()


async def test_a_file_that_is_not_a_database_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "metis.db"
    path.write_bytes(b"this is not an SQLite file " * 200)
    with pytest.raises(StoreUnusable) as refused:
        await Database(path).open()
    assert refused.value.path == path and str(refused.value) == "file is not a database"
    assert path.read_bytes() == b"this is not an SQLite file " * 200  # left as it was


async def test_metis_serve_on_a_file_that_is_not_a_database_says_so_in_one_line(
    metis_home: Path,
) -> None:
    metis_home.mkdir()
    store = metis_home / "metis.db"
    store.write_text("garbage\n")
    code, _, err = await metis("serve", "--port", "0")
    said = [line for line in err.splitlines() if "level=" not in line]  # the log's own lines
    assert code == 1, err
    assert said == [
        f"metis: cannot start: cannot open the trace store {store}: file is not a database"
    ]


async def test_a_write_refused_by_a_full_disk_raises_that_and_the_writer_goes_on(
    tmp_path: Path,
) -> None:
    """SQLite rolls a transaction back by itself on SQLITE_FULL; the rollback after it must not
    replace "database or disk is full" with "no transaction is active"."""
    db = Database(tmp_path / "metis.db")
    await db.open()
    try:
        pages = (await db.fetchone("PRAGMA page_count"))[0]  # type: ignore[index]
        await db.writer.execute(f"PRAGMA max_page_count={pages + 2}")
        with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
            async with db.write() as conn:
                for i in range(500):
                    await conn.execute(_SESSION, (f"sess_{i}", "/x" * 500))
        assert not db.writer.in_transaction
        with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
            await db.transaction(
                lambda conn: [conn.execute(_SESSION, (f"s{i}", "/x" * 500)) for i in range(500)]
            )
        await db.writer.execute(f"PRAGMA max_page_count={pages + 100}")
        async with db.write() as conn:
            await conn.execute(_SESSION, ("sess_fits", "/tmp"))
        assert (await db.fetchone("SELECT COUNT(*) FROM sessions"))[0] == 1  # type: ignore[index]
    finally:
        await db.close()
