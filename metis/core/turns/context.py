"""What the model is sent: system prompt, repaired history, and compaction to fit the context.

Pure functions over canonical messages. The stored history is never changed here: compaction
only shapes the copy sent to the model (and reported as AAP's `compacted` history).
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from metis.core.canonical.content import TextBlock, ToolResultBlock, ToolUseBlock
from metis.core.canonical.messages import Message, MessageMetadata
from metis.core.routing.context import Size, message_size, running_sizes, tokens_for
from metis.core.turns.prefix_cache import PrefixCache

SYSTEM_PROMPT = """You are metis, a coding agent working inside one workspace directory on the user's machine.
Work in small verifiable steps: read and search before you change anything, make precise edits,
and run the project's own commands to check your work. Tool paths are relative to the workspace
root; paths outside it are refused. Some tools need the user's confirmation; if a call is denied,
do not retry it unchanged — explain what you wanted to do instead. Answer concisely."""

UNAVAILABLE_RESULT = "result unavailable"
OMITTED_RESULT = "[older tool result omitted to fit the context window]"
MAX_LISTING = 40


# A listing is reused while the directory's inode and mtime are unchanged (adding, removing or
# renaming an entry changes the mtime; so does creating `.git`). A directory changed less than
# this long before it was listed is listed again next time: a second change within the same
# timestamp tick would otherwise leave its mtime as it was.
_SETTLED_NS = 1_000_000_000
_LISTINGS_KEPT = 64
_UNREADABLE = "The workspace directory is not readable right now."
_listings: dict[str, tuple[int, int, str]] = {}


def workspace_facts(workspace: str, now: datetime | None = None) -> str:
    """The per-turn (volatile) system text: date and what the workspace root holds.

    Called before every model call; a large workspace root (hundreds of entries) costs a
    directory read and sort only when it changed, not at every call."""
    now = now or datetime.now(UTC)
    head = f"Current date: {now:%Y-%m-%d}.\nWorkspace root: {workspace}"
    return f"{head}\n{_listing(workspace)}"


def _listing(workspace: str) -> str:
    try:
        st = os.stat(workspace)
    except OSError:
        return _UNREADABLE
    cached = _listings.get(workspace)
    if cached is not None and cached[0] == st.st_ino and cached[1] == st.st_mtime_ns:
        return cached[2]
    text = _read_listing(workspace)
    if text != _UNREADABLE and time.time_ns() - st.st_mtime_ns >= _SETTLED_NS:
        if len(_listings) >= _LISTINGS_KEPT:
            _listings.pop(next(iter(_listings)))
        _listings[workspace] = (st.st_ino, st.st_mtime_ns, text)
    return text


def _read_listing(workspace: str) -> str:
    try:
        with os.scandir(workspace) as scan:
            entries = list(scan)
    except OSError:
        return _UNREADABLE
    first = heapq.nsmallest(MAX_LISTING, entries, key=lambda e: e.name)
    shown = [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in first]
    more = len(entries) - len(shown)
    lines = [
        "Top-level entries: "
        + (", ".join(shown) if shown else "(empty)")
        + (f" and {more} more" if more > 0 else "")
    ]
    if (Path(workspace) / ".git").exists():
        lines.append("The workspace is a git repository.")
    return "\n".join(lines)


def _synthetic_result(message: Message, tool_use_id: str) -> Message:
    return Message(
        id=message.id,
        session_id=message.session_id,
        turn_id=message.turn_id,
        role="tool",
        content=[
            ToolResultBlock(
                tool_use_id=tool_use_id, content=[TextBlock(text=UNAVAILABLE_RESULT)], is_error=True
            )
        ],
        created_at_us=message.created_at_us,
        metadata=MessageMetadata(tool_use_id=tool_use_id),
    )


# (messages out so far, tool calls still open) after a history prefix: the next turn's history
# starts with this one's, so only its new messages are looked at (see PrefixCache).
_assembled: PrefixCache[tuple[list[Message], list[tuple[Message, str]]]] = PrefixCache()


def assemble(history: Sequence[Message]) -> list[Message]:
    """History as the model may see it.

    Empty messages are skipped, system messages never travel as messages, and every tool_use
    gets a result before the conversation moves on (a synthetic, unstored error result when
    none is stored).
    """

    def more(
        state: tuple[list[Message], list[tuple[Message, str]]] | None, rest: Sequence[Message]
    ) -> tuple[list[Message], list[tuple[Message, str]]]:
        out, open_calls = (list(state[0]), list(state[1])) if state is not None else ([], [])
        for message in rest:
            if not message.content or message.role == "system":
                continue
            if message.role == "tool":
                block = message.content[0]
                if isinstance(block, ToolResultBlock):
                    remaining = [c for c in open_calls if c[1] != block.tool_use_id]
                    if len(remaining) == len(open_calls):
                        continue  # a result without its call: adapters would drop it anyway
                    open_calls[:] = remaining
                    out.append(message)
                continue
            out.extend(_synthetic_result(owner, tool_use_id) for owner, tool_use_id in open_calls)
            open_calls.clear()
            out.append(message)
            if message.role == "assistant" and message.metadata.status == "complete":
                open_calls.extend(
                    (message, b.id) for b in message.content if isinstance(b, ToolUseBlock)
                )
        return out, open_calls

    out, open_calls = _assembled.extend(history, more)  # the memo's lists: copied, not changed
    return [*out, *(_synthetic_result(owner, tool_use_id) for owner, tool_use_id in open_calls)]


def _result_chars(message: Message) -> int:
    block = message.content[0]
    if not isinstance(block, ToolResultBlock):
        return 0
    return sum(len(inner.text) for inner in block.content if isinstance(inner, TextBlock))


# A blanked result is made once per stored message and reused by later calls: the same object
# every call keeps the context's prefix identical, which the encoders' prefix memos rely on.
_SLIMMED_KEPT = 4096
_slimmed: dict[tuple[str, str], Message] = {}


def _without_result_content(message: Message) -> Message:
    block = message.content[0]
    assert isinstance(block, ToolResultBlock)
    key = (message.id, block.tool_use_id)
    slim = _slimmed.get(key)
    if slim is None:
        omitted = ToolResultBlock(
            tool_use_id=block.tool_use_id,
            content=[TextBlock(text=OMITTED_RESULT)],
            is_error=block.is_error,
        )
        slim = message.model_copy(update={"content": [omitted]})
        if len(_slimmed) >= _SLIMMED_KEPT:
            _slimmed.pop(next(iter(_slimmed)))
        _slimmed[key] = slim
    return slim


def compact(messages: list[Message], budget_tokens: int, prompt: Size) -> tuple[list[Message], int]:
    """Fit the context: first blank old tool results (oldest first), then drop old exchanges.

    Returns the messages to send and the estimate of the whole request (`prompt` is the size
    of everything sent besides them). The newest user message and everything after it always
    stay, so the model always sees the request it is answering. Exchanges are dropped from the
    start up to a user message, which keeps tool_use/tool_result pairs together.

    One pass over the history whatever it drops: a session that outgrew its model's window
    compacts at every model call, and re-measuring the history for each message blanked or
    dropped made those calls take seconds of the event loop's time in long sessions.
    """
    running = running_sizes(messages)
    chars, images = running[-1] if running else (0, 0)
    chars, images = chars + prompt[0], images + prompt[1]
    if tokens_for((chars, images)) <= budget_tokens:
        return messages, tokens_for((chars, images))
    sizes = [
        (c - pc, i - pi) for (c, i), (pc, pi) in zip(running, [(0, 0), *running[:-1]], strict=True)
    ]
    result = list(messages)
    last_user = max((i for i, m in enumerate(result) if m.role == "user"), default=0)
    for i, message in enumerate(result[:last_user]):
        if (
            message.role == "tool"
            and message.content
            and _result_chars(message) > len(OMITTED_RESULT)
        ):
            result[i] = _without_result_content(message)
            slim_chars, slim_images = message_size(result[i])
            chars += slim_chars - sizes[i][0]
            images += slim_images - sizes[i][1]
            sizes[i] = (slim_chars, slim_images)
            if tokens_for((chars, images)) <= budget_tokens:
                return result, tokens_for((chars, images))
    for cut in range(1, last_user + 1):  # drop result[:cut] when it starts at a user message
        chars -= sizes[cut - 1][0]
        images -= sizes[cut - 1][1]
        if result[cut].role == "user" and (
            cut == last_user or tokens_for((chars, images)) <= budget_tokens
        ):
            return result[cut:], tokens_for((chars, images))
    return result, tokens_for((chars, images))
