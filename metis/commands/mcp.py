"""`metis mcp list`: the daemon's MCP servers, their state and their tools (`GET /mcp`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from metis.commands import usage
from metis.commands.client import DaemonApi, with_daemon
from metis.commands.daemon_client import add_arguments


def render(servers: list[dict[str, Any]]) -> str:
    """One block per server: name, transport, state, then its tools (names as offered)."""
    if not servers:
        return "no MCP servers configured (config.yaml: mcp.servers)\n"
    lines: list[str] = []
    for s in servers:
        where = s["url"] if s["transport"] == "http" else " ".join([s["command"], *s["args"]])
        lines.append(f"{s['name']}\t{s['state']}\t{s['transport']}\t{where}")
        if s["restarts"]:
            lines.append(f"  restarts: {s['restarts']}")
        if s["last_error"]:
            lines.append(f"  last error: {s['last_error']}")
        names = s["env"] if s["transport"] == "stdio" else s["headers"]
        if names:
            label = "env" if s["transport"] == "stdio" else "headers"
            lines.append(f"  {label}: {', '.join(names)}")
        for tool in s["tools"]:
            lines.append(f"  {tool['name']}\t{tool['policy']}")
    return "\n".join(lines) + "\n"


async def _list(args: argparse.Namespace) -> int:
    async def show(api: DaemonApi) -> int:
        body = await api.call("GET", "/mcp")
        if args.json:
            print(json.dumps(body, ensure_ascii=False, indent=2))
        else:
            sys.stdout.write(render(body["servers"]))
        return 0

    return await with_daemon(args, show)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("mcp", help="the daemon's MCP servers and their tools")
    sub = parser.add_subparsers(dest="mcp_command")
    parser.set_defaults(func=lambda _args: usage(parser))
    p = sub.add_parser(
        "list",
        help="servers, state, last error and tools",
        description="The MCP servers of the running daemon (config.yaml `mcp.servers`): state, "
        "last error and tools. Environment variables and headers are shown by name only.",
    )
    p.add_argument("--json", action="store_true", help="the GET /mcp body as JSON")
    add_arguments(p)
    p.set_defaults(func=lambda a: asyncio.run(_list(a)))
