"""SessionService: the session lifecycle every surface uses (create, list, get, patch, end, purge)
and session titles.

Surfaces translate wire ↔ these calls; every rule (workspace checks, sticky-model queuing,
end/purge ordering) lives here so the metis REST and the AAP façade behave identically.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from metis.config import Settings
from metis.core.canonical.ids import new_session_id
from metis.core.canonical.messages import Message
from metis.core.canonical.times import format_us, now_us
from metis.core.confirmations import ConfirmationBroker
from metis.core.errors import (
    SessionAlreadyEnded,
    SessionNotFound,
    WorkspaceInvalid,
    WorkspaceNotFound,
    WorkspaceRefused,
)
from metis.core.events.bus import EventBus
from metis.core.events.catalog import SYSTEM_STREAM
from metis.core.events.costs import CostAccumulator
from metis.core.keyed_lock import KeyedLock
from metis.core.models.registry import ModelRegistry
from metis.core.routing.engine import RoutingEngine
from metis.core.routing.manager import PolicyManager
from metis.core.sessions.cache import SessionCache
from metis.core.sessions.history import Flush, HistoryWriter, SurfaceWrites
from metis.core.sessions.search import SearchMatch, search_match, session_search
from metis.core.sessions.titles import title_from_prompt
from metis.core.store.sessions import SessionRow, SessionStore
from metis.core.store.titles import TitleStore
from metis.core.store.tx import Transaction
from metis.core.tools.sandbox import MetisHome, is_within
from metis.core.turns.control import TurnControl
from metis.core.turns.slots import TurnSlot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ListedView:
    """A session of a listing: its view, its title, and in a search's results why it is there
    (None when its id matched, or without a search)."""

    view: SessionView
    title: str | None
    match: SearchMatch | None


@dataclass(frozen=True)
class SessionView:
    """A session with its live state, ready for any surface to render."""

    row: SessionRow
    active_model: str | None
    cost_so_far_usd: Decimal
    current_turn_id: str | None
    current_turn_status: str | None
    pending_confirmations: list[dict[str, Any]]

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def ended(self) -> bool:
        return self.row.status == "ended"

    @property
    def pending_swap(self) -> dict[str, Any] | None:
        """The model swap queued behind the turn in flight, as the wire shows it; None when nothing
        is queued."""
        if not self.row.pending_model_set:
            return None
        return {"sticky_model": self.row.pending_model, "until_turn": self.current_turn_id}


@dataclass(frozen=True)
class ModelChange:
    """What setting a session's model did: the sticky model now, or the swap queued behind the turn
    in flight."""

    id: str
    active_model: str | None
    swap_queued: bool
    swap_queued_until_turn: str | None


@dataclass(frozen=True)
class PurgeResult:
    """What a purge deleted, and when the session had ended."""

    id: str
    ended_at_us: int
    messages_deleted: int
    events_deleted: int


def expand_workspace(raw: str) -> Path:
    """`raw` with a leading `~` or `~user` expanded: the one place a client's workspace value
    meets `expanduser`, which raises RuntimeError for an unknown user or an undeterminable
    home. Such a value names no directory: `WorkspaceInvalid`."""
    try:
        return Path(raw).expanduser()
    except RuntimeError as exc:
        raise WorkspaceInvalid(raw, "home_directory_unknown") from exc


def _workspace_filter(raw: str) -> str | None:
    """A list filter normalised as `resolve_workspace` stores paths; None matches nothing.
    A relative path is refused as `POST /sessions` refuses it (it is never resolved against
    the daemon's own working directory), not taken for a directory without sessions. A
    directory deleted or moved since still finds its sessions: the links above it that are
    still there are resolved, as they were when its sessions stored it."""
    if "\0" in raw:  # no file name holds one (os calls raise ValueError)
        return None
    path = expand_workspace(raw)
    if not path.is_absolute():
        raise WorkspaceInvalid(raw, "not_absolute")
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
        return None


# Directories no session works in unless an allowed root names them exactly: an agent with
# shell and write tools there reaches the whole system (or all of the user's files). Their
# descendants stay usable (`/usr/local/src/x`, `/var/www/site`), except on the pseudo
# filesystems below, where no project lives.
SYSTEM_DIRECTORIES = (
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/usr",
    "/var",
    # macOS
    "/Applications",
    "/Library",
    "/System",
    "/Users",
    "/Volumes",
    "/private",
    "/private/etc",
    "/private/var",
)
PSEUDO_FILESYSTEMS = ("/dev", "/proc", "/sys")


def protected_workspaces() -> frozenset[str]:
    """The system directories and the user's home, each as written and symlink-resolved
    (`/bin` may be `/usr/bin`, `/etc` may be `/private/etc`). METIS_HOME has its own, stricter
    rule (`MetisHome`)."""
    home: Path | None = None
    with contextlib.suppress(RuntimeError):  # no home directory can be determined
        home = Path.home()
    return _protected_paths(home)


@functools.lru_cache(maxsize=16)
def _protected_paths(home: Path | None) -> frozenset[str]:
    """Resolving ~30 paths is a syscall per path component: done once per home, not per
    request. System directories do not move."""
    paths = [Path(p) for p in SYSTEM_DIRECTORIES]
    if home is not None:
        paths.append(home)
    out: set[str] = set()
    for path in paths:
        out.add(str(path))
        with contextlib.suppress(OSError):
            out.add(str(path.resolve()))
    return frozenset(out)


def _protected(path: str, resolved: str, protected: frozenset[str]) -> bool:
    """`resolved` is a protected directory, or `path` (as written: `/proc/self/cwd` resolves
    elsewhere) or `resolved` lies on a pseudo file system."""
    if resolved in protected:
        return True
    written = os.path.normpath(path)
    return any(
        fs in protected and (is_within(fs, resolved) or is_within(fs, written))
        for fs in PSEUDO_FILESYSTEMS
    )


def resolve_workspace(
    raw: str,
    allowed_roots: tuple[Path, ...],
    protected: frozenset[str] = frozenset(),
    metis_home: MetisHome | None = None,
) -> str:
    """`~` expanded, absolute, existing, a readable directory; returned symlink-resolved.

    A `protected` directory (`protected_workspaces`) is refused unless `allowed_roots` lists
    exactly that directory: a root above it (say `/`) does not make `/etc` usable. So is a
    directory that holds `metis_home` (its tools could read the daemon's key but for the
    sandbox's own refusal, `Sandbox.in_metis_home`); one among the daemon's own files there
    never is. Paths are handled as strings: `pathlib` objects made up most of a session
    create's time.
    """
    if "\0" in raw:  # no file name holds one (os calls raise ValueError)
        raise WorkspaceNotFound(raw, "not_found")
    path = str(expand_workspace(raw))
    if not os.path.isabs(path):
        raise WorkspaceNotFound(raw, "not_absolute")
    try:
        mode = os.stat(path).st_mode
    except PermissionError as exc:  # a parent that may not be searched
        raise WorkspaceNotFound(raw, "not_accessible") from exc
    except OSError as exc:  # absent, a file as a parent, a symlink loop, a name too long
        raise WorkspaceNotFound(raw, "not_found") from exc
    if not stat.S_ISDIR(mode):
        raise WorkspaceNotFound(raw, "not_a_directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise WorkspaceNotFound(raw, "not_accessible")
    resolved = os.path.realpath(path, strict=True)
    if metis_home is not None and metis_home.private(resolved):
        raise WorkspaceRefused(raw, resolved, metis_home=metis_home.root)
    roots = [str(root) for root in allowed_roots]
    if resolved not in roots:
        if _protected(path, resolved, protected):
            raise WorkspaceRefused(raw, resolved)
        if metis_home is not None and is_within(resolved, metis_home.root):
            raise WorkspaceRefused(raw, resolved, holds=metis_home.root)
    if roots and not any(is_within(root, resolved) for root in roots):
        outside = f"outside the directories this daemon allows sessions in ({', '.join(roots)})"
        raise WorkspaceNotFound(raw, "not_accessible", outside)
    return resolved


@dataclass(frozen=True)
class NewSession:
    """A session being created, as a surface's seed sees it (its rows need the id and stamp)."""

    session_id: str
    workspace_path: str
    created_at_us: int


SessionSeed = Callable[[NewSession], tuple[Sequence[Message], SurfaceWrites | None]]
"""A surface's part of a new session: the messages it brings (AAP's seed history) and its own
rows, committed in the transaction that creates the session."""


class LiveClients(Protocol):
    """What a session's end asks of live delivery (the SessionHub): no new attach, and every
    attached client closed in-band."""

    def revoke_tokens(self, session_id: str) -> None:
        """No client may attach to the session any more."""

    async def close_session(
        self, session_id: str, *, code: str, ws_code: int = 1000, timeout: float = 5.0
    ) -> None:
        """Close every attached client in-band with `code` after its last event, waiting up to
        `timeout` for them to finish."""


class SessionService:
    """The session lifecycle. `forget_when_over` lists what each in-memory component drops
    of a session that is over (see `_release`)."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: SessionStore,
        titles: TitleStore,
        history: HistoryWriter,
        session_cache: SessionCache,
        bus: EventBus,
        flush: Flush,
        costs: CostAccumulator,
        broker: ConfirmationBroker,
        clients: LiveClients,
        registry: ModelRegistry,
        control: TurnControl,
        policy: PolicyManager,
        engine: RoutingEngine,
        forget_when_over: Sequence[Callable[[str], None]],
        metis_home: MetisHome,
    ) -> None:
        self._settings = settings
        self.store = store
        self._titles = titles
        self._history = history
        self._session_cache = session_cache
        self._bus = bus
        self._flush = flush
        self._costs = costs
        self._broker = broker
        self._clients = clients
        self._registry = registry
        self._control = control
        self._slots = control.slots
        self._policy = policy
        self._engine = engine
        self._forget_when_over = tuple(forget_when_over)
        self._protected = protected_workspaces()
        self._metis_home = metis_home
        # Sessions whose end (or purge) began in this process. An id stays once the end is
        # committed, so the synchronous steps that claim a turn slot or queue a PATCH refuse a
        # session that ended while they awaited (from the end's start on, they get 409).
        self._ending: set[str] = set()
        # An end or a purge of one session runs alone: the second of two sees what the first
        # left (an ended session, or none), never one half ended.
        self._ends = KeyedLock()

    # -- reads --------------------------------------------------------------------------------

    async def require(self, session_id: str) -> SessionRow:
        """The session's row, or `SessionNotFound` (also for a malformed id)."""
        row = await self.store.get(session_id) if session_id.startswith("sess_") else None
        if row is None:
            raise SessionNotFound(session_id)
        return row

    async def require_active(self, session_id: str) -> SessionRow:
        """The row of a session that is neither ended nor ending, else `SessionAlreadyEnded`
        (`SessionNotFound` once purged). An end in progress is waited for: the refusal then
        carries its `ended_at`, and an end that failed refuses nothing."""
        row = await self._after_an_end_in_progress(session_id, await self.require(session_id))
        if row is None:
            raise SessionNotFound(session_id)
        if row.status == "ended" or session_id in self._ending:
            raise SessionAlreadyEnded(session_id, _iso(row.ended_at_us))
        return row

    async def _after_an_end_in_progress(
        self, session_id: str, row: SessionRow | None
    ) -> SessionRow | None:
        """`row`, or, while an end or purge of the session runs, the row it leaves (None once
        purged). The wait holds nothing an end needs: callers hold no slot and no write."""
        if row is None or row.status == "ended" or session_id not in self._ending:
            return row
        async with self._ends.hold(session_id):
            return await self.store.get(session_id)

    def is_ending(self, session_id: str) -> bool:
        """Ending or ended here: checked with no await before a turn or PATCH takes effect."""
        return session_id in self._ending

    async def refusal(self, session_id: str) -> SessionAlreadyEnded | SessionNotFound:
        """The error for a turn or PATCH that lost the race with this session's end or purge,
        once that is over (so it carries the end's `ended_at`)."""
        row = await self._after_an_end_in_progress(session_id, await self.store.get(session_id))
        if row is None:
            return SessionNotFound(session_id)
        return SessionAlreadyEnded(session_id, _iso(row.ended_at_us))

    def view(self, row: SessionRow) -> SessionView:
        """The session as surfaces show it: the effective model, the live spend and the turn in
        flight."""
        slot = self._slots.current(row.id)
        sticky = row.active_model
        return SessionView(
            row=row,
            active_model=sticky or self._engine.default_model_for(row.workspace_path),
            # An ended session's spend is final in its row; the accumulator forgot it at the end.
            cost_so_far_usd=(
                row.cost_so_far_usd if row.status == "ended" else self._costs.session(row.id).cost
            ),
            current_turn_id=slot.turn_id if slot else None,
            current_turn_status=_slot_status(slot),
            pending_confirmations=self._broker.pending(row.id),
        )

    async def get(self, session_id: str) -> SessionView:
        return self.view(await self.require(session_id))

    async def model_state(self, session_id: str) -> ModelChange:
        """The session's model as a model PATCH answers it, for a PATCH that changed only the
        title: the swap still queued behind the running turn, else the model in force."""
        view = await self.get(session_id)
        swap = view.pending_swap
        if swap is not None:
            return ModelChange(session_id, swap["sticky_model"], True, swap["until_turn"])
        return ModelChange(session_id, view.active_model, False, None)

    async def list(
        self,
        *,
        limit: int,
        before_id: str | None,
        workspace_path: str | None,
        surface: str | None,
        status: str | None,
        text: str | None = None,
    ) -> tuple[list[ListedView], bool]:
        """A page of sessions, newest first, each with its title (`title`'s rule, read in the
        same query), and whether there are more; a workspace filter naming no usable directory
        matches nothing; `text` searches them (`search.py` says how), each found with where
        it says the words."""
        if workspace_path is not None:
            workspace_path = _workspace_filter(workspace_path)
            if workspace_path is None:
                return [], False
        search = None if text is None else session_search(text)
        listed, more = await self.store.page(
            limit=limit,
            before_id=before_id,
            workspace_path=workspace_path,
            surface=surface,
            status=status,
            search=search,
        )
        words = () if search is None else search.words
        views = []
        for s in listed:
            title = _title(s.set_title, s.prompt)
            views.append(ListedView(self.view(s.row), title, search_match(s.hit, words, title)))
        return views, more

    async def title(self, session_id: str) -> str | None:
        """A session's title: the one set, else the first line of its first user message
        (`title_from_prompt`); None with neither. One read by key on the loop's thread."""
        parts = await self._titles.parts(session_id)
        return None if parts is None else _title(*parts)

    # -- writes -------------------------------------------------------------------------------

    async def set_title(self, session_id: str, title: str | None) -> None:
        """Set the title (None: back to the first prompt's first line); an ended session's
        too. `SessionNotFound` when the session is gone, a purge committed meanwhile included."""
        if not await self._titles.set(session_id, title, now_us()):
            raise SessionNotFound(session_id)

    async def create(
        self,
        workspace_path: str,
        initial_active_model: str | None = None,
        *,
        surface: str = "metis",
        allowed_roots: tuple[Path, ...] | None = None,
        seed: SessionSeed | None = None,
    ) -> SessionView:
        """`allowed_roots` replaces the metis setting `allowed_workspace_roots` for a surface
        with roots of its own (the AAP façade), so one surface's setting never
        refuses the other's workspaces. `seed` is the surface's part of the new session (AAP:
        its configuration rows and seed history), created with it or not at all."""
        roots = self._settings.allowed_workspace_roots if allowed_roots is None else allowed_roots
        workspace = resolve_workspace(workspace_path, roots, self._protected, self._metis_home)
        sticky = (
            self._registry.require_configured(initial_active_model)
            if initial_active_model is not None
            else None
        )
        new = NewSession(new_session_id(), workspace, now_us())
        messages, surface_writes = seed(new) if seed is not None else ((), None)
        version = self._policy.version
        inserting = self.store.inserting(
            new.session_id, workspace, surface, sticky, version, new.created_at_us
        )
        inserted: list[SessionRow] = []

        def rows(tx: Transaction) -> None:
            tx.add(lambda conn: inserted.append(inserting(conn)))
            tx.messages.insert(*messages)
            if surface_writes is not None:
                surface_writes(tx, [*messages])

        payload = {
            "workspace_path": workspace,
            "active_model": sticky,
            "routing_policy_version": version,
            "surface": surface,
        }
        # Acknowledged with 201: the row, the surface's part and the first event are
        # committed together. Its history (the seed) is cached as it commits.
        self._session_cache.created_here(new.session_id)
        try:
            await self._history.commit_with(
                new.session_id,
                messages,
                rows,
                announce=lambda: self._bus.emit(
                    new.session_id, "session.created", payload, actor="user"
                ),
            )
        except Exception:
            self._session_cache.forget(new.session_id)
            raise
        return self.view(inserted[0])  # as inserted: its event changes no column

    async def set_active_model(self, session_id: str, reference: str | None) -> ModelChange:
        """PATCH: apply now when idle, else queue for the turn boundary (last PATCH wins)."""
        row = await self.require_active(session_id)
        model = self._registry.require_configured(reference) if reference is not None else None

        def holder() -> str | None:
            if self.is_ending(session_id):
                raise _EndedMeanwhile
            slot = self._slots.current(session_id)
            return slot.turn_id if slot else None

        try:
            queued_behind = await self.store.set_sticky_or_queue(
                session_id, model, now_us(), holder
            )
        except _EndedMeanwhile:
            raise await self.refusal(session_id) from None
        change = ModelChange(session_id, model, queued_behind is not None, queued_behind)
        self._bus.emit(
            session_id,
            "session.model_changed",
            {
                "previous_active_model": row.active_model,
                "active_model": model,
                "queued": change.swap_queued,
                "applies_after_turn_id": change.swap_queued_until_turn,
            },
            actor="user",
        )
        await self._flush()  # the 200 acknowledges the change and its event
        if change.active_model is None and not change.swap_queued:
            view = await self.get(session_id)
            return ModelChange(session_id, view.active_model, False, None)
        return change

    async def _begin_ending(self, session_id: str) -> SessionRow:
        row = await self.require(session_id)
        if row.status == "ended" or session_id in self._ending:
            raise SessionAlreadyEnded(session_id, _iso(row.ended_at_us))
        self._ending.add(session_id)  # synchronous: from here new turns and PATCH get 409
        self._clients.revoke_tokens(session_id)
        try:
            await self._control.stop_session(session_id)
        except BaseException:
            self._ending.discard(session_id)
            raise
        return row

    async def end(self, session_id: str) -> SessionView:
        """End a session: its row and `session.ended` are committed and its clients closed before
        this returns."""
        async with self._ends.hold(session_id):
            return await self._end(session_id)

    async def _end(self, session_id: str) -> SessionView:
        row = await self._begin_ending(session_id)
        try:
            stamp = now_us()
            await self.store.end(session_id, stamp)
            totals = self._costs.session(session_id)
            self._bus.emit(
                session_id,
                "session.ended",
                {
                    "disposition": "completed",
                    "turn_count": row.turn_count,
                    "total_cost_usd": totals.cost,
                    "duration_seconds": round((stamp - row.created_at_us) / 1_000_000, 6),
                },
                actor="user",
            )
            await self._clients.close_session(session_id, code="session_ended")
            await self._flush()  # the 200 acknowledges the end and its event
        except BaseException:
            self._ending.discard(session_id)
            raise
        self._release(session_id)
        return await self.get(session_id)

    def _release(self, session_id: str) -> None:
        """A session that is over (its end and every event flushed): drop what this process
        holds in memory for it, so a long-running daemon does not grow with every session it
        served. Reads of an ended session go to the store (history, spend, confirmations).

        Kept: the id in `_ending` (a request that read the row before the end may still be on
        its way to claiming a turn slot) and the bus's seq counter (an event on the stream
        must continue it); both are a few bytes, like the counters seeded at start-up."""
        for forget in self._forget_when_over:
            forget(session_id)

    async def purge(self, session_id: str) -> PurgeResult:
        """Delete a session's messages and events (ending it first if needed) and announce
        `session.purged` on the system stream. A purge that waited for another one finds no
        session (`SessionNotFound`): only one of them deleted anything."""
        async with self._ends.hold(session_id):
            return await self._purge(session_id)

    async def _purge(self, session_id: str) -> PurgeResult:
        row = await self.require(session_id)
        already_ended = row.status == "ended"
        if not already_ended:
            row = await self._begin_ending(session_id)
        else:
            self._ending.add(session_id)
            self._clients.revoke_tokens(session_id)
        try:
            await self._clients.close_session(session_id, code="session_purged")
            await self._flush()
            messages, events = await self.store.purge(session_id)
            ended_at = row.ended_at_us or now_us()
            self._bus.forget_stream(session_id)
            self._release(session_id)
            self._bus.emit(
                SYSTEM_STREAM,
                "session.purged",
                {
                    "purged_session_id": session_id,
                    "messages_deleted": messages,
                    "events_deleted": events,
                },
                actor="user",
            )
        except BaseException:
            self._ending.discard(session_id)
            raise
        return PurgeResult(session_id, ended_at, messages, events)

    async def discard(self, session_id: str) -> None:
        """Start-up: remove a session whose creation a crash interrupted (nobody was told it
        exists, so it has no end event): its rows, its seq counter and its totals."""
        await self.store.purge(session_id)
        self._bus.forget_stream(session_id)
        self._costs.forget_session(session_id)


class _EndedMeanwhile(Exception):
    """Raised inside a PATCH's write step when the session's end began while it awaited."""


def _slot_status(slot: TurnSlot | None) -> str | None:
    if slot is None:
        return None
    return "cancelling" if slot.status == "cancelling" else "in_flight"


def _iso(us: int | None) -> str | None:
    return format_us(us)


def _title(set_title: str | None, prompt: str | None) -> str | None:
    """The rule of a session's title: the one set, else its first prompt's first line."""
    return set_title if set_title is not None else title_from_prompt(prompt or "")
