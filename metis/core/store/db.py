"""SQLite access: one writer connection behind a lock, one query-only reader.

Every write goes through `Database.write()` or `Database.transaction()`, so direct writes and
trace-writer batches never interleave; reads use their own connection and see committed data
only (WAL).

Where the statements run. aiosqlite gives each connection a thread; a call there is a round
trip that costs far more than the statements of a turn (measured on the 2-core machine: ~95 µs
of wall time and ~70 µs of CPU for a row read that takes 2 µs), and the rows are built under
the GIL anyway. So the short, per-request work runs on the event loop's own thread, on the same
connections: `transaction()` (a write known up front, the turn paths' every write) and
`fetchone()` (a read by key). What can take long stays on the connection's thread: `fetchall()`
(a session's whole history, a listing, an export), the `write()` transactions that await
between statements, migrations, backups and WAL checkpoints. A connection is only ever used by
one of the two at a time: the writer by whoever holds `write_lock` (or by `fetchone`, which
never awaits, while nobody does), the reader by whoever holds `_read_lock` (an uncontended
asyncio lock is taken without yielding).

Waiting for another process's write. SQLite's own wait (`busy_timeout`) sleeps in the calling
thread; on the event loop's it would freeze the daemon while, say, `metis trace prune` or an
open `sqlite3` shell holds the write lock. The writer therefore does not wait in SQLite
(`busy_timeout=0`): a refused `BEGIN IMMEDIATE` is retried with asyncio sleeps, up to
`write_wait_s`, while everything else goes on (reads too: under WAL they never wait for a
writer). A write still refused then fails with `StoreBusy` before anything of it was done, so
the surfaces answer 503 and the same request, repeated once the lock is released, succeeds.

Checkpoints. SQLite checkpoints the WAL inside the commit that grows it past a threshold, and a
checkpoint copies pages into the database file and syncs it: milliseconds that would stall the
event loop. The writer therefore never checkpoints itself (`wal_autocheckpoint=0`); every
`CHECKPOINT_EVERY` commits a checkpoint runs on the writer's thread, holding `write_lock`, while
the loop goes on serving (writes wait for it, reads do not). It must exclude writes: SQLite only
starts the WAL file over at a write that finds every frame already copied, and a checkpoint run
beside a steady stream of commits never catches up with them, so the file grew without bound
(measured: 100 MB after 3,000 commits of seven pages, each commit slower as it extended the
file).

Erasing. A purge must leave the session's text nowhere in the files, but a plain DELETE only
marks its cells free (the bytes stay in the page until reused) and, in WAL mode, every earlier
version of every page stays in the WAL until a checkpoint has copied it and the log starts
over. `erasing()` therefore runs its transaction with `secure_delete` on, so SQLite overwrites
what it deletes with zeros, and then checkpoints with TRUNCATE: every frame copied into the
database file (whose pages now hold the zeros) and the WAL cut to zero bytes. `secure_delete`
is on for that transaction only: it writes each freed page again (measured: deleting a
contiguous 2.4 MB session, +20% time and +27% WAL bytes), which other deletes (pruning old
events) need not pay. The checkpoint waits for readers of older frames on the writer's thread,
up to `truncate_wait_ms`; a reader that stays (another process's open read) does not fail the
erasure: it is committed, and the periodic checkpoints truncate instead until one succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import TypeVar, cast

import aiosqlite

from metis.core.errors import ConfigError, StoreBusy
from metis.core.store.migrations import LATEST_VERSION, MIGRATIONS
from metis.core.store.search import register_functions

log = logging.getLogger(__name__)

T = TypeVar("T")
Statement = tuple[str, tuple[object, ...]]

_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
    "PRAGMA busy_timeout=5000",  # the writer's own is 0 once open: see `_begin`
)

WRITE_WAIT_S = 5.0
"""How long a write waits for another process's write lock before it fails with `StoreBusy`
(a 503 on the surfaces), as SQLite's `busy_timeout` did: long enough for another process's
short write (a prune's chunk), short enough that a request held behind a lock someone keeps
open answers within seconds."""

_BUSY_RETRY_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
"""The sleeps between two attempts at the write lock; the last repeats."""


CHECKPOINT_EVERY = 64
"""Commits between two WAL checkpoints: ~1,000 WAL pages of the per-turn transactions, SQLite's
own default threshold."""

TRUNCATE_WAIT_MS = 2000
"""How long an erasure's checkpoint waits for readers of older WAL frames (an export's or a
listing's read runs for milliseconds; another process's open read may never end)."""

STORE_FILE_MODE = 0o600
_SIDE_FILES = ("-wal", "-shm", "-journal")


def _chmod_private(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_IMODE(path.stat().st_mode) != STORE_FILE_MODE:
            path.chmod(STORE_FILE_MODE)


def restrict_store_modes(path: Path) -> None:
    """The store holds every prompt, reply and tool output: owner-only (0600). The file is
    created 0600 before SQLite opens it, and SQLite gives its `-wal`, `-shm` and journal the
    database file's mode; files left wider by an older metis are tightened here."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, STORE_FILE_MODE))
    for each in (path, *(path.with_name(path.name + suffix) for suffix in _SIDE_FILES)):
        _chmod_private(each)


class StoreUnusable(sqlite3.DatabaseError):
    """The store's file cannot be opened or brought to the current schema (not a database, a
    damaged one, no access). It carries the file's path, so `metis serve` can say which file
    in one line where SQLite's own error came as a traceback naming none; it stays an
    `sqlite3.Error` (with SQLite's message) for callers that already say the path."""

    def __init__(self, path: Path, exc: sqlite3.Error) -> None:
        super().__init__(str(exc))
        self.path = path


class Database:
    """The SQLite file: one writer connection behind `write_lock`, one query-only reader, the schema
    and extension migration tracks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self.write_lock = asyncio.Lock()
        self.write_wait_s = WRITE_WAIT_S
        self.truncate_wait_ms = TRUNCATE_WAIT_MS
        self._read_lock = asyncio.Lock()
        self._commits_since_checkpoint = 0
        self._checkpoint: asyncio.Task[None] | None = None
        self._erase_pending = False
        self.schema_version = 0
        self._tracks: dict[str, tuple[str, ...]] = {}
        self.track_versions: dict[str, int] = {}

    def add_track(self, name: str, migrations: Sequence[str]) -> None:
        """A named migration track of an extension's own tables, versioned apart from the
        core schema (`user_version`) in the `schema_tracks` table; applied by `open()`.
        `migrations[i]` upgrades the track from version i to i + 1, like `MIGRATIONS`."""
        if self._writer is not None:
            raise RuntimeError("migration tracks are added before the database opens")
        self._tracks[name] = tuple(migrations)

    async def open(self) -> None:
        """Create the file with private modes, migrate the core schema and every extension track,
        then open the query-only reader."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        restrict_store_modes(self.path)
        try:
            self._writer = await self._connect()
        except sqlite3.Error as exc:
            raise StoreUnusable(self.path, exc) from exc
        try:
            await self._migrate(self._writer)
            for name, migrations in self._tracks.items():
                await self._migrate_track(self._writer, name, migrations)
            # see the module's docstring: no checkpoint inside a commit, no wait inside SQLite
            await self._writer.execute("PRAGMA wal_autocheckpoint=0")
            await self._writer.execute("PRAGMA busy_timeout=0")
            self._reader = await self._connect()
            await self._reader.execute("PRAGMA query_only=ON")
        except BaseException as exc:
            await self.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreUnusable(self.path, exc) from exc
            raise

    async def _connect(self) -> aiosqlite.Connection:
        # used from the event loop's thread too (see the module's docstring), never at once
        conn = await aiosqlite.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        try:
            for pragma in _PRAGMAS:
                await conn.execute(pragma)
        except BaseException:
            # a file that is not a database fails here: its connection's thread (not a daemon
            # thread) would otherwise keep the process from ever exiting
            await conn.close()
            raise
        return conn

    async def _migrate(self, conn: aiosqlite.Connection) -> None:
        async with conn.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        version = int(row[0]) if row else 0

        def record(conn: sqlite3.Connection, step: int) -> None:
            conn.execute(f"PRAGMA user_version = {step}")

        await register_functions(conn)  # the rules v4 fills the search text with
        await self._apply(conn, version, tuple(MIGRATIONS), "schema", f"v{version}", record)
        self.schema_version = LATEST_VERSION

    async def _migrate_track(
        self, conn: aiosqlite.Connection, name: str, migrations: tuple[str, ...]
    ) -> None:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_tracks (name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        async with conn.execute("SELECT version FROM schema_tracks WHERE name=?", (name,)) as cur:
            row = await cur.fetchone()
        version = int(row[0]) if row else 0

        def record(conn: sqlite3.Connection, step: int) -> None:
            conn.execute(
                "INSERT INTO schema_tracks (name, version) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET version=excluded.version",
                (name, step),
            )

        await self._apply(
            conn, version, migrations, f"{name} schema", f"{name}-v{version}", record, track=name
        )
        self.track_versions[name] = len(migrations)

    async def _apply(
        self,
        conn: aiosqlite.Connection,
        version: int,
        migrations: tuple[str, ...],
        what: str,
        backup_tag: str,
        record: Callable[[sqlite3.Connection, int], None],
        *,
        track: str | None = None,
    ) -> None:
        """One migration path for the core schema and every extension's track: refuse a newer
        version, back the file up before upgrading an existing one, then each step in its own
        transaction together with the version it reaches. An upgrade logs each step; a new
        database says once what it was set up at (a first start's output is for a person)."""
        latest = len(migrations)
        if version > latest:
            raise ConfigError(
                f"{self.path} has {what} version {version}, newer than this metis supports "
                f"({latest}); refusing to start (no downgrade)"
            )
        if 0 < version < latest:
            backup = _free_backup_path(self.path, backup_tag)
            log.info("backing up %s to %s before migrating", self.path, backup)
            await conn.execute("VACUUM INTO ?", (str(backup),))
            _chmod_private(backup)
        for step in range(version, latest):

            def migrate(plain: sqlite3.Connection, step: int = step) -> None:
                plain.execute("BEGIN IMMEDIATE")
                try:
                    for statement in _split_sql(migrations[step]):
                        plain.execute(statement)
                    record(plain, step + 1)
                    plain.execute("COMMIT")
                except BaseException:
                    if plain.in_transaction:  # as in `_immediate`: the error is what to tell
                        plain.execute("ROLLBACK")
                    raise

            await run_on_thread(conn, migrate)  # a step's statements in one round trip
            if version == 0:
                continue  # a new database: one line for all its steps, below
            if track is None:
                log.info("migrated %s to schema version %d", self.path, step + 1)
            else:
                log.info("migrated %s track %s to version %d", self.path, track, step + 1)
        if version == 0 and latest:
            log.info("set up %s at %s version %d", self.path, what, latest)

    @property
    def reader(self) -> aiosqlite.Connection:
        """The query-only connection: reads never wait behind the writer."""
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
        async with self.write_lock, self._immediate() as conn:
            yield conn
        self._committed()

    @asynccontextmanager
    async def erasing(self) -> AsyncIterator[aiosqlite.Connection]:
        """A `write()` whose deletes leave nothing readable in the files (a purge): see the
        module's docstring, "Erasing"."""
        async with self.write_lock:
            await self.writer.execute("PRAGMA secure_delete=ON")
            try:
                async with self._immediate() as conn:
                    yield conn
            finally:
                await self.writer.execute("PRAGMA secure_delete=OFF")
        self._committed()
        # whole even if the caller is cancelled: the writer is not handed on mid-checkpoint
        await asyncio.shield(self._truncate_wal(self.truncate_wait_ms))

    @asynccontextmanager
    async def _immediate(self) -> AsyncIterator[aiosqlite.Connection]:
        """`BEGIN IMMEDIATE … COMMIT` on the writer; the caller holds `write_lock`."""
        conn = self.writer
        await self._begin(lambda: conn.execute("BEGIN IMMEDIATE"))
        try:
            yield conn
        except BaseException:
            # Some errors (a full disk, an I/O error) have rolled back already: a ROLLBACK then
            # fails, and its "no transaction is active" would hide what went wrong.
            if conn.in_transaction:
                await conn.execute("ROLLBACK")
            raise
        try:
            await conn.execute("COMMIT")
        except sqlite3.Error:  # refused, so not left open for the next transaction to join
            if conn.in_transaction:
                await conn.execute("ROLLBACK")
            raise

    async def transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` in one `BEGIN IMMEDIATE … COMMIT` on the writer, on the event loop's thread.

        For writes whose statements need no await between them (the SQL is all known up front
        or computed from what the transaction itself reads). `work` gets the plain sqlite3
        connection; an exception rolls the transaction back and is re-raised here. Nothing
        awaits once it has begun, so a cancelled caller either never started it (still waiting
        for a lock) or has it committed whole.
        """
        async with self.write_lock:
            conn = _plain(self.writer)

            async def begin() -> None:  # at once, on this thread
                conn.execute("BEGIN IMMEDIATE")

            await self._begin(begin)
            try:
                result = work(conn)
                conn.execute("COMMIT")  # a COMMIT refused (a deferred constraint) rolls back too
            except BaseException:
                if conn.in_transaction:  # some errors (disk full, …) have already rolled back
                    conn.execute("ROLLBACK")
                raise
        self._committed()
        return result

    async def _begin(self, attempt: Callable[[], Awaitable[object]]) -> None:
        """`BEGIN IMMEDIATE` on the writer (under `write_lock`), retried with asyncio sleeps while
        another process holds the write lock, for up to `write_wait_s`."""
        waited, delays = 0.0, iter(_BUSY_RETRY_S)
        while True:
            try:
                await attempt()
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                    raise
                if waited >= self.write_wait_s:
                    # nothing was begun, so nothing is half-written: the caller's request can
                    # simply be repeated once the other process lets go (503, not 500)
                    log.warning(
                        "a write gave up after %.1f s: another process holds the write lock "
                        "of %s (an open sqlite3 transaction?)",
                        waited,
                        self.path,
                    )
                    raise StoreBusy(round(waited, 3)) from exc
            delay = next(delays, _BUSY_RETRY_S[-1])
            await asyncio.sleep(delay)
            waited += delay

    def _committed(self) -> None:
        """Count a commit; every `CHECKPOINT_EVERY` start a checkpoint unless one is running."""
        self._commits_since_checkpoint += 1
        if self._commits_since_checkpoint >= CHECKPOINT_EVERY and self._checkpoint is None:
            self._commits_since_checkpoint = 0
            self._checkpoint = asyncio.get_running_loop().create_task(self._checkpoint_wal())

    async def _checkpoint_wal(self) -> None:
        """A passive checkpoint on the writer's thread, between two writes: copies what no reader
        still needs, so that the next write starts the WAL over (see the module's docstring).
        While an erasure's WAL is still to be emptied, a truncating one instead, not waiting."""
        try:
            if self._erase_pending:
                await self._truncate_wal(wait_ms=0)
                return
            async with self.write_lock:
                await run_on_thread(
                    self.writer,
                    lambda conn: conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone(),
                )
        except sqlite3.Error as exc:  # the next one retries; nothing is lost meanwhile
            log.warning("WAL checkpoint failed: %s", exc)
        finally:
            self._checkpoint = None

    async def _truncate_wal(self, wait_ms: int) -> None:
        """Copy every WAL frame into the database file and cut the WAL to zero bytes, waiting up
        to `wait_ms` (on the writer's thread, writes held) for readers of older frames to finish.
        A reader that stays (another process's open read) leaves the WAL as it is: the erasure
        stands committed, and the periodic checkpoints truncate instead until one succeeds."""
        try:
            async with self.write_lock:
                busy = await run_on_thread(self.writer, lambda conn: _truncate(conn, wait_ms))
            why = "a reader still uses it"
        except sqlite3.Error as exc:
            busy, why = True, str(exc)
        if busy and not self._erase_pending:
            log.warning("the WAL could not be emptied (%s); retried at the next checkpoint", why)
        self._erase_pending = busy

    async def fetchone(self, sql: str, params: tuple[object, ...] = ()) -> sqlite3.Row | None:
        """One row (a read by key), on the event loop's thread; the cursor is closed at once so
        the read transaction ends.

        On the writer when no write holds it: no transaction is open there then, so it reads
        what is committed, like the reader, and its page cache is always current (every change
        is its own), where the reader drops its cache at its first read after another
        connection's commit (measured: the session row read by each turn's submission, 82 µs
        on the reader, 55 µs on the writer). While a write holds the writer, the reader
        answers: a read never waits behind a write.
        """
        if self._writer is not None and not self.write_lock.locked():
            return _first_row(_plain(self._writer), sql, params)  # no await: the lock stays free
        async with self._read_lock:
            return _first_row(_plain(self.reader), sql, params)

    async def fetchall(self, sql: str, params: tuple[object, ...] = ()) -> list[sqlite3.Row]:
        """Every row on the reader, on its thread: a listing or a whole history may be long."""
        return await self.read(lambda conn: conn.execute(sql, params).fetchall())

    async def read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work(connection)` on the reader's thread: a read that decides row by row what it
        keeps and when to stop (a search), in one round trip."""
        async with self._read_lock:
            return await run_on_thread(self.reader, work)

    async def close(self) -> None:
        if self._checkpoint is not None:
            await asyncio.wait([self._checkpoint])  # it logs its own failure
        for conn in (self._reader, self._writer):
            if conn is not None:
                await conn.close()
        self._reader = self._writer = None


async def run_on_thread(conn: aiosqlite.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """`work(sqlite3 connection)` on `conn`'s own thread: one round trip however many statements.

    Queued behind every call already sent to that thread, so it keeps their order (inside a
    `write()` transaction too). aiosqlite has no public way to run a function on its thread;
    `_execute` is the method each of its own calls goes through.
    """
    execute = cast(Callable[[Callable[[], T]], Awaitable[T]], conn._execute)
    return await execute(lambda: work(_plain(conn)))


def _plain(conn: aiosqlite.Connection) -> sqlite3.Connection:
    """The sqlite3 connection under an aiosqlite one (which keeps it private)."""
    return conn._conn


def _first_row(
    conn: sqlite3.Connection, sql: str, params: tuple[object, ...]
) -> sqlite3.Row | None:
    with closing(conn.execute(sql, params)) as cursor:
        row: sqlite3.Row | None = cursor.fetchone()
        return row


def _truncate(conn: sqlite3.Connection, wait_ms: int) -> bool:
    """`wal_checkpoint(TRUNCATE)` with SQLite's own wait for readers set to `wait_ms` (the
    writer's is 0, see the module's docstring); True when readers kept it from completing."""
    conn.execute(f"PRAGMA busy_timeout={int(wait_ms)}")
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.execute("PRAGMA busy_timeout=0")
    return bool(busy)


def execute_all(conn: sqlite3.Connection, statements: list[Statement]) -> None:
    """Run prepared statements in order, inside a transaction (`Database.transaction`)."""
    for sql, params in statements:
        conn.execute(sql, params)


def _free_backup_path(path: Path, tag: str) -> Path:
    """`metis.db.pre-v1.bak`, or `metis.db.pre-v1-2.bak`, `-3`, … when an earlier upgrade from
    the same version left its backup and then stopped (a crash, a full disk, a failing step):
    `VACUUM INTO` refuses an existing file, so reusing the name kept the daemon from ever
    starting again, and that earlier backup is not ours to overwrite."""
    backup = path.with_name(f"{path.name}.pre-{tag}.bak")
    attempt = 1
    while backup.exists():
        attempt += 1
        backup = path.with_name(f"{path.name}.pre-{tag}-{attempt}.bak")
    return backup


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (our scripts have no ';' inside literals)."""
    return [s.strip() for s in script.split(";") if s.strip()]
