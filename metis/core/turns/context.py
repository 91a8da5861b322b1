"""What the model is sent: system prompt, repaired history, and compaction to fit the context.

Pure functions over canonical messages. The stored history is never changed here: compaction
only shapes the copy sent to the model (and reported as AAP's `compacted` history).
"""

from __future__ import annotations

import bisect
import heapq
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from metis.core.canonical.content import TextBlock, ToolResultBlock, ToolUseBlock
from metis.core.canonical.messages import Message, MessageMetadata
from metis.core.canonical.usage import TokenUsage
from metis.core.routing.context import (
    Size,
    content_size,
    message_size,
    running_sizes,
    tokens_for,
)
from metis.core.turns.prefix_cache import PrefixCache

SYSTEM_PROMPT = """You are metis, a coding agent working inside one workspace directory on the user's machine.
Work in small verifiable steps: read and search before you change anything, make precise edits,
and run the project's own commands to check your work. Tool paths are relative to the workspace
root; paths outside it are refused. Some tools need the user's confirmation; if a call is denied,
do not retry it unchanged — explain what you wanted to do instead. Answer concisely."""

UNAVAILABLE_RESULT = "result unavailable"
OMITTED_RESULT = "[tool result omitted to fit the context window]"
DROPPED_NOTE = (
    "The start of this conversation was left out to fit your context window: you see only its"
    " most recent part, the user sees all of it. Say so rather than guess if asked about it."
)
"""Added to the system text of a call whose compacted context dropped earlier exchanges: a
conversation that silently starts mid-way has the model answer about what it cannot see."""
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


class _StandIns:
    """Messages compaction and assembly put in place of stored ones, each made once and the same
    object at every later call: a context's prefix then stays identical from call to call, which
    the prefix memos (sizes, wire encodings) rely on. Keyed by kind, stored message id and
    tool_use id (stored messages never change); the least recently used go first past `size`."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._made: dict[tuple[str, str, str], Message] = {}

    def get(self, key: tuple[str, str, str], make: Callable[[], Message]) -> Message:
        made = self._made.pop(key, None)
        if made is None:
            made = make()
            if len(self._made) >= self._size:
                self._made.pop(next(iter(self._made)))
        self._made[key] = made  # (re)inserted last: the most recently used
        return made


_stand_ins = _StandIns()


def _synthetic_result(message: Message, tool_use_id: str) -> Message:
    """The error result a tool_use without a stored one is sent with (see `assemble`)."""

    def make() -> Message:
        return Message(
            id=message.id,
            session_id=message.session_id,
            turn_id=message.turn_id,
            role="tool",
            content=[
                ToolResultBlock(
                    tool_use_id=tool_use_id,
                    content=[TextBlock(text=UNAVAILABLE_RESULT)],
                    is_error=True,
                )
            ],
            created_at_us=message.created_at_us,
            metadata=MessageMetadata(tool_use_id=tool_use_id),
        )

    return _stand_ins.get(("synthetic", message.id, tool_use_id), make)


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


def _without_result_content(message: Message) -> Message:
    block = message.content[0]
    assert isinstance(block, ToolResultBlock)

    def make() -> Message:
        omitted = ToolResultBlock(
            tool_use_id=block.tool_use_id,
            content=[TextBlock(text=OMITTED_RESULT)],
            is_error=block.is_error,
        )
        return message.model_copy(update={"content": [omitted]})

    return _stand_ins.get(("blanked", message.id, block.tool_use_id), make)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What compaction reads of a history, carried forward as the history grows.

    Every list is indexed by position in the history or in order of it, so each step of the
    compaction rule (blank the oldest results, then drop the oldest exchanges) becomes a
    binary search instead of a walk over the history for each message blanked or dropped."""

    slim: list[Size]  # running sizes, as if every blankable tool result were blanked
    blankable: list[int]  # positions of the tool results blanking shrinks, oldest first
    saved: list[Size]  # running totals of what blanking those saves, in the same order
    users: list[int]  # positions of the user messages


_shapes: PrefixCache[_Shape] = PrefixCache()
_BLANKED_SIZE = content_size(
    [ToolResultBlock(tool_use_id="", content=[TextBlock(text=OMITTED_RESULT)])]
)


def _plus(a: Size, b: Size) -> Size:
    return a[0] + b[0], a[1] + b[1]


def _minus(a: Size, b: Size) -> Size:
    return a[0] - b[0], a[1] - b[1]


def _shape(messages: Sequence[Message]) -> _Shape:
    def more(state: _Shape | None, rest: Sequence[Message]) -> _Shape:
        if state is not None and not rest:
            return state
        shape = (
            _Shape([], [], [], [])
            if state is None
            else _Shape([*state.slim], [*state.blankable], [*state.saved], [*state.users])
        )
        position = len(shape.slim)
        for message in rest:
            size = message_size(message)
            saved = _minus(size, _BLANKED_SIZE)
            if (
                message.role == "tool"
                and message.content
                and isinstance(message.content[0], ToolResultBlock)
                and (saved[0] > 0 or saved[1] > 0)  # text past the placeholder's, or an image
            ):
                shape.blankable.append(position)
                shape.saved.append(_plus(shape.saved[-1], saved) if shape.saved else saved)
                size = _BLANKED_SIZE
            elif message.role == "user":
                shape.users.append(position)
            shape.slim.append(_plus(shape.slim[-1], size) if shape.slim else size)
            position += 1
        return shape

    return _shapes.extend(messages, more)


COMPACTION_STEPS = 4
"""Compaction frees the overflow rounded up to this fraction of the budget (a quarter)."""


def compact(messages: list[Message], budget_tokens: int, prompt: Size) -> tuple[list[Message], int]:
    """Fit the context: first blank old tool results (oldest first), then drop old exchanges,
    then blank the results of the newest request's own exchange (oldest first).

    Returns the messages to send and the estimate of the whole request (`prompt` is the size
    of everything sent besides them). The newest user message and every message after it always
    stay (their tool results may be blanked), so the model always sees the request it is
    answering and the calls it made for it. Exchanges are dropped from the start up to a user
    message, which keeps tool_use/tool_result pairs together. The estimate may still exceed the
    budget when what cannot be blanked or dropped does not fit.

    What is freed is the overflow rounded up to a quarter of the budget, not just the overflow:
    the start of the context then stays the same over the many calls it takes the history to
    grow by that much, so the provider's prompt cache keeps serving it (freeing the bare
    overflow moved the start at every call, and every call paid for the whole window again).
    Compaction runs at every model call once a session outgrew its window, so it reads sizes
    carried from call to call and binary-searches them, never re-measuring the history.
    """
    running = running_sizes(messages)
    total = _plus(prompt, running[-1]) if running else prompt
    if tokens_for(total) <= budget_tokens:
        return messages, tokens_for(total)
    step = max(1, budget_tokens // COMPACTION_STEPS)

    def fits(size: Size) -> bool:
        return tokens_for(size) <= budget_tokens

    def to_free(size: Size) -> int:
        over = tokens_for(size) - budget_tokens
        return step * -(-over // step)

    shape = _shape(messages)
    last_user = shape.users[-1] if shape.users else 0
    blankable = bisect.bisect_left(shape.blankable, last_user)  # those before the newest ask
    if blankable and fits(_minus(total, shape.saved[blankable - 1])):
        wanted = to_free(total)
        count = min(
            blankable,
            1
            + bisect.bisect_left(
                range(blankable),
                True,
                key=lambda k: (
                    tokens_for(shape.saved[k]) >= wanted and fits(_minus(total, shape.saved[k]))
                ),
            ),
        )
        result = list(messages)
        for position in shape.blankable[:count]:
            result[position] = _without_result_content(messages[position])
        return result, tokens_for(_minus(total, shape.saved[count - 1]))
    if blankable:
        total = _minus(total, shape.saved[blankable - 1])
    # Dropping every message before a user message at `cut` (≤ last_user, so every blankable
    # result before it is blanked) frees `slim[cut - 1]`.
    wanted = to_free(total)
    first, end = bisect.bisect_left(shape.users, 1), bisect.bisect_right(shape.users, last_user)
    found = bisect.bisect_left(
        shape.users,
        True,
        first,
        end,
        key=lambda cut: (
            tokens_for(shape.slim[cut - 1]) >= wanted and fits(_minus(total, shape.slim[cut - 1]))
        ),
    )
    cut = shape.users[found] if found < end else last_user
    kept = _minus(total, shape.slim[cut - 1]) if cut else total
    # The newest request's own exchange still outgrows the window (a turn that read many large
    # files): blank its results too, oldest first. Those the model has not seen yet (after the
    # last assistant message) are blanked only as far as fitting needs, never for the rounding:
    # it asked for them to answer now. One that alone outgrows the window is blanked as well,
    # rather than sending a call the provider refuses.
    later = 0
    count = len(shape.blankable)
    if not fits(kept) and count > blankable:
        before = shape.saved[blankable - 1] if blankable else (0, 0)

        def freed(k: int) -> Size:
            return _minus(shape.saved[k], before)

        def first_where(key: Callable[[int], bool]) -> int:
            return bisect.bisect_left(range(count), True, blankable, key=key)

        wanted = to_free(kept)
        newest = len(messages)
        while newest > 0 and messages[newest - 1].role == "tool":
            newest -= 1
        unseen = bisect.bisect_left(shape.blankable, newest)
        last = first_where(
            lambda k: tokens_for(freed(k)) >= wanted and fits(_minus(kept, freed(k)))
        )
        if last >= unseen:
            last = max(unseen - 1, first_where(lambda k: fits(_minus(kept, freed(k)))))
        last = min(count - 1, last)
        later = last + 1 - blankable
        kept = _minus(kept, freed(last))
    result = messages[cut:]
    for position in shape.blankable[bisect.bisect_left(shape.blankable, cut) : blankable + later]:
        result[position - cut] = _without_result_content(messages[position])
    return result, tokens_for(kept)


OVERFLOW_MARGIN = 1.1
"""A provider that refused a call as over its window counted more than the window: the scale
then leaves this much more room than that bare bound."""


def scaled_budget(budget: int, scale: float) -> int:
    """The budget in estimated tokens, for a provider that counts `scale` tokens per estimated one."""
    return int(budget / scale) if scale > 1 else budget


def count_observed(
    scales: dict[str, float], model: str, estimate: int, budget: int, usage: TokenUsage
) -> None:
    """Learn from a call's reported input how its provider counts against the estimate.

    The estimate (`ceil(chars / 4)`) undercounts code, JSON and most non-English text; a
    session compacted to the bare estimate then reached the provider over its window at every
    call once it was full, and failed every turn from then on. The most tokens counted per
    estimated one so far (never below one) scales the next calls' budgets down. Only a call
    filling a quarter of the `budget` or more teaches it: in a small one, what a provider adds
    to every request (its tool-use instructions) would pass for a high ratio and shrink the
    window of the whole session."""
    if usage.estimated or estimate < max(1, budget // COMPACTION_STEPS):
        return
    counted = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    if counted > estimate * scales.get(model, 1.0):
        scales[model] = counted / estimate


def overflow_observed(scales: dict[str, float], model: str, estimate: int, window: int) -> None:
    """The provider refused a call of `estimate` estimated tokens as over its `window` (a
    session's first call after a restart, before any count was seen): the next call leaves
    room for at least that many tokens per estimated one."""
    bound = window / estimate if estimate > 0 else 1.0
    scales[model] = max(scales.get(model, 1.0), bound) * OVERFLOW_MARGIN
