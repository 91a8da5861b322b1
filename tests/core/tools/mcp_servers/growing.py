"""An MCP server over stdio, written by hand (JSON-RPC lines), whose tools change as it runs:
it lists `grow`; calling `grow` replaces it by `grown` and says so with
`notifications/tools/list_changed`, as a server that offers tools once a login or a project
is open does. Given `stalls`, it never answers the listing that follows."""

from __future__ import annotations

import json
import sys
from typing import Any

tools = ["grow"]
STALLS = sys.argv[1:] == ["stalls"]


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def answer(message: dict[str, Any]) -> dict[str, Any]:
    global tools
    method = message.get("method")
    if method == "initialize":
        return {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "growing", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in tools]}
    if method == "tools/call":
        if message["params"]["name"] == "grow":
            tools = ["grown"]
            send({"method": "notifications/tools/list_changed"})
        return {"content": [{"type": "text", "text": f"{message['params']['name']} ran"}]}
    return {}


for line in sys.stdin:
    message = json.loads(line)
    if STALLS and tools == ["grown"] and message.get("method") == "tools/list":
        continue  # never answered
    if "id" in message:  # notifications get no answer
        send({"id": message["id"], "result": answer(message)})
