"""The store: one repository per aggregate, one transaction object, and extensions.

- `sessions` (sessions and turns), `messages` (messages and tool calls), `events` (the trace
  and its projections), `confirmations`, `titles` (session titles): typed reads on the reader
  connection, direct writes.
- `transaction()`: `async with store.transaction() as tx:` queues the repositories' write
  methods (`tx.sessions`, `tx.messages`, `tx.confirmations`, an extension's through
  `tx.using(...)`) and commits them in one transaction (see `tx.py`).
- `register(extension)`: a surface's own tables. The extension brings its migrations (a named
  track, versioned apart from the core schema), its repository (which reads through `db` and
  writes through `tx.using`), and a start-up recovery hook run by `recover_extensions()`.
  Extensions are registered before `open()`.

All SQL lives in this package and in the registered extensions' store modules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from metis.core.store.confirmations import ConfirmationStore
from metis.core.store.db import Database
from metis.core.store.events import EventStore
from metis.core.store.messages import MessageStore
from metis.core.store.sessions import SessionStore
from metis.core.store.titles import TitleStore
from metis.core.store.tx import Transaction


@dataclass(frozen=True)
class StoreExtension:
    """A surface's tables: `migrations` are the steps of its track `name`; `recover` runs at
    start-up, after the core's own recovery and before the daemon accepts requests."""

    name: str
    migrations: Sequence[str]
    recover: Callable[[], Awaitable[object]] | None = None


class Store:
    """The repositories over one database, the transaction factory and the registered extensions."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.sessions = SessionStore(db)
        self.messages = MessageStore(db)
        self.events = EventStore(db)
        self.confirmations = ConfirmationStore(db)
        self.titles = TitleStore(db)
        self._extensions: dict[str, StoreExtension] = {}

    def register(self, extension: StoreExtension) -> None:
        """Add an extension (before `open()`); registering a name again replaces it."""
        self.db.add_track(extension.name, extension.migrations)
        self._extensions[extension.name] = extension

    async def open(self) -> None:
        await self.db.open()

    async def recover_extensions(self) -> None:
        """Let each extension repair its own rows after a crash, before requests are served."""
        for extension in list(self._extensions.values()):
            if extension.recover is not None:
                await extension.recover()

    def transaction(self) -> Transaction:
        """A new write transaction: `async with store.transaction() as tx:`."""
        return Transaction(self.db)
