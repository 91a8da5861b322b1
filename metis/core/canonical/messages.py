"""Canonical messages: the stored unit of a session's history, and how a stored row is read back.

Reading is lenient (one unreadable row never makes a session unreadable); writing is strict
(`validate_message` runs on every write).
"""

import json
import logging
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from metis.core.canonical.content import (
    CONTENT_BLOCK_ADAPTER,
    MAX_IMAGE_BYTES,
    ContentBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    content_errors,
)
from metis.core.canonical.times import format_us
from metis.core.datamodel import DataModel
from metis.core.errors import InvalidContent

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
Role = Literal["user", "assistant", "system", "tool"]
MessageStatus = Literal["complete", "cancelled", "error"]


class MessageMetadata(DataModel):
    """What a message carries beside its content (status, model, usage, routing); unknown keys of
    old rows are ignored."""

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


class Message(DataModel):
    """One stored message of a session, immutable; the unit of history sent to providers."""

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


def decode_content_lenient(
    message_id: str, content_json: str, metadata_json: str
) -> tuple[list[Any], MessageMetadata]:
    """A stored message's content and metadata, dropping (and logging) what no longer parses instead
    of failing: old rows must stay readable."""
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


def dump_metadata(metadata: MessageMetadata) -> str:
    """The JSON text a message's metadata is stored as (null fields left out)."""
    return metadata.model_dump_json(exclude_none=True)
