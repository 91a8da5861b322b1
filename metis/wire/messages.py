"""The text of a message and of a tool result, as the REST API returns them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def text_of(message: Mapping[str, Any]) -> str:
    """The text blocks of a canonical message, joined."""
    return "\n".join(
        b.get("text", "") for b in message.get("content") or [] if b.get("type") == "text"
    )


def tool_result_text(block: Mapping[str, Any]) -> str:
    """The text of a `tool_result` block (its content is a string or a block list)."""
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(
        b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"
    )
