"""Tool listings that survive one malformed tool.

The SDK validates a `tools/list` answer as a whole: one entry it cannot read (no `inputSchema`,
a number for a name) fails the page, so a server with twenty good tools and one sloppy one
offered none. metis already skips, tool by tool, what it cannot offer (an unusable input schema,
a clashing name) and says why; this relay, between the transport and the SDK's session, does
the same for entries the SDK would refuse: it drops them from the answer before the session
reads it and records a reason for each, which the server's status shows.

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
from pydantic import ValidationError

Incoming = SessionMessage | Exception

SHOWN_PROBLEMS = 3
"""Problems named per skipped tool; the rest are counted."""


def skip_reason(position: int, raw: object, exc: ValidationError) -> str:
    """`tool 'bad' (#2) skipped: not valid MCP (description: Input should be a valid string)`"""
    name = raw.get("name") if isinstance(raw, dict) else None
    who = f"tool {name!r} (#{position})" if isinstance(name, str) else f"tool #{position}"
    problems = [
        f"{'.'.join(str(part) for part in error['loc']) or 'the entry'}: {error['msg']}"
        for error in exc.errors()[:SHOWN_PROBLEMS]
    ]
    hidden = exc.error_count() - SHOWN_PROBLEMS
    more = f" (and {hidden} more)" if hidden > 0 else ""
    return f"{who} skipped: not valid MCP ({'; '.join(problems)}{more})"


def readable_tools(result: dict[str, Any], skipped: list[str]) -> dict[str, Any]:
    """`result` without the tool entries the SDK would refuse, a reason appended to `skipped`
    for each; the same object when there is nothing to drop."""
    tools = result.get("tools")
    if not isinstance(tools, list):
        return result
    kept: list[object] = []
    for position, raw in enumerate(tools, start=1):
        try:
            mcp_types.Tool.model_validate(raw, by_name=False)  # as the SDK reads a result
        except ValidationError as exc:
            skipped.append(skip_reason(position, raw, exc))
        else:
            kept.append(raw)
    return result if len(kept) == len(tools) else {**result, "tools": kept}


def _filtered(item: Incoming, skipped: list[str]) -> Incoming:
    if isinstance(item, Exception):
        return item
    message = item.message
    if not isinstance(message, mcp_types.JSONRPCResponse) or not isinstance(message.result, dict):
        return item
    result = readable_tools(message.result, skipped)
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

    async def relay() -> None:
        async with relay_in:  # the transport's stream stays the transport's to close
            try:
                async for item in read:
                    await relay_in.send(_filtered(item, skipped))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the session stopped reading (it is closing): nothing is waited for

    async with anyio.create_task_group() as group:
        group.start_soon(relay)
        try:
            yield relayed
        finally:
            group.cancel_scope.cancel()
            relayed.close()
