"""Turn facts handed to `RoutingEngine.decide` (routing.md §2.5) and the one token estimate.

The core builds a `TurnContext` once per turn, before routing; predicates and candidate
validation read the same `estimated_input_tokens`, so a rule and the context-window check can
never disagree about how large the turn is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from metis.core.canonical import (
    ImageBlock,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    canonical_json,
)

CHARS_PER_TOKEN = 4
TOKENS_PER_IMAGE = 1600


def _local_now() -> datetime:
    return datetime.now().astimezone()


class TurnContext(BaseModel):
    """Everything routing may look at for one turn; nothing else influences the decision."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    turn_id: str | None = None
    turn_index: int = 1
    workspace_path: str
    message_text: str = ""
    image_count: int = 0
    tools_offered: int = 0
    has_tool_calls_in_history: bool = False
    tool_use_in_progress: bool = False
    session_cost_usd: Decimal = Decimal(0)
    per_message_override: str | None = None
    override_strict: bool = True
    sticky_model: str | None = None
    now: datetime = Field(default_factory=_local_now)
    estimated_input_tokens: int = 0
    compactable_tokens: int = 0

    @property
    def context_floor_tokens(self) -> int:
        """What the context-window check compares: the estimate minus what compaction can drop.

        Predicates see the full `estimated_input_tokens`; a model is only rejected when even
        the compacted context (system, tools, the new message) cannot fit it.
        """
        return self.estimated_input_tokens - self.compactable_tokens


def _tool_json(tool: ToolDefinition | dict[str, Any]) -> str:
    """The part of a tool definition a provider is sent: name, description and schema."""
    if isinstance(tool, ToolDefinition):
        tool = {
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.input_schema,
        }
    return canonical_json(tool)


def _block_size(block: Any) -> tuple[int, int]:
    """(characters, images) one content block contributes to the estimate."""
    if isinstance(block, TextBlock):
        return len(block.text), 0
    if isinstance(block, ImageBlock):
        return 0, 1
    if isinstance(block, ToolUseBlock):
        return len(canonical_json(block.input)), 0
    if isinstance(block, ToolResultBlock):
        chars = images = 0
        for inner in block.content:
            c, i = _block_size(inner)
            chars, images = chars + c, images + i
        return chars, images
    return 0, 0  # thinking blocks are not part of the estimate


def estimate_input_tokens(
    *,
    system_prompt: str = "",
    tools: Iterable[ToolDefinition | dict[str, Any]] = (),
    history: Iterable[Sequence[Any]] = (),
    new_content: Sequence[Any] = (),
) -> int:
    """`ceil(chars / 4) + 1600 × images` over the prompt, tools, history and new message.

    `history` is the content list of each earlier message (e.g. `[m.content for m in msgs]`).
    """
    chars = len(system_prompt) + sum(len(_tool_json(t)) for t in tools)
    images = 0
    for content in (*history, new_content):
        for block in content:
            c, i = _block_size(block)
            chars, images = chars + c, images + i
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_IMAGE * images
