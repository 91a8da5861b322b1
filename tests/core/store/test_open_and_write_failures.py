"""The store's file in bad shape: what a start-up or a write says about it.

Real SQLite files only. A file that cannot serve must stop the daemon with a sentence naming
the file, and a failed write must raise what failed, never an error of the clean-up after it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from metis.core.store.db import Database
from metis.core.store.migrations import LATEST_VERSION, MIGRATIONS

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
