"""Content blocks: the closed union messages are made of, and the checks every write runs.

One pydantic model per block type, discriminated by `type`; providers, the store and every
surface convert to and from these, so a block means the same thing everywhere.
"""

import base64
import binascii
import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from metis.core.datamodel import DataModel, deferred_adapter
from metis.core.errors import InvalidContent

MAX_IMAGE_BYTES = 5 * 1024 * 1024
IMAGE_MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


class _Frozen(DataModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Base64Source(_Frozen):
    """Image bytes carried inline, base64-encoded, with their media type (size and type are checked
    on write)."""

    type: Literal["base64"] = "base64"
    media_type: str
    data: str


class UrlSource(_Frozen):
    """An image the provider fetches itself from a URL."""

    type: Literal["url"] = "url"
    url: str


ImageSource = Annotated[Base64Source | UrlSource, Field(discriminator="type")]


class TextBlock(_Frozen):
    """Plain text, in any role's message."""

    type: Literal["text"] = "text"
    text: str


class ImageBlock(_Frozen):
    """An image in a user message or a tool result."""

    type: Literal["image"] = "image"
    source: ImageSource


class ThinkingBlock(_Frozen):
    """The model's visible reasoning; the provider's signature must travel back with it on the next
    call."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Frozen):
    """Reasoning the provider returned encrypted; kept opaque and sent back as is."""

    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class ToolUseBlock(_Frozen):
    """A tool call by the model; `id` pairs it with its `tool_result`."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ToolResultContent = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResultBlock(_Frozen):
    """The answer to one tool call, sent to the model in the next user message."""

    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: list[ToolResultContent]
    is_error: bool = False


ContentBlock = Annotated[
    TextBlock | ImageBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock,
    Field(discriminator="type"),
]


UserContentBlock = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]
CONTENT_BLOCK_ADAPTER = deferred_adapter(ContentBlock)
CONTENT_LIST_ADAPTER = deferred_adapter(list[ContentBlock])


# One for the process: building a TypeAdapter's validator costs ~0.3 ms, paid on every turn
# when it was built inside `parse_user_content`.
USER_BLOCK_ADAPTER = deferred_adapter(UserContentBlock)


def text_of(blocks: list[Any]) -> str:
    """The text blocks of a content list joined with newlines (routing, planners, summaries)."""
    return "\n".join(b.text for b in blocks if isinstance(b, TextBlock))


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


def _sniff_image_type(head: bytes) -> str | None:
    """The media type the first bytes of an image say it is (of the four accepted), if any."""
    if head.startswith(b"\x89PNG"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def mislabelled_image(media_type: str, head: bytes, said_by: str = "media_type") -> str | None:
    """Why an image whose data begins with `head` (12 bytes suffice) is not the `media_type`
    its client gave in `said_by` (None when it is): the providers refuse such an image, and
    only once the turn has started, so a client's image is checked when it is sent."""
    sniffed = _sniff_image_type(head)
    if sniffed == media_type:
        return None
    if sniffed is None:
        return f"image data is not png, jpeg, gif or webp ({said_by} says {media_type})"
    return f"image data is {sniffed}, not {media_type} as {said_by} says"


def _mislabelled(block: ImageBlock) -> str | None:
    source = block.source
    if isinstance(source, UrlSource) or source.media_type not in IMAGE_MEDIA_TYPES:
        return None
    return mislabelled_image(source.media_type, base64.b64decode(source.data[:16]))


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
    mislabelled = [
        {"index": i, "msg": why}
        for i, block in enumerate(blocks)
        if isinstance(block, ImageBlock) and (why := _mislabelled(block)) is not None
    ]
    if mislabelled:
        raise InvalidContent(mislabelled)
    return blocks


def dump_content(content: list[Any]) -> str:
    """The JSON text a message's content is stored as."""
    return CONTENT_LIST_ADAPTER.dump_json(content).decode()
