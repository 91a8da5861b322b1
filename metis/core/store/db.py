"""SQLite access: one writer connection behind a lock, one query-only reader (events.md §6.1).

Every write goes through `Database.write()`, so direct writes and trace-writer batches never
interleave; reads use their own connection and see committed data only (WAL).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiosqlite

from metis.core.errors import ConfigError
from metis.core.store.migrations import LATEST_VERSION, MIGRATIONS

log = logging.getLogger(__name__)

_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
    "PRAGMA busy_timeout=5000",
)


class Database:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self.write_lock = asyncio.Lock()
        self.schema_version = 0

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = await self._connect()
        try:
            await self._migrate(self._writer)
            self._reader = await self._connect()
            await self._reader.execute("PRAGMA query_only=ON")
        except BaseException:
            await self.close()
            raise

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        conn.row_factory = sqlite3.Row
        for pragma in _PRAGMAS:
            await conn.execute(pragma)
        return conn

    async def _migrate(self, conn: aiosqlite.Connection) -> None:
        async with conn.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        version = int(row[0]) if row else 0
        if version > LATEST_VERSION:
            raise ConfigError(
                f"{self.path} has schema version {version}, newer than this metis supports "
                f"({LATEST_VERSION}); refusing to start (no downgrade)"
            )
        if version < LATEST_VERSION and version > 0:
            backup = self.path.with_name(f"{self.path.name}.pre-v{version}.bak")
            log.info("backing up %s to %s before migrating", self.path, backup)
            await conn.execute("VACUUM INTO ?", (str(backup),))
        for step in range(version, LATEST_VERSION):
            await conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _split_sql(MIGRATIONS[step]):
                    await conn.execute(statement)
                await conn.execute(f"PRAGMA user_version = {step + 1}")
                await conn.execute("COMMIT")
            except BaseException:
                await conn.execute("ROLLBACK")
                raise
            log.info("migrated %s to schema version %d", self.path, step + 1)
        self.schema_version = LATEST_VERSION

    @property
    def reader(self) -> aiosqlite.Connection:
        assert self._reader is not None, "database not open"
        return self._reader

    @property
    def writer(self) -> aiosqlite.Connection:
        """The raw writer connection; use only while holding `write_lock`."""
        assert self._writer is not None, "database not open"
        return self._writer

    @asynccontextmanager
    async def write(self) -> AsyncIterator[aiosqlite.Connection]:
        """One `BEGIN IMMEDIATE … COMMIT` transaction on the writer, under the writer lock."""
        async with self.write_lock:
            conn = self.writer
            await conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                await conn.execute("ROLLBACK")
                raise
            await conn.execute("COMMIT")

    async def fetchone(self, sql: str, params: tuple[object, ...] = ()) -> sqlite3.Row | None:
        async with self.reader.execute(sql, params) as cur:
            return await cur.fetchone()

    async def fetchall(self, sql: str, params: tuple[object, ...] = ()) -> list[sqlite3.Row]:
        async with self.reader.execute(sql, params) as cur:
            return list(await cur.fetchall())

    async def close(self) -> None:
        for conn in (self._reader, self._writer):
            if conn is not None:
                await conn.close()
        self._reader = self._writer = None


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (our scripts have no ';' inside literals)."""
    return [s.strip() for s in script.split(";") if s.strip()]
