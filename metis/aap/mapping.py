"""AAP messages and content blocks ⇄ canonical messages.

Client-supplied content keeps its form: a string comes back as the same string, a block list as
the same list (the form is recorded per message in `aap_message_forms`). Model-generated
messages render as a string when they are exactly one text block, else as a block list in
block order. Images travel only as `data:` URIs and are stored as media type + base64 text
exactly as received, so history re-renders the identical URI.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from metis.aap.errors import AapError
from metis.aap.store import ContentShape
from metis.core.canonical.content import (
    IMAGE_MEDIA_TYPES,
    TOOL_NAME_RE,
    Base64Source,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UrlSource,
    mislabelled_image,
)
from metis.core.canonical.messages import Message

_DATA_URI_RE = re.compile(r"^data:(image/[a-z]+);base64,(.*)$", re.DOTALL)
_ALLOWED: dict[str, tuple[str, ...]] = {
    "user": ("text", "image"),
    "assistant": ("text", "thinking", "tool_use"),
    "tool": ("text", "image"),
}


def invalid_content(message: str, where: str) -> AapError:
    return AapError("invalid_content", message, {"errors": [{"loc": where, "msg": message}]})


def parse_data_uri(url: str, max_bytes: int, where: str) -> ImageBlock:
    if not url.startswith("data:"):
        raise invalid_content("only data: image URIs are accepted; send a data: URI", where)
    match = _DATA_URI_RE.match(url)
    if match is None:
        raise invalid_content("image URI must be data:<type>;base64,<payload>", where)
    media_type, payload = match.group(1), match.group(2)
    if media_type not in IMAGE_MEDIA_TYPES:
        raise invalid_content(f"unsupported image type {media_type}", where)
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_content("image payload is not valid base64", where) from None
    if len(raw) > max_bytes:
        raise invalid_content(f"image is {len(raw)} bytes, over the {max_bytes}-byte limit", where)
    mislabelled = mislabelled_image(media_type, raw[:12], said_by="the data URI")
    if mislabelled is not None:
        raise invalid_content(mislabelled, where)
    return ImageBlock(source=Base64Source(media_type=media_type, data=payload))


def _block(role: str, raw: Any, max_image_bytes: int, where: str) -> Any:
    if not isinstance(raw, dict):
        raise invalid_content("a content block must be an object", where)
    kind = raw.get("type")
    if kind not in _ALLOWED[role]:
        raise invalid_content(f"block type {kind!r} is not allowed in {role} messages", where)
    if kind == "text":
        text = raw.get("text")
        if not isinstance(text, str):
            raise invalid_content("text blocks need a string `text`", where)
        if role == "user" and not text:
            raise invalid_content("text must not be empty", where)
        return TextBlock(text=text)
    if kind == "thinking":
        thinking = raw.get("thinking")
        if not isinstance(thinking, str):
            raise invalid_content("thinking blocks need a string `thinking`", where)
        return ThinkingBlock(thinking=thinking)
    if kind == "image":
        url = raw.get("url")
        if not isinstance(url, str):
            raise invalid_content("image blocks need a string `url`", where)
        return parse_data_uri(url, max_image_bytes, where)
    call_id, name, value = raw.get("toolCallId"), raw.get("name"), raw.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise invalid_content("tool_use blocks need a non-empty `toolCallId`", where)
    if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
        raise invalid_content("tool_use blocks need a valid tool `name`", where)
    if not isinstance(value, dict):
        raise invalid_content("tool_use `input` must be an object", where)
    return ToolUseBlock(id=call_id, name=name, input=value)


def parse_content(
    role: str, content: str | list[Any], *, max_image_bytes: int, where: str
) -> tuple[list[Any], ContentShape]:
    """Client content → canonical blocks and the form the client used."""
    if isinstance(content, str):
        if role == "user" and not content:
            raise invalid_content("user content must not be empty", where)
        return [TextBlock(text=content)], "string"
    if role in ("user", "tool") and not content:
        raise invalid_content(f"{role} content must not be an empty list", where)
    blocks = [_block(role, raw, max_image_bytes, f"{where}[{i}]") for i, raw in enumerate(content)]
    return blocks, "blocks"


# ---- rendering -------------------------------------------------------------------------------


def image_url(block: ImageBlock) -> str:
    source = block.source
    if isinstance(source, UrlSource):
        return source.url
    return f"data:{source.media_type};base64,{source.data}"


def render_block(block: Any) -> dict[str, Any] | None:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.thinking}
    if isinstance(block, ToolUseBlock):
        return {
            "type": "tool_use",
            "toolCallId": block.id,
            "name": block.name,
            "input": block.input,
        }
    if isinstance(block, ImageBlock):
        return {"type": "image", "url": image_url(block)}
    if isinstance(block, RedactedThinkingBlock):
        return None  # opaque provider data with no AAP form
    return None


def render_content(blocks: Sequence[Any], form: ContentShape | None) -> str | list[dict[str, Any]]:
    rendered = [b for b in (render_block(x) for x in blocks) if b is not None]
    if form == "string" or (form is None and len(rendered) == 1 and rendered[0]["type"] == "text"):
        return "".join(b["text"] for b in rendered if b["type"] == "text")
    return rendered


def render_message(message: Message, form: ContentShape | None = None) -> dict[str, Any] | None:
    """One stored message as an AAP HistoryMessage; None for a row with nothing to show."""
    if message.role == "tool":
        block = message.content[0] if message.content else None
        if not isinstance(block, ToolResultBlock):
            return None
        return {
            "role": "tool",
            "toolCallId": block.tool_use_id,
            "content": render_content(block.content, form),
        }
    if message.role == "system":
        return {
            "role": "system",
            "content": "".join(b.text for b in message.content if isinstance(b, TextBlock)),
        }
    rendered: dict[str, Any] = {
        "role": message.role,
        "content": render_content(message.content, form),
    }
    if message.role == "assistant" and message.metadata.status != "complete":
        rendered["interrupted"] = True  # metis: metadata.status "cancelled" or "error"
    return rendered


def render_history(
    messages: Iterable[Message], forms: Mapping[str, ContentShape]
) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        rendered = render_message(message, forms.get(message.id))
        if rendered is not None:
            out.append(rendered)
    return out
