"""An MCP server over stdio, written by hand (JSON-RPC lines), whose `tools/list` holds one
well-formed tool and one the SDK refuses (no `inputSchema`, a number for its description)."""

from __future__ import annotations

import json
import sys
from typing import Any


def answer(message: dict[str, Any]) -> dict[str, Any]:
    method = message.get("method")
    if method == "initialize":
        return {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "malformed", "version": "1"},
        }
    if method == "tools/list":
        return {
            "tools": [
                {"name": "good", "inputSchema": {"type": "object"}},
                {"name": "bad", "description": 5},
            ]
        }
    return {}


for line in sys.stdin:
    message = json.loads(line)
    if "id" in message:  # notifications get no answer
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
