"""The WebSocket wire: client frames in, server frames out.

Pure functions and pydantic models only, no I/O, so every parsing and filtering rule is
testable without a socket. The connection module decides *when* frames are sent; this module
decides what they look like.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictStr, ValidationError
from pydantic_core import to_json

from metis.core.canonical.ids import is_ulid
from metis.core.canonical.jsontext import parse_client_json
from metis.core.datamodel import DataModel
from metis.core.events.catalog import PERSISTED, STREAMING
from metis.core.events.envelope import AnyEvent
from metis.http.jsontext import dumps as dumps

PROTOCOL_VERSION = 1
MAX_CLOSE_REASON_BYTES = 123
MAX_NONCE_CHARS = 128

STREAMING_TYPES = frozenset(STREAMING)
KNOWN_TYPES = frozenset(PERSISTED) | STREAMING_TYPES
ACTORS = ("user", "agent", "system", "tool", "worker")
PRESETS: dict[str, frozenset[str]] = {
    "full": KNOWN_TYPES,
    "chat": STREAMING_TYPES
    | {
        "route.decided",
        "turn.started",
        "turn.completed",
        "turn.cancelled",
        "turn.failed",
        "llm.call_started",
        "llm.call_completed",
        "llm.call_failed",
        "tool.input_invalid",
        "tool.confirmation_requested",
        "tool.confirmation_resolved",
        "tool.called",
        "tool.completed",
        "tool.failed",
        "session.model_changed",
        "session.ended",
    },
}
SubscribeErrorCode = Literal[
    "session_not_found", "cursor_expired", "replay_too_large", "invalid_filter", "invalid_subscribe"
]


# -- client frames ----------------------------------------------------------------------------


class ProtocolViolation(Exception):
    """A frame the protocol cannot tolerate: close 1008 `protocol_error`."""


class SubscribeError(Exception):
    """A refused subscribe: `subscribe_error{code}`, then close 1008 with the same code."""

    def __init__(self, code: SubscribeErrorCode, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def frame(self) -> dict[str, Any]:
        return {
            "type": "subscribe_error",
            "code": self.code,
            "message": self.message,
            "details": self.details,
        }


class EventFilter(DataModel):
    """The object form of `subscribe.filter`; strict, because a silently ignored name would
    hide events the client believes it asked for."""

    model_config = ConfigDict(extra="forbid", strict=True)

    event_types: list[StrictStr] | None = Field(default=None, min_length=1)
    actors: list[Literal["user", "agent", "system", "tool", "worker"]] | None = Field(
        default=None, min_length=1
    )
    include_worker_sessions: StrictBool = False


class SubscribeFrame(DataModel):
    """`subscribe`: unknown top-level fields are ignored (forward compatibility)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["subscribe"]
    filter: Any = "preset:full"
    since: StrictStr | None = None
    snapshot: StrictBool = False


@dataclass(frozen=True)
class ResolvedFilter:
    preset: Literal["chat", "full"] | None
    event_types: frozenset[str]
    actors: frozenset[str] | None
    include_worker_sessions: bool

    def wire(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "event_types": sorted(self.event_types),
            "actors": sorted(self.actors) if self.actors is not None else None,
            "include_worker_sessions": self.include_worker_sessions,
        }

    def matches(self, event: AnyEvent) -> bool:
        return event.type in self.event_types and (
            self.actors is None or event.actor in self.actors
        )

    def accept(self) -> Callable[[AnyEvent], bool] | None:
        """The hub's per-event check; None (no call at all) when everything passes."""
        if self.actors is None and self.event_types >= KNOWN_TYPES:
            return None
        return self.matches

    @property
    def stored_types(self) -> list[str] | None:
        """The persisted types to select on replay: None means all of them, and an empty
        list none (streaming types are never stored, so they have nothing to replay)."""
        persisted = self.event_types & PERSISTED.keys()
        return None if persisted >= PERSISTED.keys() else sorted(persisted)


@dataclass(frozen=True)
class Subscribe:
    filter: ResolvedFilter
    since: str | None
    snapshot: bool
    raw_filter: Any


def resolve_filter(raw: Any) -> ResolvedFilter:
    if isinstance(raw, str):
        name = raw.removeprefix("preset:")
        if not raw.startswith("preset:") or name not in PRESETS:
            raise SubscribeError("invalid_filter", f"unknown filter preset {raw!r}", field="filter")
        return ResolvedFilter(name, PRESETS[name], None, False)  # type: ignore[arg-type]
    if not isinstance(raw, dict):
        raise SubscribeError(
            "invalid_filter", "filter must be a preset name or an object", field="filter"
        )
    try:
        parsed = EventFilter.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in ("filter", *first["loc"]))
        raise SubscribeError("invalid_filter", f"{where}: {first['msg']}", field=where) from None
    types = KNOWN_TYPES
    if parsed.event_types is not None:
        unknown = sorted({t for t in parsed.event_types if t not in KNOWN_TYPES})
        if unknown:
            raise SubscribeError(
                "invalid_filter",
                f"unknown event types: {', '.join(unknown)}",
                field="filter.event_types",
                unknown_event_types=unknown,
            )
        types = frozenset(parsed.event_types)
    actors = frozenset(parsed.actors) if parsed.actors is not None else None
    return ResolvedFilter(None, types, actors, parsed.include_worker_sessions)


def parse_subscribe(frame: dict[str, Any]) -> Subscribe:
    """Validate a first frame; raises SubscribeError (`invalid_subscribe`/`invalid_filter`)."""
    if frame.get("type") != "subscribe":
        raise SubscribeError(
            "invalid_subscribe",
            f"the first frame must be subscribe, not {frame.get('type')!r}",
            field="type",
        )
    try:
        parsed = SubscribeFrame.model_validate(frame)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SubscribeError("invalid_subscribe", f"{where}: {first['msg']}", field=where) from None
    if parsed.since is not None and parsed.snapshot:
        raise SubscribeError(
            "invalid_subscribe", "since and snapshot: true are exclusive", field="since"
        )
    if parsed.since is not None and not is_ulid(parsed.since):
        raise SubscribeError("invalid_subscribe", "since must be an event id (ULID)", field="since")
    return Subscribe(resolve_filter(parsed.filter), parsed.since, parsed.snapshot, parsed.filter)


def parse_frame(text: str) -> dict[str, Any]:
    """A client text frame: a JSON object with a string `type`, else ProtocolViolation."""
    try:
        frame = parse_client_json(text)
    except ValueError as exc:  # what is wrong with it, e.g. `duplicate key 'type'`
        raise ProtocolViolation(f"frame is not JSON: {exc}") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise ProtocolViolation("frame is not a JSON object with a string type")
    return frame


def nonce_of(frame: dict[str, Any]) -> str:
    nonce = frame.get("nonce")
    return nonce if isinstance(nonce, str) and len(nonce) <= MAX_NONCE_CHARS else ""


# -- server frames ----------------------------------------------------------------------------


def subscribe_ack(sub: Subscribe, replay_event_count: int) -> dict[str, Any]:
    return {
        "type": "subscribe_ack",
        "protocol": PROTOCOL_VERSION,
        "resolved_filter": sub.filter.wire(),
        "since": sub.since,
        "snapshot": sub.snapshot,
        "replay_event_count": replay_event_count,
    }


def event_frame(event: AnyEvent, *, catch_up: bool = False) -> bytes:
    """The UTF-8 text of an `event` frame; `pydantic_core.to_json` (about 3× `json` here,
    and this runs once per event a socket is sent)."""
    body = to_json(event.wire())
    if catch_up:
        return b'{"type":"event","catch_up":true,"event":' + body + b"}"
    return b'{"type":"event","event":' + body + b"}"


def close_reason(code: str, message: str) -> bytes:
    """`{"code","message"}` as compact UTF-8 JSON of at most 123 bytes (message truncated)."""
    data = dumps({"code": code, "message": message}).encode()
    while len(data) > MAX_CLOSE_REASON_BYTES and message:
        over = len(data) - MAX_CLOSE_REASON_BYTES
        message = message[: max(0, len(message) - max(1, over // 4))]
        data = dumps({"code": code, "message": message}).encode()
    return data


CLOSE_MESSAGES = {
    "session_ended": "the session ended",
    "session_purged": "the session was purged",
    "server_shutdown": "the server is shutting down",
    "logged_out": "the browser session that opened this socket logged out",
    "unsupported_data": "binary frames are not supported",
    "subscribe_timeout": "no subscribe frame in time",
    "protocol_error": "protocol error",
    "client_too_slow": "the client fell too far behind; reconnect with since",
    "heartbeat_timeout": "no frame received for too long; reconnect with since",
    "message_too_big": "an inbound frame exceeded the size limit",
    "internal_error": "internal error; reconnect with since",
}
