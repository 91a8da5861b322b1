"""The tool-listing filter's pure part: which entries the SDK could not read, and why."""

from __future__ import annotations

from metis.core.tools.mcp.listing import readable_tools

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
