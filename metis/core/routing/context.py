"""Turn facts handed to `RoutingEngine.decide` and the one token estimate.

The core builds a `TurnContext` once per turn, before routing, with one estimate of the whole
context (`estimated_input_tokens`, what predicates and `route.decided` see). The context-window
check compares the part compaction cannot drop (`context_floor_tokens`): a long history is
compacted to fit the chosen model rather than making every model unusable (docs/decisions.md).
"""

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import ConfigDict, Field

from metis.core.canonical.content import ImageBlock, TextBlock, ToolResultBlock, ToolUseBlock
from metis.core.canonical.jsontext import canonical_json
from metis.core.canonical.messages import Message
from metis.core.canonical.tools import ToolDefinition
from metis.core.datamodel import DataModel
from metis.core.turns.prefix_cache import PrefixCache

CHARS_PER_TOKEN = 4
TOKENS_PER_IMAGE = 1600


def _local_now() -> datetime:
    return datetime.now().astimezone()


class TurnContext(DataModel):
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


Size = tuple[int, int]
"""(characters, images): what the estimate counts of a piece of the prompt."""

# The estimate runs several times per turn over the whole history (turn submission, each model
# call, compaction): what it measured before is carried forward (see PrefixCache).
_history_running: PrefixCache[list[Size]] = PrefixCache()
_tools_sizes: PrefixCache[Size] = PrefixCache()


def tokens_for(size: Size) -> int:
    """The estimate's formula: `ceil(chars / 4) + 1600 × images`."""
    chars, images = size
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_IMAGE * images


def _tool_json(tool: ToolDefinition | dict[str, Any]) -> str:
    """The part of a tool definition a provider is sent: name, description and schema."""
    if isinstance(tool, ToolDefinition):
        tool = {
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.input_schema,
        }
    return canonical_json(tool)


def _block_size(block: Any) -> Size:
    """(characters, images) one content block contributes to the estimate."""
    if isinstance(block, TextBlock):
        return len(block.text), 0
    if isinstance(block, ImageBlock):
        return 0, 1
    if isinstance(block, ToolUseBlock):
        return len(canonical_json(block.input)), 0
    if isinstance(block, ToolResultBlock):
        return content_size(block.content)
    return 0, 0  # thinking blocks are not part of the estimate


def _tool_size(tool: ToolDefinition | dict[str, Any]) -> Size:
    return len(_tool_json(tool)), 0


def message_size(message: Message) -> Size:
    """(characters, images) one history message adds to the estimate."""
    return content_size(message.content)


def content_size(content: Sequence[Any]) -> Size:
    """(characters, images) of a content list."""
    chars = images = 0
    for block in content:
        c, i = _block_size(block)
        chars, images = chars + c, images + i
    return chars, images


def _tools_size(tools: list[ToolDefinition | dict[str, Any]]) -> Size:
    """Summed sizes of the tools offered, measuring only those past a remembered prefix."""

    def more(state: Size | None, rest: Sequence[ToolDefinition | dict[str, Any]]) -> Size:
        chars, images = state or (0, 0)
        for tool in rest:
            c, i = _tool_size(tool)
            chars, images = chars + c, images + i
        return chars, images

    frozen = all(isinstance(t, ToolDefinition) for t in tools)  # a dict may change: no memo
    return _tools_sizes.extend(tools, more) if frozen else more(None, tools)


def running_sizes(history: Sequence[Message]) -> Sequence[Size]:
    """Running totals over `history`: entry i is the size of `history[: i + 1]`.

    Compaction reads the size of any part of the history from two entries, so fitting a
    session that outgrew its model's window costs one pass, not one pass per message dropped.
    Carried forward from the longest remembered prefix, as a session's history only grows.
    """

    def more(state: list[Size] | None, rest: Sequence[Message]) -> list[Size]:
        if state is not None and not rest:
            return state  # the same history again: nothing to copy
        running = list(state or ())
        chars, images = running[-1] if running else (0, 0)
        for message in rest:
            c, i = message_size(message)
            chars, images = chars + c, images + i
            running.append((chars, images))
        return running

    return _history_running.extend(history, more)


def prompt_size(
    *,
    system_prompt: str = "",
    tools: Iterable[ToolDefinition | dict[str, Any]] = (),
    new_content: Sequence[Any] = (),
) -> Size:
    """The size of everything the estimate counts besides the history."""
    tool_chars, tool_images = _tools_size(list(tools))
    new_chars, new_images = content_size(new_content)
    return len(system_prompt) + tool_chars + new_chars, tool_images + new_images


def estimate_input_tokens(
    *,
    system_prompt: str = "",
    tools: Iterable[ToolDefinition | dict[str, Any]] = (),
    history: Sequence[Message] = (),
    new_content: Sequence[Any] = (),
) -> int:
    """`ceil(chars / 4) + 1600 × images` over the prompt, tools, history and new message.

    `history` is the earlier messages themselves (canonical messages do not change, as
    `PrefixCache` needs), so that no caller builds a list of their contents on every call.
    """
    chars, images = prompt_size(system_prompt=system_prompt, tools=tools, new_content=new_content)
    running = running_sizes(history)
    history_chars, history_images = running[-1] if running else (0, 0)
    return tokens_for((chars + history_chars, images + history_images))
