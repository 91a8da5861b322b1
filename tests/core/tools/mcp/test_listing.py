"""The tool-listing relay: which entries the SDK could not read and why, and the relay between
a transport's stream and the SDK's session."""

from __future__ import annotations

import anyio
import mcp_types
from mcp.shared.message import SessionMessage

from metis.core.tools.mcp.listing import readable_tools, tolerant_tool_listings

GOOD = {"name": "good", "inputSchema": {"type": "object"}}


def test_a_listing_the_sdk_reads_is_passed_on_as_the_same_object() -> None:
    result = {"tools": [GOOD], "nextCursor": "2"}
    skipped: list[str] = []
    assert readable_tools(result, skipped) is result and skipped == []


def test_unreadable_entries_are_dropped_with_a_reason_each_and_the_rest_kept_in_order() -> None:
    other = {"name": "other", "inputSchema": {}, "annotations": {"readOnlyHint": True}}
    result = {
        "tools": [{"name": "bad"}, GOOD, "not an entry", other, {"name": 7, "inputSchema": {}}],
        "nextCursor": "2",
    }
    skipped: list[str] = []
    kept = readable_tools(result, skipped)
    assert kept == {"tools": [GOOD, other], "nextCursor": "2"}
    assert result["tools"][0] == {"name": "bad"}  # the answer itself is left as it was
    assert skipped == [
        "tool 'bad' (#1) skipped: not valid MCP (inputSchema: Field required)",
        "tool #3 skipped: not valid MCP (the entry: Input should be a valid dictionary or "
        "instance of Tool)",
        "tool #5 skipped: not valid MCP (name: Input should be a valid string)",
    ]


def test_a_tools_member_that_is_not_a_list_is_left_for_the_sdk_to_refuse() -> None:
    for result in ({"tools": "a, b"}, {"content": []}):
        skipped: list[str] = []
        assert readable_tools(result, skipped) is result and skipped == []


def test_a_long_list_of_problems_is_cut_and_counted() -> None:
    wrong = {"name": "w", "inputSchema": 1, "description": 2, "title": 3, "icons": 4}
    skipped: list[str] = []
    readable_tools({"tools": [wrong]}, skipped)
    assert skipped[0].startswith("tool 'w' (#1) skipped: not valid MCP (")
    assert skipped[0].endswith(" (and 1 more))")


async def test_the_relay_passes_messages_on_filters_listings_and_ends_with_the_transport() -> None:
    send, read = anyio.create_memory_object_stream[SessionMessage | Exception](4)
    ping = SessionMessage(mcp_types.JSONRPCRequest(jsonrpc="2.0", id=1, method="ping"))
    broken = ValueError("a line that is not JSON")
    listing = mcp_types.JSONRPCResponse(
        jsonrpc="2.0", id=2, result={"tools": [{"name": "bad"}, GOOD]}
    )
    skipped: list[str] = []
    async with tolerant_tool_listings(read, skipped) as relayed:
        async with send:
            for item in (ping, broken, SessionMessage(listing)):
                await send.send(item)
        received = [item async for item in relayed]  # ends when the transport's stream does
    assert received[0] is ping and received[1] is broken
    third = received[2]
    assert isinstance(third, SessionMessage)
    assert isinstance(third.message, mcp_types.JSONRPCResponse)
    assert third.message.id == 2 and third.message.result == {"tools": [GOOD]}
    assert skipped == ["tool 'bad' (#1) skipped: not valid MCP (inputSchema: Field required)"]
