"""History preparation shared by the wire mappings.

The stored history is canonical and may be imperfect (cancelled calls, imported seeds, lenient
reads); this module turns it into a sequence every provider accepts: results right after their
calls in call order, orphans repaired, empty blocks and messages gone.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from metis.core.canonical.content import ImageBlock, TextBlock, ToolResultBlock, ToolUseBlock
from metis.core.canonical.messages import Message
from metis.core.providers.base import LLMRequest
from metis.core.routing.context import estimate_input_tokens

log = logging.getLogger(__name__)

NOT_COMPLETED_TEXT = "Tool call was not completed"
IMAGE_OMITTED_TEXT = "[image omitted]"
_ANTHROPIC_ID_RE = re.compile(r"^[a-zA-Z0-9_-]+\Z")
_ANTHROPIC_ID_BAD = re.compile(r"[^a-zA-Z0-9_-]")


@dataclass(slots=True)
class WireTurn:
    """One normalized message: `results` holds the tool results answering the previous assistant."""

    role: Literal["user", "assistant", "results"]
    blocks: list[Any] = field(default_factory=list)
    provider: str | None = None


def anthropic_wire_id(canonical_id: str) -> str:
    """Anthropic takes the canonical id unchanged (`tu_<ULID>` satisfies its pattern)."""
    if _ANTHROPIC_ID_RE.match(canonical_id):
        return canonical_id
    return _ANTHROPIC_ID_BAD.sub("_", canonical_id) or "tu_unknown"


def openai_wire_id(canonical_id: str) -> str:
    """OpenAI gets `call_` + the ULID part, so a call and its result always agree."""
    if canonical_id.startswith("tu_"):
        return "call_" + canonical_id[3:]
    return canonical_id


def _clean(blocks: Sequence[Any]) -> list[Any]:
    return [b for b in blocks if not (isinstance(b, TextBlock) and not b.text)]


def _synthetic_result(tool_use_id: str) -> ToolResultBlock:
    return ToolResultBlock(
        tool_use_id=tool_use_id, content=[TextBlock(text=NOT_COMPLETED_TEXT)], is_error=True
    )


def normalize_history(messages: Sequence[Message]) -> list[WireTurn]:
    """Split at assistant messages; each segment sends its results first, in call order."""
    turns: list[WireTurn] = []
    calls: list[str] = []
    results: dict[str, ToolResultBlock] = {}
    pending_users: list[WireTurn] = []

    def flush() -> None:
        if calls:
            blocks: list[Any] = []
            for call_id in calls:
                result = results.get(call_id)
                if result is None:
                    log.warning(
                        "tool call %s has no result; sending %r", call_id, NOT_COMPLETED_TEXT
                    )
                    result = _synthetic_result(call_id)
                blocks.append(result)
            turns.append(WireTurn("results", blocks))
        turns.extend(pending_users)
        calls.clear()
        results.clear()
        pending_users.clear()

    for message in messages:
        if message.role == "assistant":
            flush()
            blocks = _clean(message.content)
            if not blocks:
                continue
            turns.append(WireTurn("assistant", blocks, message.metadata.provider))
            calls.extend(b.id for b in blocks if isinstance(b, ToolUseBlock))
        elif message.role == "tool":
            for block in message.content:
                if not isinstance(block, ToolResultBlock):
                    continue
                if block.tool_use_id in calls and block.tool_use_id not in results:
                    results[block.tool_use_id] = block
                else:
                    log.warning("dropping tool result %s without its call", block.tool_use_id)
        elif message.role == "user":
            blocks = _clean(message.content)
            if blocks:
                pending_users.append(WireTurn("user", blocks))
        else:
            log.debug("skipping a %s message in the history", message.role)
    flush()
    return turns


def result_text(block: ToolResultBlock, image_text: str = "[image]") -> str:
    """A tool result's text blocks joined by newlines, images as a placeholder."""
    parts: list[str] = []
    for inner in block.content:
        if isinstance(inner, TextBlock):
            parts.append(inner.text)
        elif isinstance(inner, ImageBlock):
            parts.append(image_text)
    return "\n".join(parts)


def estimate_request_tokens(req: LLMRequest) -> int:
    """Input tokens of a call whose provider sent no usage.

    The routing formula itself rather than a copy (docs/decisions.md), so an estimated call
    counts the system prompt, tools and history exactly as `route.decided` did.
    """
    return estimate_input_tokens(
        system_prompt=f"{req.system}\n{req.system_volatile}" if req.system_volatile else req.system,
        tools=req.tools,
        history=req.messages,
    )
