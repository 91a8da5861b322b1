"""The gap-free hand-off: what a new subscriber receives before going live.

Attach and capture (H, W, the session summary, the message in progress) in one synchronous
step, then read the snapshot or the replay from the store. Live events emitted while those
reads are awaited wait in the client's queue; every bus event with seq ≤ H comes from the
store and every later one from the queue, so nothing is lost or duplicated at the hand-off.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from metis.core.application import Application, HandoffPoint, HubClient, SessionRow
from metis.core.canonical.ids import new_ulid
from metis.core.errors import CursorNotFound
from metis.core.events.envelope import Event
from metis.server.routes.sessions import render_session, session_annotations
from metis.server.ws.protocol import (
    Subscribe,
    SubscribeError,
    dumps,
    event_frame,
    subscribe_ack,
)

log = logging.getLogger(__name__)

LoadHook = Callable[[str], Awaitable[None]]
_ROW_READ_ATTEMPTS = 3
_REPLAY_PAGE = 1000


@dataclass
class Preamble:
    """Frames to send, in order, before the queue is drained; `last_sent_seq` is H."""

    frames: list[bytes] = field(default_factory=list)  # UTF-8 text frames
    last_sent_seq: int = 0
    replay_event_count: int = 0


@dataclass
class HandoffHooks:
    """Test hook: `before_load(kind)` runs between the hand-off point and the store reads
    (`kind` is "snapshot" or "replay"), so a test can emit events exactly there."""

    before_load: LoadHook | None = None


HOOKS = HandoffHooks()


async def open_stream(
    app: Application,
    client: HubClient,
    sub: Subscribe,
    hooks: HandoffHooks = HOOKS,
) -> Preamble:
    """Run the hand-off for `client` up to going live; raises SubscribeError (the client is then detached)."""
    session_id = client.session_id
    hub = app.streams
    # Events emitted but not yet committed are held from clients (stored before seen); commit
    # them now, so a backlog lands before H and is read from the store, not queued live.
    await app.flush()
    if not hub.knows(session_id):
        latest = await app.history.latest_event(session_id)
        if latest is not None:
            hub.note_event(session_id, latest.id, latest.seq)
    for _ in range(_ROW_READ_ATTEMPTS):
        # The summary must describe the state right after H: re-read the row if an event was
        # emitted while it was being read (the hand-off itself is the synchronous block below).
        before = hub.last_seq(session_id)
        row = await _read_row(app, session_id)
        if not sub.snapshot or hub.last_seq(session_id) == before:
            break
    # ---- the hand-off point: one synchronous step ----------------------------------------------
    point = hub.handoff_point(
        client, sub.filter.accept(), lambda: _unnamed_watermark(app, session_id)
    )
    session = render_session(app.sessions.view(row)) if sub.snapshot else None
    # ---- end of the synchronous step --------------------------------------------------------
    try:
        kind = "snapshot" if sub.snapshot else "replay" if sub.since is not None else None
        if hooks.before_load is not None and kind is not None:
            await hooks.before_load(kind)
        preamble = Preamble(last_sent_seq=point.seq)
        body: list[bytes] = []
        if sub.snapshot:
            assert session is not None
            session.update(await session_annotations(app, app.sessions.view(row)))
            body.append((await _snapshot(app, session_id, session, point)).encode())
        elif sub.since is not None:
            events = await _replay(app, row, sub, point)
            preamble.replay_event_count = len(events)
            body.extend(event_frame(e) for e in events)
        preamble.frames.append(dumps(subscribe_ack(sub, preamble.replay_event_count)).encode())
        preamble.frames.extend(body)
        preamble.frames.extend(
            event_frame(e, catch_up=True) for e in point.catch_up if sub.filter.matches(e)
        )
        return preamble
    except BaseException:
        hub.detach(client)
        raise


def _unnamed_watermark(app: Application, session_id: str) -> str:
    """W for a session none of whose messages an event of this process has named yet.

    Ids are minted in increasing order, and once a session is served only a
    turn holding its slot commits messages, each minted after the turn id. So with no such
    turn every message minted so far is committed and W is an id minted now; with one, W is
    its turn id, which leaves out what the turn may have committed before naming it (its user
    message before `turn.started`). Either way a message committed after the hand-off point has a
    greater id and stays out of the snapshot.
    """
    turn_id = app.turns.current_turn_id(session_id)
    return turn_id if turn_id is not None else new_ulid()


async def _read_row(app: Application, session_id: str) -> SessionRow:
    row = await app.history.session_row(session_id)
    if row is None:
        raise SubscribeError(
            "session_not_found", f"session {session_id} does not exist", session_id=session_id
        )
    return row


async def _snapshot(
    app: Application, session_id: str, session: dict[str, Any], point: HandoffPoint
) -> str:
    """The newest committed messages with id ≤ W. Ids all have the same length, so
    `id < W + "0"` is exactly `id ≤ W` for the store's exclusive `before` cursor."""
    before = point.message_watermark + "0"
    limit = app.settings.websocket.snapshot_messages
    page = await app.history.messages_page(session_id, before=before, limit=limit)
    return dumps(
        {
            "type": "snapshot",
            "session": session,
            "messages": [m.wire() for m in page.messages],
            "has_more_before": page.has_more_before,
            "snapshot_at_event_id": point.event_id,
            "snapshot_at_seq": point.seq,
        }
    )


async def _replay(
    app: Application, row: SessionRow, sub: Subscribe, point: HandoffPoint
) -> list[Event]:
    """Matching bus events with seq in (since, H], oldest first."""
    assert sub.since is not None
    await app.flush()
    try:
        since_seq = await app.history.seq_of(row.id, sub.since)
    except CursorNotFound:
        since_seq = None
    if since_seq is None or since_seq <= row.events_floor_seq:
        raise _cursor_expired(sub)
    limit = app.settings.websocket.replay_max_events
    types = sub.filter.stored_types
    if sub.filter.actors is None:
        events, more = await app.history.events_page(
            row.id, after_seq=since_seq, until_seq=point.seq, types=types, limit=limit
        )
    else:
        events, more = await _replay_by_actor(app, row.id, sub, since_seq, point.seq, limit)
    if more:
        raise SubscribeError(
            "replay_too_large",
            f"more than {limit} events to replay; subscribe with a snapshot",
            limit=limit,
            since=sub.since,
        )
    # `metis trace prune` may have run since the floor was read: rows it deleted are missing.
    pruned = await app.history.session_row(row.id)
    if pruned is not None and since_seq <= pruned.events_floor_seq:
        raise _cursor_expired(sub)
    return events


def _cursor_expired(sub: Subscribe) -> SubscribeError:
    return SubscribeError(
        "cursor_expired",
        "since is not a retained event of this session; subscribe with a snapshot",
        since=sub.since,
    )


async def _replay_by_actor(
    app: Application, session_id: str, sub: Subscribe, after: int, until: int, limit: int
) -> tuple[list[Event], bool]:
    """The store selects by type only; actor filters are applied page by page."""
    matched: list[Event] = []
    while True:
        page, more = await app.history.events_page(
            session_id,
            after_seq=after,
            until_seq=until,
            types=sub.filter.stored_types,
            limit=_REPLAY_PAGE,
        )
        matched.extend(e for e in page if sub.filter.matches(e))
        if len(matched) > limit:
            return matched[:limit], True
        if not more or not page:
            return matched, False
        after = page[-1].seq
