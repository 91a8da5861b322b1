"""Tool listings that survive one malformed tool.

The SDK validates a `tools/list` answer as a whole: one entry it cannot read (no `inputSchema`,
a number for a name) fails the page, so a server with twenty good tools and one sloppy one
offered none. metis already skips, tool by tool, what it cannot offer (an unusable input schema,
a clashing name) and says why; this relay, between the transport and the SDK's session, does
the same for entries the SDK would refuse: it drops them from the answer before the session
reads it and records a reason for each, which the server's status shows.

An entry is read twice, as the SDK reads the answer: by the protocol's `Tool` model, and by the
wire model of the protocol version the server answered `initialize` with, which is stricter (an
`inputSchema` without `"type": "object"`, such as the `{}` of a tool that takes no arguments,
passes the first and fails the second). Checking only the first let such an entry through, and
the SDK then refused the whole answer: every tool of the server was lost, and the server was
restarted for ever with the same answer.

The relay also takes every tool's `outputSchema` out of the answer. metis does not use it (a
result reaches the model as its content), and the SDK, given one, checks each structured result
against it with `jsonschema` on the event loop: a `pattern` such as `(a+)+$` there held the
whole daemon for as long as Python's `re` backtracked (minutes, for a result a server chose),
and a result that did not match lost its text content to a multi-line error.

An answer is recognised by its shape: a result with a top-level `tools` list is a `tools/list`
answer (no other MCP result has that member). Anything else passes through untouched,
including an answer whose `tools` is not a list at all: the SDK refuses that one whole, as
before, since there is no good part to keep.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.shared.message import SessionMessage
from mcp_types import methods as mcp_methods
from pydantic import ValidationError
from pydantic_core import ErrorDetails

Incoming = SessionMessage | Exception

SHOWN_PROBLEMS = 3
"""Problems named per skipped tool; the rest are counted."""

ASSUMED_VERSION = "2025-11-25"
"""The protocol version the SDK checks an answer against before one was negotiated."""


def skip_reason(position: int, raw: object, problems: list[ErrorDetails]) -> str:
    """`tool 'bad' (#2) skipped: not valid MCP (description: Input should be a valid string)`"""
    name = raw.get("name") if isinstance(raw, dict) else None
    who = f"tool {name!r} (#{position})" if isinstance(name, str) else f"tool #{position}"
    shown = [
        f"{'.'.join(str(part) for part in error['loc']) or 'the entry'}: {error['msg']}"
        for error in problems[:SHOWN_PROBLEMS]
    ]
    hidden = len(problems) - SHOWN_PROBLEMS
    more = f" (and {hidden} more)" if hidden > 0 else ""
    return f"{who} skipped: not valid MCP ({'; '.join(shown)}{more})"


def _entry_problems(result: dict[str, Any], raw: object, version: str) -> list[ErrorDetails]:
    """Why the SDK would refuse the answer because of this entry (none: it would not). Read
    first as a `Tool`, then within the answer as the negotiated version's wire model has it,
    only the problems located in the entry counting: the answer's own are the SDK's to refuse."""
    try:
        mcp_types.Tool.model_validate(raw, by_name=False)  # as the SDK reads a result
    except ValidationError as exc:
        return exc.errors()
    try:
        mcp_methods.validate_server_result("tools/list", version, {**result, "tools": [raw]})
    except ValidationError as exc:
        return [
            {**error, "loc": error["loc"][2:]}
            for error in exc.errors()
            if error["loc"][:2] == ("tools", 0)
        ]
    except (KeyError, ValueError):  # a version the SDK has no wire model for: it checks none
        return []
    return []


def readable_tools(
    result: dict[str, Any], skipped: list[str], version: str = ASSUMED_VERSION
) -> dict[str, Any]:
    """`result` without the tool entries the SDK would refuse under protocol `version`, a
    reason appended to `skipped` for each, and without the kept entries' `outputSchema` (never
    checked, see the module's docstring); the same object when there is nothing to change."""
    tools = result.get("tools")
    if not isinstance(tools, list):
        return result
    kept: list[object] = []
    changed = False
    for position, raw in enumerate(tools, start=1):
        entry = raw
        if isinstance(raw, dict) and "outputSchema" in raw:  # unused: not a reason to skip
            entry = {k: v for k, v in raw.items() if k != "outputSchema"}
        problems = _entry_problems(result, entry, version)
        if problems:
            skipped.append(skip_reason(position, raw, problems))
        else:
            kept.append(entry)
        changed = changed or entry is not raw or bool(problems)
    return {**result, "tools": kept} if changed else result


@dataclasses.dataclass
class _Negotiated:
    """The protocol version the server's `initialize` answer named, which the SDK then checks
    every answer against."""

    version: str = ASSUMED_VERSION


def _filtered(item: Incoming, skipped: list[str], negotiated: _Negotiated) -> Incoming:
    if isinstance(item, Exception):
        return item
    message = item.message
    if not isinstance(message, mcp_types.JSONRPCResponse) or not isinstance(message.result, dict):
        return item
    answered = message.result.get("protocolVersion")
    if isinstance(answered, str) and "serverInfo" in message.result:  # initialize's answer
        negotiated.version = answered
    result = readable_tools(message.result, skipped, negotiated.version)
    if result is message.result:
        return item
    return dataclasses.replace(item, message=message.model_copy(update={"result": result}))


@contextlib.asynccontextmanager
async def tolerant_tool_listings(
    read: MemoryObjectReceiveStream[Incoming], skipped: list[str]
) -> AsyncIterator[MemoryObjectReceiveStream[Incoming]]:
    """The transport's incoming stream, relayed with unreadable tool entries dropped (reasons go
    to `skipped`). It ends when the transport's does."""
    relay_in, relayed = anyio.create_memory_object_stream[Incoming](0)
    negotiated = _Negotiated()

    async def relay() -> None:
        async with relay_in:  # the transport's stream stays the transport's to close
            try:
                async for item in read:
                    await relay_in.send(_filtered(item, skipped, negotiated))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the session stopped reading (it is closing): nothing is waited for

    async with anyio.create_task_group() as group:
        group.start_soon(relay)
        try:
            yield relayed
        finally:
            group.cancel_scope.cancel()
            relayed.close()
