"""Canonical vocabulary shared by every layer: ids, time, money, content blocks, messages, usage.

Everything here is pure (no I/O, no HTTP), so providers, tools, the store and all three
surfaces agree on one representation and one serializer for each concept.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import random
import re
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import from_json

from metis.core.errors import InvalidContent

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MAX_IMAGE_BYTES = 5 * 1024 * 1024
IMAGE_MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
# A ULID's 26 Crockford base32 characters (the first at most 7: 128 bits); also the pattern
# the OpenAPI document declares for ids, so the two cannot differ.
ULID_CHARS = "[0-7][0-9A-HJKMNP-TV-Z]{25}"
_ULID_RE = re.compile(rf"^{ULID_CHARS}\Z")

# ---------------------------------------------------------------------------------------------
# Identifiers
# ---------------------------------------------------------------------------------------------

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits → two characters
_ulid_lock = threading.Lock()
_ulid_random = random.Random(os.urandom(16))
_last_ulid = 0


def _encode_ulid(value: int) -> str:
    """128 bits as 26 Crockford base32 characters: 48-bit time (10), 80 random bits (16).

    Encoded in three word-sized parts (shifting one 128-bit integer twelve times costs more
    than everything else in `new_ulid`).
    """
    p = _PAIRS
    ts, rnd = value >> 80, value & 0xFFFFFFFFFFFFFFFFFFFF
    hi, lo = rnd >> 40, rnd & 0xFFFFFFFFFF
    return (
        p[ts >> 40]
        + p[(ts >> 30) & 0x3FF]
        + p[(ts >> 20) & 0x3FF]
        + p[(ts >> 10) & 0x3FF]
        + p[ts & 0x3FF]
        + p[hi >> 30]
        + p[(hi >> 20) & 0x3FF]
        + p[(hi >> 10) & 0x3FF]
        + p[hi & 0x3FF]
        + p[lo >> 30]
        + p[(lo >> 20) & 0x3FF]
        + p[(lo >> 10) & 0x3FF]
        + p[lo & 0x3FF]
    )


def new_ulid() -> str:
    """A ULID strictly greater than every earlier one of this process.

    Id order must equal creation order (cursors, message pages and replay rely on it), which a
    plain ULID only promises across milliseconds. Generated here rather than with python-ulid:
    its constructor costs ~20 µs, over half of an event's budget on the bus.
    """
    global _last_ulid
    with _ulid_lock:
        value = (time.time_ns() // 1_000_000) << 80 | _ulid_random.getrandbits(80)
        if value <= _last_ulid:
            value = _last_ulid + 1
        _last_ulid = value
    return _encode_ulid(value)


def is_ulid(value: object) -> bool:
    return isinstance(value, str) and _ULID_RE.match(value) is not None


def new_session_id() -> str:
    return f"sess_{new_ulid()}"


def new_tool_use_id() -> str:
    return f"tu_{new_ulid()}"


def is_session_id(value: object) -> bool:
    return isinstance(value, str) and value.startswith("sess_") and is_ulid(value[5:])


# ---------------------------------------------------------------------------------------------
# Time: storage is integer unix microseconds, the wire form has exactly six fractional digits.
# ---------------------------------------------------------------------------------------------


def now_us() -> int:
    return time.time_ns() // 1000


def us_to_datetime(us: int) -> datetime:
    seconds, micros = divmod(us, 1_000_000)
    return datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=micros)


def datetime_to_us(value: datetime) -> int:
    if value.tzinfo is None:
        raise ValueError("naive datetimes are not accepted; use timezone-aware UTC")
    delta = value.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def format_us(us: int | None) -> str | None:
    """Wire timestamp `YYYY-MM-DDTHH:MM:SS.ffffffZ`."""
    if us is None:
        return None
    return us_to_datetime(us).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_datetime(value: datetime) -> str:
    return format_us(datetime_to_us(value))  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Money: one serializer for every cost string on every surface.
# ---------------------------------------------------------------------------------------------


def decimal_str(value: Decimal | int | str) -> str:
    """Plain positional notation, trailing fractional zeros stripped, zero as "0"."""
    d = Decimal(value)
    if not d.is_finite():
        raise ValueError(f"not a finite decimal: {value!r}")
    if d == 0:
        return "0"
    text = format(d, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def parse_decimal(value: str | Decimal | int) -> Decimal:
    return Decimal(value)


# ---------------------------------------------------------------------------------------------
# Content blocks (closed union, discriminator `type`)
# ---------------------------------------------------------------------------------------------


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Base64Source(_Frozen):
    type: Literal["base64"] = "base64"
    media_type: str
    data: str


class UrlSource(_Frozen):
    type: Literal["url"] = "url"
    url: str


ImageSource = Annotated[Base64Source | UrlSource, Field(discriminator="type")]


class TextBlock(_Frozen):
    type: Literal["text"] = "text"
    text: str


class ImageBlock(_Frozen):
    type: Literal["image"] = "image"
    source: ImageSource


class ThinkingBlock(_Frozen):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Frozen):
    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class ToolUseBlock(_Frozen):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ToolResultContent = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResultBlock(_Frozen):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: list[ToolResultContent]
    is_error: bool = False


ContentBlock = Annotated[
    TextBlock | ImageBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock,
    Field(discriminator="type"),
]
UserContentBlock = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]

CONTENT_BLOCK_ADAPTER: TypeAdapter[Any] = TypeAdapter(ContentBlock)
CONTENT_LIST_ADAPTER: TypeAdapter[list[Any]] = TypeAdapter(list[ContentBlock])
# Built once: constructing a TypeAdapter compiles its validator (~0.3 ms, paid on every turn
# when it was built inside `parse_user_content`).
USER_BLOCK_ADAPTER: TypeAdapter[Any] = TypeAdapter(UserContentBlock)

Role = Literal["user", "assistant", "system", "tool"]
MessageStatus = Literal["complete", "cancelled", "error"]


def text_of(blocks: list[Any]) -> str:
    """The text blocks of a content list joined with newlines (routing, planners, summaries)."""
    return "\n".join(b.text for b in blocks if isinstance(b, TextBlock))


# ---------------------------------------------------------------------------------------------
# Usage
# ---------------------------------------------------------------------------------------------


class TokenUsage(BaseModel):
    """Token buckets as reported (or estimated) by an adapter; the three input buckets are disjoint."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    estimated: bool = False


class Usage(BaseModel):
    """TokenUsage plus what core derives from it: Decimal cost, pricing version, latency."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cost_usd: Decimal = Decimal(0)
    pricing_version: str = ""
    latency_ms: int = 0
    estimated: bool = False

    def wire(self) -> dict[str, Any]:
        data = self.model_dump()
        data["cost_usd"] = decimal_str(self.cost_usd)
        return data


def compute_cost(usage: TokenUsage, pricing: Any) -> Decimal:
    """USD cost of one call from per-million-token prices, never quantized.

    Computed in a 28-significant-digit decimal context whatever the caller's context is, so
    the same usage always prices to the same Decimal.
    """
    with localcontext() as ctx:
        ctx.prec = 28
        total: Decimal = (
            Decimal(usage.input_tokens) * pricing.input_per_mtok
            + Decimal(usage.cache_read_tokens) * pricing.cache_read_per_mtok
            + Decimal(usage.cache_write_tokens) * pricing.cache_write_per_mtok
            + Decimal(usage.output_tokens) * pricing.output_per_mtok
        ) / Decimal(1_000_000)
    return total


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------


class MessageMetadata(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: MessageStatus = "complete"
    model: str | None = None
    provider: str | None = None
    routing: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    stop_reason: str | None = None
    tool_use_id: str | None = None
    provider_raw: dict[str, Any] | None = Field(default=None, exclude=False)

    def __eq__(self, other: object) -> bool:  # provider_raw is excluded from equality
        if not isinstance(other, MessageMetadata):
            return NotImplemented
        return self.model_dump(exclude={"provider_raw"}) == other.model_dump(
            exclude={"provider_raw"}
        )

    __hash__ = None  # type: ignore[assignment]


class Message(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    session_id: str
    turn_id: str | None
    role: Role
    content: list[ContentBlock]
    created_at_us: int
    metadata: MessageMetadata = Field(default_factory=MessageMetadata)
    schema_version: int = SCHEMA_VERSION

    @property
    def status(self) -> MessageStatus:
        return self.metadata.status

    def wire(self) -> dict[str, Any]:
        """The object every surface renders."""
        return {
            "id": self.id,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "role": self.role,
            "content": [b.model_dump(mode="json") for b in self.content],
            "created_at": format_us(self.created_at_us),
            "metadata": self.metadata.model_dump(mode="json", exclude_none=True),
            "schema_version": self.schema_version,
        }


_ALLOWED_BLOCKS: dict[str, tuple[type, ...]] = {
    "user": (TextBlock, ImageBlock),
    "assistant": (TextBlock, ThinkingBlock, RedactedThinkingBlock, ToolUseBlock),
    "tool": (ToolResultBlock,),
    "system": (TextBlock,),
}


def _image_errors(block: ImageBlock, max_image_bytes: int) -> list[str]:
    source = block.source
    if isinstance(source, UrlSource):
        return [] if source.url.startswith("https://") else ["image url must use https://"]
    errors: list[str] = []
    if source.media_type not in IMAGE_MEDIA_TYPES:
        errors.append(f"unsupported image media type {source.media_type!r}")
    try:
        raw = base64.b64decode(source.data, validate=True)
    except (binascii.Error, ValueError):
        return [*errors, "image data is not valid base64"]
    if len(raw) > max_image_bytes:
        errors.append(f"image is {len(raw)} bytes, over the {max_image_bytes}-byte limit")
    return errors


def content_errors(
    role: str, content: list[Any], *, max_image_bytes: int = MAX_IMAGE_BYTES
) -> list[dict[str, Any]]:
    """Role x block rules and per-block checks of a canonical message."""
    errors: list[dict[str, Any]] = []
    allowed = _ALLOWED_BLOCKS[role]
    if role in ("user", "system") and not content:
        errors.append({"index": None, "msg": f"a {role} message needs at least one block"})
    if role == "tool" and len(content) != 1:
        errors.append({"index": None, "msg": "a tool message holds exactly one tool_result"})
    for i, block in enumerate(content):
        if not isinstance(block, allowed):
            errors.append({"index": i, "msg": f"{block.type} blocks are not allowed in {role}"})
            continue
        if isinstance(block, TextBlock) and role in ("user", "system") and not block.text:
            errors.append({"index": i, "msg": "text must not be empty"})
        elif isinstance(block, ImageBlock):
            errors.extend({"index": i, "msg": m} for m in _image_errors(block, max_image_bytes))
        elif isinstance(block, ToolUseBlock) and not TOOL_NAME_RE.match(block.name):
            errors.append({"index": i, "msg": f"invalid tool name {block.name!r}"})
        elif isinstance(block, ToolResultBlock):
            for inner in block.content:
                if isinstance(inner, ImageBlock):
                    errors.extend(
                        {"index": i, "msg": m} for m in _image_errors(inner, max_image_bytes)
                    )
    return errors


def validate_message(message: Message, *, max_image_bytes: int = MAX_IMAGE_BYTES) -> None:
    """Checks run on every write; raise InvalidContent listing every problem found."""
    errors = content_errors(message.role, message.content, max_image_bytes=max_image_bytes)
    meta = message.metadata
    if meta.status != "complete" and message.role != "assistant":
        errors.append({"index": None, "msg": "only assistant messages may be cancelled/error"})
    if message.role == "assistant":
        if meta.status == "complete" and not message.content:
            errors.append({"index": None, "msg": "a complete assistant message needs content"})
        if meta.status != "complete":
            for i, b in enumerate(message.content):
                if isinstance(b, ToolUseBlock) or (
                    isinstance(b, ThinkingBlock) and not b.signature
                ):
                    errors.append({"index": i, "msg": "interrupted messages keep no tool_use"})
        if meta.status == "complete" and message.turn_id is not None:
            missing = [
                k
                for k in ("model", "provider", "usage", "routing", "stop_reason")
                if getattr(meta, k) is None
            ]
            if missing:
                errors.append({"index": None, "msg": f"metadata lacks {', '.join(missing)}"})
    if message.role == "tool" and message.content:
        block = message.content[0]
        if isinstance(block, ToolResultBlock) and meta.tool_use_id != block.tool_use_id:
            errors.append({"index": 0, "msg": "metadata.tool_use_id must equal the block's"})
    if errors:
        raise InvalidContent(errors)


def interrupted_form(content: list[Any]) -> list[Any]:
    """What a cancelled/error assistant message keeps: no tool_use, no unsigned thinking."""
    return [
        b
        for b in content
        if not isinstance(b, ToolUseBlock)
        and not (isinstance(b, ThinkingBlock) and not b.signature)
    ]


def parse_user_content(raw: Any, *, max_image_bytes: int = MAX_IMAGE_BYTES) -> list[Any]:
    """Client content (text and image blocks only) → canonical blocks, or InvalidContent.

    `max_image_bytes` is the configured limit (`limits.max_image_bytes`); the store's own
    check at write time uses the ceiling `MAX_IMAGE_BYTES`, which the setting cannot exceed."""
    if not isinstance(raw, list):
        raise InvalidContent([{"index": None, "msg": "content must be a list of blocks"}])
    blocks: list[Any] = []
    errors: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        try:
            blocks.append(USER_BLOCK_ADAPTER.validate_python(item))
        except ValidationError as exc:
            kind = item.get("type") if isinstance(item, dict) else None
            if isinstance(kind, str) and kind not in ("text", "image"):
                errors.append({"index": i, "msg": f"{kind!r} blocks are not allowed in user"})
            else:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                errors.append({"index": i, "msg": f"{where}: {first['msg']}".strip(": ")})
    if errors:
        raise InvalidContent(errors)
    more = content_errors("user", blocks, max_image_bytes=max_image_bytes)
    if more:
        raise InvalidContent(more)
    return blocks


# ---------------------------------------------------------------------------------------------
# Lenient reading: one bad row never makes a session unreadable
# ---------------------------------------------------------------------------------------------


def decode_content_lenient(
    message_id: str, content_json: str, metadata_json: str
) -> tuple[list[Any], MessageMetadata]:
    try:
        raw_blocks = json.loads(content_json)
        raw_meta = json.loads(metadata_json)
        if not isinstance(raw_blocks, list) or not isinstance(raw_meta, dict):
            raise ValueError("content must be a list and metadata an object")
        metadata = MessageMetadata.model_validate(raw_meta)
    except (ValueError, ValidationError) as exc:
        log.error("message %s is unreadable (%s); returned empty", message_id, type(exc).__name__)
        return [], MessageMetadata(status="error")
    blocks: list[Any] = []
    dropped: list[tuple[int, str]] = []
    for i, raw in enumerate(raw_blocks):
        try:
            blocks.append(CONTENT_BLOCK_ADAPTER.validate_python(raw))
        except ValidationError:
            kind = raw.get("type") if isinstance(raw, dict) else type(raw).__name__
            dropped.append((i, str(kind)))
    if dropped:
        log.warning("message %s: dropped unreadable blocks %s", message_id, dropped)
    return blocks, metadata


# The stored forms are compact JSON made by pydantic's Rust serializer (several times faster
# than model_dump + json.dumps; every message of every turn goes through them). Non-ASCII text
# is stored as UTF-8 rather than \u escapes; readers decode either.


def dump_content(content: list[Any]) -> str:
    return CONTENT_LIST_ADAPTER.dump_json(content).decode()


def dump_metadata(metadata: MessageMetadata) -> str:
    return metadata.model_dump_json(exclude_none=True)


# ---------------------------------------------------------------------------------------------
# Redaction of strings built from exceptions
# ---------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"\b(sk-[A-Za-z0-9_\-]{8,}|sk-ant-[A-Za-z0-9_\-]{8,}|atk_[A-Za-z0-9_\-]{8,})"
)
_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a configured key so that redact() removes it wherever it shows up."""
    if value and len(value) >= 4:
        _secrets.add(value)


def redact(text: str, limit: int | None = None) -> str:
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, "[redacted]")
    text = _TOKEN_RE.sub("[redacted]", text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


# A number can only overflow to infinity with a three-digit exponent: the walk below runs
# only for texts that have one.
_HUGE_EXPONENT = re.compile(r"[0-9][eE]\+?[0-9]{3,}")


def parse_client_json(text: str) -> Any:
    """A client's JSON text (REST and AAP bodies, WebSocket frames), RFC 8259 only.

    Stricter than `json.loads` where it matters downstream: an escaped lone surrogate cannot be
    stored or sent as UTF-8, and NaN, Infinity or a number overflowing to infinity (`1e999`)
    cannot be written back as JSON, so one stored value would break every later read. Raises
    ValueError for all of them.
    """
    value = from_json(text, allow_inf_nan=False)
    if _HUGE_EXPONENT.search(text) and _has_non_finite(value):
        raise ValueError("a number is out of range")
    return value


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


def canonical_json(value: Any) -> str:
    """Sorted-key compact JSON: the form hashed for `input_sha256` and sizes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Tool specifications: what a model is offered
# ---------------------------------------------------------------------------------------------

SideEffects = Literal["none", "read", "write", "execute", "network"]
ToolOrigin = Literal["builtin", "application"]


class ToolDefinition(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    title: str | None = None
    description: str = ""
    input_schema: dict[str, Any]
    side_effects: SideEffects = "none"
    origin: ToolOrigin = "builtin"
    path_fields: tuple[str, ...] = ()
    timeout_seconds: float | None = None
