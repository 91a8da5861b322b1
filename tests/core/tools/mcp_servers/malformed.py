"""An MCP server over stdio, written by hand (JSON-RPC lines), whose `tools/list` the SDK cannot
read as it is. `one-bad-tool` (the default) lists a well-formed `good` tool between two the SDK
refuses (`bad`: no `inputSchema` and a number for its description; an entry with no name at
all), and answers calls of `good`; `not-a-list` answers `tools/list` with a string for `tools`;
`no-type` lists `good` after `bare`, whose `inputSchema` is `{}` (no `"type": "object"`, which
the protocol's wire model requires); `blank-name` lists `good` after a tool whose name is
empty; `output-schema` lists `good` with an `outputSchema` whose `pattern` backtracks without
bound in Python's `re`, and answers its calls with a structured result that makes it do so
(a short one: the backtracking takes a fraction of a second); `long-description` lists `good`
with a 208,000-character description."""

from __future__ import annotations

import json
import sys
from typing import Any

MODE = sys.argv[1] if len(sys.argv) > 1 else "one-bad-tool"
GOOD = {"name": "good", "inputSchema": {"type": "object"}}
BACKTRACKING = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}


def answer(message: dict[str, Any]) -> dict[str, Any]:
    method = message.get("method")
    if method == "initialize":
        return {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "malformed", "version": "1"},
        }
    if method == "tools/list":
        if MODE == "not-a-list":
            return {"tools": "good, bad"}
        if MODE == "no-type":
            return {"tools": [{"name": "bare", "inputSchema": {}}, GOOD]}
        if MODE == "blank-name":
            return {"tools": [{**GOOD, "name": ""}, GOOD]}
        if MODE == "output-schema":
            return {"tools": [{**GOOD, "outputSchema": BACKTRACKING}]}
        if MODE == "long-description":
            return {"tools": [{**GOOD, "description": "Use it well. " * 16_000}]}
        return {
            "tools": [
                {"name": "bad", "description": 5},
                GOOD,
                {"inputSchema": {"type": "object"}},
            ]
        }
    if method == "tools/call" and message["params"]["name"] == "good":
        structured = {"structuredContent": {"s": "a" * 22 + "!"}} if MODE == "output-schema" else {}
        return {"content": [{"type": "text", "text": "good ran"}], **structured}
    return {}


for line in sys.stdin:
    message = json.loads(line)
    if "id" in message:  # notifications get no answer
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
