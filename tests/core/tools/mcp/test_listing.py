"""The tool-listing relay: which entries the SDK could not read and why, and the relay between
a transport's stream and the SDK's session."""

from __future__ import annotations

import anyio
import mcp_types
from mcp.shared.message import SessionMessage
from mcp_types import methods as mcp_methods

from metis.core.tools.mcp.listing import readable_tools, tolerant_tool_listings

GOOD = {"name": "good", "inputSchema": {"type": "object"}}


def test_a_listing_the_sdk_reads_is_passed_on_as_the_same_object() -> None:
    result = {"tools": [GOOD], "nextCursor": "2"}
    skipped: list[str] = []
    assert readable_tools(result, skipped) is result and skipped == []


def test_unreadable_entries_are_dropped_with_a_reason_each_and_the_rest_kept_in_order() -> None:
    other = {
        "name": "other",
        "inputSchema": GOOD["inputSchema"],
        "annotations": {"readOnlyHint": True},
    }
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


def test_an_input_schema_without_type_object_drops_that_tool_not_the_whole_answer() -> None:
    # the SDK reads the answer by the negotiated version's wire model, which requires
    # `"type": "object"`: an entry without it used to pass here and fail every tool of the server
    no_arguments = {"name": "ping", "inputSchema": {}}
    a_string = {"name": "echo", "inputSchema": {"type": "string"}}
    skipped: list[str] = []
    kept = readable_tools({"tools": [no_arguments, GOOD, a_string]}, skipped, "2025-06-18")
    assert kept == {"tools": [GOOD]}
    assert skipped == [
        "tool 'ping' (#1) skipped: not valid MCP (inputSchema.type: Field required)",
        "tool 'echo' (#3) skipped: not valid MCP (inputSchema.type: Input should be 'object')",
    ]
    mcp_methods.validate_server_result("tools/list", "2025-06-18", kept)  # the SDK reads it


def test_problems_of_the_answer_itself_are_left_for_the_sdk_to_refuse() -> None:
    # 2026-07-28 wants members a 2025 answer lacks: no entry is to blame for them
    result = {"tools": [GOOD]}
    skipped: list[str] = []
    assert readable_tools(result, skipped, "2026-07-28") is result and skipped == []
    assert readable_tools(result, skipped, "1999-01-01") is result and skipped == []


def test_output_schemas_are_taken_out_so_the_sdk_never_checks_results_against_them() -> None:
    # the SDK checked a structured result against it with a backtracking regex engine, on the
    # daemon's event loop; metis never uses it, and a broken one is no reason to skip the tool
    backtracking = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    shaped = {**GOOD, "name": "shaped", "outputSchema": backtracking}
    broken = {**GOOD, "name": "broken", "outputSchema": {"type": "nonsense"}}
    result = {"tools": [shaped, GOOD, broken], "nextCursor": "2"}
    skipped: list[str] = []
    kept = readable_tools(result, skipped)
    assert kept == {
        "tools": [{**GOOD, "name": "shaped"}, GOOD, {**GOOD, "name": "broken"}],
        "nextCursor": "2",
    }
    assert skipped == [] and result["tools"][0] is shaped and "outputSchema" in shaped


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
    initialized = SessionMessage(
        mcp_types.JSONRPCResponse(
            jsonrpc="2.0",
            id=1,
            result={
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "serverInfo": {"name": "s", "version": "1"},
            },
        )
    )
    listing = mcp_types.JSONRPCResponse(
        jsonrpc="2.0",
        id=2,
        result={"tools": [{"name": "bad"}, GOOD, {"name": "loose", "inputSchema": {}}]},
    )
    skipped: list[str] = []
    async with tolerant_tool_listings(read, skipped) as relayed:
        async with send:
            for item in (ping, broken, initialized, SessionMessage(listing)):
                await send.send(item)
        received = [item async for item in relayed]  # ends when the transport's stream does
    assert received[0] is ping and received[1] is broken and received[2] is initialized
    fourth = received[3]
    assert isinstance(fourth, SessionMessage)
    assert isinstance(fourth.message, mcp_types.JSONRPCResponse)
    assert fourth.message.id == 2 and fourth.message.result == {"tools": [GOOD]}
    assert skipped == [
        "tool 'bad' (#1) skipped: not valid MCP (inputSchema: Field required)",
        "tool 'loose' (#3) skipped: not valid MCP (inputSchema.type: Field required)",
    ]
