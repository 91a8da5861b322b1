"""The store's write transaction: `async with store.transaction() as tx:`.

Each repository offers its write methods on `tx` (`tx.sessions`, `tx.messages`,
`tx.confirmations`; an extension's through `tx.using(ItsWrites)`). A write method validates
and prepares its statement at once and queues it; at `__aexit__` the queue runs as one
`BEGIN IMMEDIATE … COMMIT` (`Database.transaction`, on the event loop's thread).
Nothing is written if the block raises, and a queued write that raises
(e.g. a row already answered by someone else) rolls the whole transaction back and the
exception comes out of the `async with`.

Reads do not belong inside a transaction: they go to the repositories' read methods, which use
the reader connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from metis.core.store.confirmations import ConfirmationWrites
    from metis.core.store.db import Database
    from metis.core.store.messages import MessageWrites
    from metis.core.store.sessions import SessionWrites

Op = Callable[[sqlite3.Connection], object]
"""One queued write: runs inside the transaction, with the plain sqlite3 connection."""

W = TypeVar("W", bound="TxWrites")


class TxWrites:
    """Base of a repository's write methods bound to one transaction."""

    def __init__(self, tx: Transaction) -> None:
        self._tx = tx

    def _add(self, op: Op) -> None:
        self._tx.add(op)


class Transaction:
    """Queued writes of the repositories, run as one `BEGIN IMMEDIATE … COMMIT` when the block exits
    without raising."""

    def __init__(self, db: Database) -> None:
        from metis.core.store.confirmations import ConfirmationWrites
        from metis.core.store.messages import MessageWrites
        from metis.core.store.sessions import SessionWrites

        self._db = db
        self._ops: list[Op] = []
        self._done = False
        self.sessions: SessionWrites = SessionWrites(self)
        self.messages: MessageWrites = MessageWrites(self)
        self.confirmations: ConfirmationWrites = ConfirmationWrites(self)

    def add(self, op: Op) -> None:
        """Queue a write; refused once the transaction has ended."""
        if self._done:
            raise RuntimeError("this transaction has already ended")
        self._ops.append(op)

    def using(self, kind: type[W]) -> W:
        """An extension's write methods, queued in this same transaction."""
        return kind(self)

    def _run(self, conn: sqlite3.Connection) -> None:
        for op in self._ops:
            op(conn)

    def handed_over(self) -> Op:
        """The queued writes as one operation, for a transaction that someone else runs (the
        trace writer's, which stores the events announcing them in it); this one then ends."""
        self._done = True
        return self._run

    async def commit(self) -> None:
        """Run the queued writes as one transaction (nothing to do if none were queued)."""
        self._done = True
        if self._ops:
            await self._db.transaction(self._run)

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self._done = True  # nothing was written: the queue is dropped
            return
        await self.commit()
