"""Request bodies as JSON bytes, the history's encoded form carried over from call to call.

Every call sends a session's whole history, and the history only grows. Mapping it to the wire
and encoding it anew on every call made a call's cost grow with the session; handing the SDK a
dict made it worse (the SDK walks, copies and encodes the body once more). At 190 messages that
was ~6 ms per call, most of a turn's growth. So the adapters build the body here, with the wire
messages that cannot change already encoded, and hand the SDK bytes.

Why a prefix can be reused: `normalize_history` starts afresh at every assistant message (it
flushes the results and user messages gathered before it), so the wire messages of a history
are those of the part before an assistant message followed by those of the part from it on,
unless the two wire messages at that join have the same role (the Anthropic mapping would merge
them; the join is then not used). The part before the last assistant message of a call is
therefore final: it is encoded once and every later call over a longer history reuses the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metis.core.canonical.messages import Message
from metis.core.canonical.tools import ToolDefinition
from metis.core.turns.prefix_cache import PrefixCache

WireMessage = dict[str, Any]
HistoryMapper = Callable[[Sequence[Message]], list[WireMessage]]

# The SDKs' own encoding: ASCII with escapes, so lone surrogates in stored text still encode.
_encoder = json.JSONEncoder(separators=(",", ":"))


def encode(value: Any) -> bytes:
    """JSON bytes as the SDKs encode them (ASCII, compact), so lone surrogates in stored text still
    encode."""
    return _encoder.encode(value).encode("ascii")


def json_body(
    fields: dict[str, Any], messages: Sequence[bytes], encoded: Mapping[str, bytes] | None = None
) -> bytes:
    """The JSON object `{"messages": [<messages>], **fields, **encoded}` from already-encoded
    messages; `encoded` holds fields whose values are JSON already (the tools, `ToolsEncoder`).

    Joined in one copy: a long session's body is hundreds of kilobytes, and joining the
    messages first, then adding the head and the fields, copied it three times on every call.
    """
    parts: list[bytes | memoryview] = [b'{"messages":[']
    if messages:
        listed: list[bytes | memoryview] = [b","] * (2 * len(messages) - 1)
        listed[0::2] = messages  # the commas stay between them
        parts += listed
    parts.append(b"]")
    if fields:
        parts.append(b",")
        parts.append(memoryview(encode(fields))[1:-1])  # its braces dropped
    for name, value in (encoded or {}).items():
        parts += (b",", encode(name), b":", value)
    parts.append(b"}")
    return b"".join(parts)


ToolsMapper = Callable[[Sequence[ToolDefinition]], list[dict[str, Any]]]


class ToolsEncoder:
    """One adapter's encoded `tools` arrays, reused while a call offers the same definitions.

    A turn offers the same tool definitions call after call, and their schemas are most of a
    short call's body: encoding them anew cost ~25 µs per call on the 2-core machine (more with
    the caches cold between two turns). Definitions are compared by identity, as the routing
    estimate's memo does (`ToolDefinition` is frozen); `options` names what else the wire
    form depends on (the prompt-caching mark on the last tool).
    """

    def __init__(self, size: int = 16) -> None:
        self._memo: PrefixCache[tuple[Hashable, bytes]] = PrefixCache(size)

    def encode(
        self, tools: Sequence[ToolDefinition], options: Hashable, mapper: ToolsMapper
    ) -> bytes:
        """The JSON array `mapper(tools)` encodes to."""
        known, state = self._memo.longest_prefix(tools)
        if known == len(tools) and state is not None and state[0] == options:
            return state[1]
        data = encode(mapper(tools))
        self._memo.remember(tools, (options, data))
        return data


@dataclass(frozen=True, slots=True)
class _Encoded:
    """What a call left for the next: its history's final part, up to `cut`, encoded."""

    options: Hashable
    cut: int  # canonical index of the assistant message the encoded part stops before (or 0)
    done: tuple[bytes, ...]
    last_role: str | None


def _joins(last_role: str | None, first: WireMessage) -> bool:
    """Whether wire messages can be concatenated at this join without being merged."""
    return last_role is None or last_role != first["role"]


class HistoryEncoder:
    """One adapter's memory of the histories it encoded (a few sessions' worth)."""

    def __init__(self, size: int = 16) -> None:
        self._memo: PrefixCache[_Encoded] = PrefixCache(size)

    def split(
        self, messages: Sequence[Message], options: Hashable, mapper: HistoryMapper
    ) -> tuple[list[bytes], list[WireMessage]]:
        """(the encoded wire messages of the history's final part, the rest as wire dicts).

        `mapper` maps any slice of canonical history to wire messages; `options` names what else
        it depends on (capabilities, thinking), so a call with other options starts afresh. The
        rest is returned as dicts, non-empty whenever the whole history maps to something, so
        the caller can still mark the last message (prompt caching) before encoding it.
        """
        _, state = self._memo.longest_prefix(messages)
        if state is None or state.options != options:
            state = _Encoded(options, 0, (), None)
        new_cut = _last_assistant(messages, after=state.cut)
        if new_cut is not None:
            middle = mapper(messages[state.cut : new_cut])
            rest = mapper(messages[new_cut:])
            last_role = middle[-1]["role"] if middle else state.last_role
            if (
                rest
                and (not middle or _joins(state.last_role, middle[0]))
                and _joins(last_role, rest[0])
            ):
                done = state.done + tuple(encode(m) for m in middle)
                self._memo.remember(messages, _Encoded(options, new_cut, done, last_role))
                return list(done), rest
        rest = mapper(messages[state.cut :])
        if rest and _joins(state.last_role, rest[0]):
            self._memo.remember(messages, state)
            return list(state.done), rest
        return [], mapper(messages)  # a join that would merge, or nothing after it: no reuse


def _last_assistant(messages: Sequence[Message], *, after: int) -> int | None:
    for index in range(len(messages) - 1, after, -1):
        if messages[index].role == "assistant":
            return index
    return None
