"""An MCP server over stdio, written by hand (JSON-RPC lines), whose failures repeat its
environment: `error_result` answers a result marked as an error, `error_answer` a JSON-RPC
error, each with the value of the variable named by its `name` argument in the text, as a
server that echoes its configuration (a connection string, a token) when it fails would."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def answer(message: dict[str, Any]) -> dict[str, Any]:
    method = message.get("method")
    if method == "initialize":
        return {
            "result": {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "telltale", "version": "1"},
            }
        }
    if method == "tools/list":
        tools = [{"name": n, "inputSchema": NAME} for n in ("error_result", "error_answer")]
        return {"result": {"tools": tools}}
    if method == "tools/call":
        params = message["params"]
        said = f"cannot connect with {os.environ.get(params['arguments']['name'], '')}"
        if params["name"] == "error_result":
            return {"result": {"isError": True, "content": [{"type": "text", "text": said}]}}
        return {"error": {"code": -32000, "message": said}}
    return {"result": {}}


for line in sys.stdin:
    message = json.loads(line)
    if "id" in message:  # notifications get no answer
        reply = {"jsonrpc": "2.0", "id": message["id"], **answer(message)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
