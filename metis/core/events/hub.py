"""SessionHub: the one ordering point for a session's live clients.

An inline bus subscriber (transient events included): each event is appended in O(1), with no
await, to the bounded queue of every client attached to its session, so every client sees bus
events and streaming deltas in exactly the order they were emitted. A client whose queue
overflows is detached at once and told out of band (`on_overflow`); it never misses an event
silently. Session end, purge and shutdown append an in-band close marker after the last event.

Bursts are paced, not dropped: a provider may deliver a whole reply in one socket read, and the
turn would then emit thousands of deltas without yielding, filling a fast reader's queue before
its writer ever runs. A queue past half its bound marks its client *pressed*; the turn's stream
loop then awaits `SessionHub.make_room` until the consumer has taken the queue down to a quarter.
Only a consumer that takes nothing for `stall_timeout_s` is detached as too slow.

The hub also keeps, per session, what a late joiner needs at its hand-off, updated in the same
synchronous step that delivers each event: the latest bus event (H), the message watermark (W,
the newest message id an event has referenced, so committed before that event) and the
assistant message being streamed (for catch-up frames).

Stored before seen (`hold_until_stored`): a client must never see an event, nor its seq, that a
crash could lose, or the restarted daemon would give that seq to another event and lose what
the client was shown. So the hub holds each bus event, and every streaming-only event emitted
behind it, until the trace writer reports the transaction holding it committed (`settled`), then
releases them in emission order; deltas emitted while nothing is held pass straight through.
A session with live clients asks the writer to commit at the next loop tick (`expedite`), so
everything one tick emitted shares one commit; a session nobody watches waits for the writer's
usual cadence. Everything the hub tracks for hand-offs is updated at release, so H is always stored.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from metis.core.events.catalog import SYSTEM_STREAM, TURN_TERMINAL
from metis.core.events.envelope import AnyEvent, Event, TransientEvent

log = logging.getLogger(__name__)

Accept = Callable[[AnyEvent], bool]

# Held events of a watched session past which its producer waits for their commit: a quarter of
# its smallest client queue, so a release always fits beside what pacing lets a queue hold.
_UNWATCHED_HOLD_LIMIT = 1 << 30


class DurableLog(Protocol):
    """What the hub needs of the trace writer: commit soon, commit everything now, and say
    which events each transaction stored (`on_settled`)."""

    on_settled: Callable[[list[Event], bool], None] | None

    def expedite(self) -> None:
        """Commit at the next event-loop tick instead of after the timer: a live client is waiting."""

    def flush(self) -> Awaitable[bool]:
        """Commit everything pending now; True if it was stored."""


# Bus events that reference a message committed before them, and the
# payload key holding its id. `llm.call_failed` counts only when it ends the call for good: a
# failure that will be retried happened before any content, so nothing was committed.
_MESSAGE_REFS = {
    "turn.started": "user_message_id",
    "llm.call_completed": "message_id",
    "llm.call_failed": "message_id",
    "tool.input_invalid": "result_message_id",
    "tool.completed": "result_message_id",
    "tool.failed": "result_message_id",
}


@dataclass(frozen=True)
class CloseMarker:
    """In-band close: sent after everything queued before it."""

    code: str
    ws_code: int = 1000


class SharedEvent:
    """One event as queued for every `shared` client of a session.

    Surfaces that send the same bytes to many clients (the WebSocket) memoise them in `data`
    (for the WebSocket, the whole frame), so ten sockets on one session encode and frame each
    event once, and that happens in the clients' writer tasks, never inside `bus.emit`.
    """

    __slots__ = ("data", "event")

    def __init__(self, event: AnyEvent) -> None:
        self.event = event
        self.data: bytes | None = None


QueueItem = AnyEvent | SharedEvent | CloseMarker


# -- the message being streamed (catch-up) ---------------------------------------------------


@dataclass
class _Block:
    kind: str  # "text" | "thinking" | "tool_use"
    chunks: list[str] = field(default_factory=list)
    signature: str | None = None
    tool_use_id: str | None = None
    tool_name: str | None = None
    final_input: dict[str, Any] | None = None
    ended: bool = False
    dropped: bool = False  # cut off by the output limit: never run


@dataclass
class StreamingMessage:
    """The assistant message in progress: `message.start` sent, and not yet named by a bus event.

    Deltas are accumulated per block (appending a chunk is O(1); joining happens only when a
    client actually joins mid-stream). The state outlives `message.complete` until a bus event
    names the message (`llm.call_completed` / `llm.call_failed`, which raise W): a client whose
    hand-off falls in between finds the message neither under W in its snapshot nor in its live
    queue, so its catch-up carries the whole message, `message.complete` included
    (the catch-up rule covers only the message still streaming; this closes the gap after it).
    """

    start: TransientEvent
    blocks: dict[int, _Block] = field(default_factory=dict)
    complete: TransientEvent | None = None

    @property
    def turn_id(self) -> str:
        return self.start.turn_id

    @property
    def message_id(self) -> Any:
        return self.start.payload.get("message_id")

    def apply(self, event: TransientEvent) -> None:
        """Add a delta to its block, or keep `message.complete`, so a client joining mid-stream gets
        the message so far in one piece."""
        p = event.payload
        index = p.get("content_block_index")
        if not isinstance(index, int):
            return
        kind = event.type
        if kind == "text.delta":
            self._block(index, "text").chunks.append(p["text"])
        elif kind == "thinking.delta":
            block = self._block(index, "thinking")
            block.chunks.append(p["text"])
            if p.get("signature") is not None:
                block.signature = p["signature"]
        elif kind == "tool.use_start":
            self.blocks[index] = _Block(
                "tool_use", tool_use_id=p["tool_use_id"], tool_name=p["tool_name"]
            )
        elif kind == "tool.use_input_delta":
            self._block(index, "tool_use", p["tool_use_id"]).chunks.append(p["partial_json"])
        elif kind == "tool.use_end":
            block = self._block(index, "tool_use", p["tool_use_id"])
            block.final_input, block.ended = p["final_input"], True
            block.dropped = bool(p.get("dropped"))

    def _block(self, index: int, kind: str, tool_use_id: str | None = None) -> _Block:
        """The block at `index`, created on its first delta (not built anew for every delta, as
        `setdefault` would: this runs once per streamed delta)."""
        block = self.blocks.get(index)
        if block is None:
            block = self.blocks[index] = _Block(kind, tool_use_id=tool_use_id)
        return block

    def catch_up(self) -> list[TransientEvent]:
        """Synthetic frames that rebuild the message so far: start, then one frame per block."""
        start = self.start
        message_id = start.payload["message_id"]

        def make(event_type: str, payload: dict[str, Any]) -> TransientEvent:
            return TransientEvent(
                start.session_id,
                start.turn_id,
                start.parent_event_id,
                event_type,
                {"message_id": message_id, **payload},
            )

        out = [start]
        for index in sorted(self.blocks):
            block = self.blocks[index]
            text = "".join(block.chunks)
            if block.kind == "text":
                out.append(make("text.delta", {"content_block_index": index, "text": text}))
            elif block.kind == "thinking":
                out.append(
                    make(
                        "thinking.delta",
                        {"content_block_index": index, "text": text, "signature": block.signature},
                    )
                )
            else:
                ids = {"content_block_index": index, "tool_use_id": block.tool_use_id}
                out.append(make("tool.use_start", {**ids, "tool_name": block.tool_name}))
                out.append(make("tool.use_input_delta", {**ids, "partial_json": text}))
                if block.ended:
                    ended = {**ids, "final_input": block.final_input}
                    if block.dropped:
                        ended["dropped"] = True
                    out.append(make("tool.use_end", ended))
        if self.complete is not None:
            out.append(self.complete)
        return out


@dataclass(frozen=True)
class HandoffPoint:
    """What a client's hand-off captured, all in one synchronous step."""

    event_id: str | None  # H: the session's latest bus event
    seq: int
    message_watermark: str  # W: the snapshot holds messages with id ≤ W
    catch_up: list[TransientEvent]


# -- clients ----------------------------------------------------------------------------------


class HubClient:
    """One live consumer of a session (a WebSocket, an SSE response) with its bounded queue."""

    def __init__(
        self,
        session_id: str,
        *,
        maxsize: int,
        accept: Accept | None = None,
        on_overflow: Callable[[], None] | None = None,
        name: str = "client",
        shared: bool = False,
        on_close_marker: Callable[[CloseMarker], None] | None = None,
    ) -> None:
        self.session_id = session_id
        self.maxsize = maxsize
        self.accept = accept
        self.on_overflow = on_overflow
        self.on_close_marker = on_close_marker
        self.name = name
        self.shared = shared
        self.queue: deque[QueueItem] = deque()
        self.wake = asyncio.Event()
        self.detached = False
        self.closed = asyncio.Event()  # set by the consumer once it sends nothing more
        # Pacing (see the module docstring): pressed past `high_water`, released at `low_water`.
        self.high_water = max(1, maxsize // 2)
        self.low_water = maxsize // 4
        self.room = asyncio.Event()
        self.room.set()
        self.pressed_set: set[HubClient] | None = None  # the hub's, while attached

    def offer(self, item: AnyEvent | SharedEvent) -> bool:
        """O(1), never waits; False means overflow (the hub then detaches this client)."""
        event = item.event if isinstance(item, SharedEvent) else item
        if self.accept is not None and not self.accept(event):
            return True
        queue = self.queue
        if len(queue) >= self.maxsize:
            return False
        queue.append(item)
        self.wake.set()
        if len(queue) >= self.high_water and self.room.is_set() and self.pressed_set is not None:
            self.room.clear()
            self.pressed_set.add(self)
        return True

    def taken(self) -> None:
        """The consumer took items off the queue: release the producer once it is low enough.
        Consumers that pop the deque directly call this after each batch."""
        if not self.room.is_set() and len(self.queue) <= self.low_water:
            self.release()

    def release(self) -> None:
        """Let the producer go on: the queue is down to its low-water mark."""
        self.room.set()
        if self.pressed_set is not None:
            self.pressed_set.discard(self)

    def push_close(self, marker: CloseMarker) -> None:
        """Append the in-band close marker after the last event; it bypasses the bound so a full
        queue still closes."""
        self.queue.append(marker)  # bypasses the bound: it must always fit
        self.wake.set()
        if self.on_close_marker is not None:
            try:
                self.on_close_marker(marker)
            except Exception:
                log.exception("close callback of %s failed", self.name)

    async def get(self) -> QueueItem:
        """The next queued item, waiting for one if the queue is empty."""
        while not self.queue:
            self.wake.clear()
            await self.wake.wait()
        item = self.queue.popleft()
        self.taken()
        return item


@dataclass(eq=False)
class _SessionLive:
    session_id: str
    clients: list[HubClient] = field(default_factory=list)
    last_event_id: str | None = None
    last_seq: int = 0
    watermark: str | None = None  # None until an event of this process names a message
    streaming: StreamingMessage | None = None
    # Stored before seen: events waiting for their commit, in emission order.
    held: deque[AnyEvent] = field(default_factory=deque)
    hold_limit: int = _UNWATCHED_HOLD_LIMIT
    # Set while the producer may go on; cleared (and the session in `SessionHub.pressed`)
    # while `held` is past `hold_limit`.
    room: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.room.set()

    def clients_changed(self) -> None:
        sizes = [c.maxsize for c in self.clients]
        self.hold_limit = max(1, min(sizes) // 4) if sizes else _UNWATCHED_HOLD_LIMIT

    def track_bus(self, event: Event) -> None:
        self.last_event_id, self.last_seq = event.id, event.seq
        key = _MESSAGE_REFS.get(event.type)
        if key is not None:
            if event.type == "llm.call_failed" and event.payload.get("will_retry"):
                return
            ref = event.payload.get(key)
            if isinstance(ref, str) and (self.watermark is None or ref > self.watermark):
                self.watermark = ref
            if self.streaming is not None and self.streaming.message_id == ref:
                self.streaming = None  # under W now: the snapshot holds it
        elif (
            event.type in TURN_TERMINAL
            and self.streaming is not None
            and self.streaming.turn_id == event.turn_id
        ):
            self.streaming = None  # defensive: a turn that died mid-stream leaves nothing open

    def track_streaming(self, event: TransientEvent) -> None:
        if event.type == "message.start":
            self.streaming = StreamingMessage(event)
        elif event.type == "message.complete":
            streaming = self.streaming
            if streaming is not None and streaming.message_id == event.payload.get("message_id"):
                streaming.complete = event
            else:
                self.streaming = None
        elif self.streaming is not None:
            self.streaming.apply(event)


@dataclass
class _Token:
    session_id: str
    expires_at: float


class SessionHub:
    """The live clients of every session, their bounded queues and attach tokens; shows clients only
    events that are stored (or streaming-only) and detaches a client that stalls."""

    def __init__(
        self,
        *,
        token_ttl_s: float = 60.0,
        tokens_per_session: int = 100,
        stall_timeout_s: float = 10.0,
    ) -> None:
        self._sessions: dict[str, _SessionLive] = {}
        # Clients whose queue is past its high-water mark, and sessions holding more uncommitted
        # events than their clients could take at once: a producer checks this (empty almost
        # always) once per delta, so the common case costs one truth test.
        self.pressed: set[HubClient | _SessionLive] = set()
        self._durable: DurableLog | None = None
        self.stall_timeout_s = stall_timeout_s
        # Attach tokens: by token (to check one), by session (oldest first: to cap and revoke
        # them) and in minting order, which is expiry order (one TTL, a monotonic clock): a mint
        # costs the same however many sessions hold tokens.
        self._tokens: dict[str, _Token] = {}
        self._tokens_of: dict[str, dict[str, None]] = {}
        self._expiries: deque[tuple[float, str]] = deque()
        self.token_ttl_s = token_ttl_s
        self.tokens_per_session = tokens_per_session
        self.clock: Callable[[], float] = time.monotonic
        self._sweep: asyncio.TimerHandle | None = None

    def _live(self, session_id: str) -> _SessionLive:
        live = self._sessions.get(session_id)
        if live is None:
            live = self._sessions[session_id] = _SessionLive(session_id)
        return live

    # -- stored before seen -------------------------------------------------------------------

    def hold_until_stored(self, writer: DurableLog) -> None:
        """From now on release bus events to clients only once `writer` has committed them (it
        calls `settled` after each transaction). Without it (unit tests) events pass at once."""
        self._durable = writer
        writer.on_settled = self.settled

    def settled(self, batch: list[Event], stored: bool) -> None:
        """The writer's transaction holding `batch` committed (`stored`), or the batch is lost.

        Releases each affected session's held events up to the batch's last seq, in order,
        with the deltas held behind them. A lost event is never shown (the store does not have
        it): its clients see the `bus.gap_detected` that reports it instead."""
        if not stored:
            self._lost(batch)
            return
        marks: dict[str, int] = {}
        for event in batch:
            marks[event.session_id] = event.seq  # a batch is in emission order
        for session_id, seq in marks.items():
            live = self._sessions.get(session_id)
            if live is None or not live.held:
                continue
            held = live.held
            while held:
                item = held[0]
                if not item.transient and item.seq > seq:  # type: ignore[union-attr]
                    break
                held.popleft()
                self._deliver(live, item)
            if not held or len(held) < live.hold_limit:
                self._unpress(live)

    def _lost(self, batch: list[Event]) -> None:
        """Forget the held events of a batch the store does not have, and only those.

        Events held before them may still be stored: a change whose transaction fails puts the
        events that were waiting with it back in the writer's queue. Dropping everything up to
        the lost seqs, as a stored batch releases everything up to its own, hid those from live
        clients although the next flush stored them. The deltas no longer behind a held event go
        out at once, as they would have behind the lost ones."""
        lost: dict[str, set[int]] = {}
        for event in batch:
            lost.setdefault(event.session_id, set()).add(event.seq)
        for session_id, seqs in lost.items():
            live = self._sessions.get(session_id)
            if live is None or not live.held:
                continue
            held = live.held
            kept = [e for e in held if e.transient or e.seq not in seqs]  # type: ignore[union-attr]
            held.clear()
            held.extend(kept)
            while held and held[0].transient:
                self._deliver(live, held.popleft())
            if not held or len(held) < live.hold_limit:
                self._unpress(live)

    def _hold(self, live: _SessionLive, event: AnyEvent) -> None:
        held = live.held
        held.append(event)
        if not live.clients:
            return  # nobody watches: the writer's usual cadence releases it
        if not event.transient:
            self._durable.expedite()  # type: ignore[union-attr]
        elif len(held) >= live.hold_limit and live.room.is_set():
            live.room.clear()  # the producer waits in `make_room` for the commit
            self.pressed.add(live)
            self._durable.expedite()  # type: ignore[union-attr]

    def _unpress(self, live: _SessionLive) -> None:
        if not live.room.is_set():
            live.room.set()
            self.pressed.discard(live)

    # -- the bus side -------------------------------------------------------------------------

    def __call__(self, event: AnyEvent) -> None:
        """The inline bus subscriber: hold a stored event until the writer says it is stored, then
        append it to every client's queue; streaming-only events go out at once unless something is
        held before them."""
        session_id = event.session_id
        live = self._sessions.get(session_id)
        if live is None:
            if event.transient:
                return
            if session_id == SYSTEM_STREAM:
                self._on_system_event(event)  # type: ignore[arg-type]
                return
            live = self._sessions[session_id] = _SessionLive(session_id)
        if self._durable is not None and (live.held or not event.transient):
            self._hold(live, event)
            return
        self._deliver(live, event)

    def _deliver(self, live: _SessionLive, event: AnyEvent) -> None:
        """Track the event for hand-offs and queue it to every attached client."""
        if event.transient:
            live.track_streaming(event)  # type: ignore[arg-type]
        else:
            live.track_bus(event)  # type: ignore[arg-type]
        clients = live.clients
        if not clients:
            return
        shared: SharedEvent | None = None
        overflowed: list[HubClient] | None = None
        for client in clients:
            if client.shared:
                if shared is None:
                    shared = SharedEvent(event)
                ok = client.offer(shared)
            else:
                ok = client.offer(event)
            if not ok:
                overflowed = [*(overflowed or ()), client]
        for client in overflowed or ():
            self._overflow(live, client)

    def _on_system_event(self, event: Event) -> None:
        """System-stream events never reach session clients; a purge drops the session's state."""
        if event.type == "session.purged":
            purged = event.payload.get("purged_session_id")
            if isinstance(purged, str):
                self.forget(purged)

    async def make_room(self, session_id: str) -> None:
        """Wait until every pressed client of this session has taken its queue down to its
        low-water mark. A client that takes nothing for `stall_timeout_s` has stopped reading:
        it is detached as overflowed (told out of band) and the producer goes on.

        A session holding more uncommitted events than its clients could take at once waits
        for their commit first (the writer commits or reports them lost within its retries)."""
        for pressed in [c for c in self.pressed if c.session_id == session_id]:
            if isinstance(pressed, _SessionLive):
                await pressed.room.wait()
        for client in [c for c in self.pressed if c.session_id == session_id]:
            if not isinstance(client, HubClient):
                continue
            while not client.room.is_set():
                before = len(client.queue)
                try:
                    await asyncio.wait_for(client.room.wait(), self.stall_timeout_s)
                except TimeoutError:
                    if len(client.queue) >= before:  # took nothing in the whole interval
                        live = self._sessions.get(session_id)
                        if live is not None:
                            self._overflow(live, client)
                        else:
                            client.release()

    def _overflow(self, live: _SessionLive, client: HubClient) -> None:
        if client in live.clients:
            live.clients.remove(client)
            live.clients_changed()
        client.detached = True
        client.queue.clear()
        client.release()
        log.warning(
            "client %s of session %s overflowed its queue (capacity %d); detached",
            client.name,
            client.session_id,
            client.maxsize,
        )
        if client.on_overflow is not None:
            try:
                client.on_overflow()
            except Exception:
                log.exception("overflow callback of %s failed", client.name)

    # -- clients ------------------------------------------------------------------------------

    def attach(self, client: HubClient) -> None:
        """Start delivering the session's events to `client` (its hand-off point is taken
        separately)."""
        live = self._live(client.session_id)
        if client not in live.clients:
            live.clients.append(client)
            live.clients_changed()
        client.detached = False
        client.pressed_set = self.pressed  # type: ignore[assignment]
        if live.held and self._durable is not None:
            self._durable.expedite()  # held while nobody watched: release it soon

    def detach(self, client: HubClient) -> None:
        """Stop delivering to `client`; with no client left, held events wait for the usual commit
        instead of an expedited one."""
        live = self._sessions.get(client.session_id)
        if live is not None and client in live.clients:
            live.clients.remove(client)
            live.clients_changed()
            if not live.clients:
                self._unpress(live)  # nobody watches: held events wait for the usual commit
        client.detached = True
        client.release()  # a detached client never holds a producer back
        client.pressed_set = None

    def handoff_point(
        self, client: HubClient, accept: Accept | None, unnamed_watermark: Callable[[], str]
    ) -> HandoffPoint:
        """The hand-off, one synchronous step: from here on every
        matching event enters the client's queue, and everything up to the returned H is the
        client's to load from the store. Anything queued before (nothing but a close marker can
        be, since clients attach with a reject-all filter until they subscribe) is kept.

        W is always bounded, so messages committed after this step stay out of the snapshot:
        until an event of this process names one of the session's messages (a new session, or
        the first hand-off after a restart), `unnamed_watermark()` gives it, in this same step."""
        client.queue = deque(item for item in client.queue if isinstance(item, CloseMarker))
        client.accept = accept
        if not client.detached:
            self.attach(client)
        live = self._live(client.session_id)
        catch_up = live.streaming.catch_up() if live.streaming is not None else []
        watermark = live.watermark if live.watermark is not None else unnamed_watermark()
        return HandoffPoint(live.last_event_id, live.last_seq, watermark, catch_up)

    def last_seq(self, session_id: str) -> int:
        live = self._sessions.get(session_id)
        return live.last_seq if live else 0

    def knows(self, session_id: str) -> bool:
        """True once the hub has seen (or been told) the session's latest bus event."""
        live = self._sessions.get(session_id)
        return live is not None and live.last_event_id is not None

    def note_event(self, session_id: str, event_id: str, seq: int) -> None:
        """Seed the latest event of a session this process has not seen emit yet."""
        live = self._live(session_id)
        if seq > live.last_seq:
            live.last_event_id, live.last_seq = event_id, seq

    def client_count(self, session_id: str) -> int:
        live = self._sessions.get(session_id)
        return len(live.clients) if live else 0

    def sessions_with_clients(self) -> set[str]:
        return {sid for sid, live in self._sessions.items() if live.clients}

    async def close_session(
        self, session_id: str, *, code: str, ws_code: int = 1000, timeout: float = 5.0
    ) -> None:
        """Close every client in-band (after what is queued) and wait for them to finish.

        Called when the session is over for live clients (end, purge, shutdown), so its hand-off
        state is dropped too: no client can attach to it any more."""
        live = self._sessions.get(session_id)
        if live is None:
            return
        if live.held and self._durable is not None:
            await self._durable.flush()  # what is held goes out before the close marker
        clients = list(live.clients)
        live.clients.clear()
        live.clients_changed()
        self._unpress(live)
        for client in clients:
            client.detached = True
            client.push_close(CloseMarker(code, ws_code))
        if clients:
            await asyncio.wait(
                [asyncio.ensure_future(c.closed.wait()) for c in clients], timeout=timeout
            )
        if self._sessions.get(session_id) is live and not live.clients:
            del self._sessions[session_id]

    async def close_all(self, *, code: str, ws_code: int) -> None:
        """Shutdown: close every session's clients in-band."""
        await asyncio.gather(
            *(self.close_session(sid, code=code, ws_code=ws_code) for sid in list(self._sessions))
        )

    def forget(self, session_id: str) -> None:
        """Drop everything kept for a session (hand-off state, tokens): it ended or was purged."""
        live = self._sessions.pop(session_id, None)
        if live is not None:
            self._unpress(live)
        self.revoke_tokens(session_id)

    def holds(self, session_id: str) -> bool:
        """Whether anything of the session (hand-off state, clients, tokens) is in memory."""
        return session_id in self._sessions or session_id in self._tokens_of

    # -- attach tokens: in memory only, single use, scoped, short-lived -----------------------

    def mint_token(self, session_id: str) -> tuple[str, float]:
        """A single-use attach token for the session and its lifetime in seconds; past
        `tokens_per_session` the oldest are dropped."""
        now = self.clock()
        self._prune(now)
        mine = self._tokens_of.setdefault(session_id, {})
        while len(mine) >= self.tokens_per_session:
            oldest = next(iter(mine))
            del mine[oldest], self._tokens[oldest]
        token = "atk_" + base64.urlsafe_b64encode(secrets.token_bytes(24)).decode().rstrip("=")
        expires_at = now + self.token_ttl_s
        self._tokens[token] = _Token(session_id, expires_at)
        mine[token] = None
        self._expiries.append((expires_at, token))
        self._schedule_sweep()
        return token, self.token_ttl_s

    def check_token(self, token: str | None, session_id: str) -> str:
        """'ok' (consumed), 'invalid' or 'wrong_session' (not consumed); one synchronous step."""
        entry = self._tokens.get(token or "")
        if entry is None or entry.expires_at <= self.clock():
            return "invalid"
        if entry.session_id != session_id:
            return "wrong_session"
        self._drop_token(token or "")
        return "ok"

    def revoke_tokens(self, session_id: str) -> None:
        """Invalidate every attach token of the session (it is ending)."""
        for token in self._tokens_of.pop(session_id, {}):
            del self._tokens[token]

    def token_count(self, session_id: str | None = None) -> int:
        self._prune(self.clock())
        if session_id is None:
            return len(self._tokens)
        return len(self._tokens_of.get(session_id, ()))

    def _drop_token(self, token: str) -> None:
        entry = self._tokens.pop(token, None)
        if entry is None:
            return  # used, capped or revoked before it expired
        mine = self._tokens_of[entry.session_id]
        del mine[token]
        if not mine:
            del self._tokens_of[entry.session_id]

    def _prune(self, now: float) -> None:
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            self._drop_token(expiries.popleft()[1])

    def _schedule_sweep(self) -> None:
        """The periodic sweep: tokens nobody presents still leave memory within one TTL."""
        if self._sweep is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._sweep = loop.call_later(self.token_ttl_s, self._run_sweep)

    def _run_sweep(self) -> None:
        self._sweep = None
        self._prune(self.clock())
        if self._expiries:
            self._schedule_sweep()


def token_fingerprint(token: str) -> str:
    """What logs may show of a token: the first 8 hex characters of its sha256."""
    return hashlib.sha256(token.encode()).hexdigest()[:8]
