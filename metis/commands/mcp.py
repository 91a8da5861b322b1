"""`metis mcp list`: the daemon's MCP servers, their state and their tools (`GET /mcp`);
`metis mcp restart NAME`: one of them connected again now with its entry as config.yaml has
it, waited for; `metis mcp reload`: every change of config.yaml's `mcp` section applied."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from typing import Any

from metis.commands import seconds_argument, usage
from metis.commands.client import DaemonApi, with_daemon
from metis.commands.columns import columns, cut, pad
from metis.commands.daemon_client import add_arguments
from metis.commands.event_loop import run_command
from metis.core.tools.textutil import visible_controls
from metis.wire.mcp import reload_outcome


def _row(cells: list[str], widths: list[int] | None) -> str:
    """Cells tab-separated (for a script), or each but the last padded to its column's width
    (`widths`, at a terminal)."""
    if widths is None:
        return "\t".join(cells)
    return "  ".join([*(pad(c, w) for c, w in zip(cells, widths, strict=False)), cells[-1]])


def _widths(rows: list[list[str]], aligned: bool) -> list[int] | None:
    """The width of every column but the last, over all rows; None when not aligned."""
    if not aligned or not rows:
        return None
    return [max(columns(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]


def _where(server: dict[str, Any]) -> str:
    if server["transport"] == "http":
        return str(server["url"])
    return " ".join([server["command"], *server["args"]])


def render(
    servers: list[dict[str, Any]], *, aligned: bool = False, width: int | None = None
) -> str:
    """One block per server: name, state, transport and command or url, then its tools (names
    as offered) with their modes; `aligned`: in columns for a person, else tab-separated.
    `width` (a terminal's): a server's line is cut to it, its command's end elided, so that the
    columns do not wrap (`--json` and a pipe have the whole command)."""
    if not servers:
        return "no MCP servers configured (config.yaml: mcp.servers)\n"
    heads = [[s["name"], s["state"], s["transport"], _where(s)] for s in servers]
    tools = [[f"  {t['name']}", t["policy"]] for s in servers for t in s["tools"]]
    head_widths, tool_widths = _widths(heads, aligned), _widths(tools, aligned)
    lines: list[str] = []
    for s, head in zip(servers, heads, strict=True):
        row = _row(head, head_widths)
        lines.append(row if width is None else cut(row, width))
        if s["restarts"]:
            lines.append(f"  restarts: {s['restarts']}")
        if s["last_error"]:
            lines.append(f"  last error: {s['last_error']}")
        names = s["env"] if s["transport"] == "stdio" else s["headers"]
        if names:
            label = "env" if s["transport"] == "stdio" else "headers"
            lines.append(f"  {label}: {', '.join(names)}")
        for tool in s["tools"]:
            lines.append(_row([f"  {tool['name']}", tool["policy"]], tool_widths))
    # a server's errors and tool names are its own text: shown, never obeyed by a terminal
    return visible_controls("\n".join(lines)) + "\n"


def _layout() -> dict[str, Any]:
    """How `render` lays the servers out on stdout: in columns cut to a terminal's width, or
    tab-separated and whole for a script."""
    if not sys.stdout.isatty():
        return {"aligned": False}
    return {"aligned": True, "width": shutil.get_terminal_size().columns}


async def _list(args: argparse.Namespace) -> int:
    async def show(api: DaemonApi) -> int:
        body = await api.call("GET", "/mcp")
        if args.json:
            print(json.dumps(body, ensure_ascii=False, indent=2))
        else:
            sys.stdout.write(render(body["servers"], **_layout()))
        return 0

    return await with_daemon(args, show)


RESTART_POLL_S = 0.2


async def _restart(args: argparse.Namespace) -> int:
    """Ask for the restart, then follow `GET /mcp` until the server is ready or its new attempt
    failed (or `--wait` runs out): exit 0 only when it is ready."""

    async def restart(api: DaemonApi) -> int:
        server = await api.restart_mcp_server(args.name)
        deadline = time.monotonic() + args.wait
        while server["state"] != "ready" and server["last_error"] is None:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(RESTART_POLL_S)
            servers = (await api.call("GET", "/mcp"))["servers"]
            now = next((s for s in servers if s["name"] == args.name), None)
            if now is None:  # a reload meanwhile applied a config.yaml without it
                print(
                    f"metis: MCP server {args.name!r} is no longer configured: config.yaml was "
                    "applied without it while it restarted",
                    file=sys.stderr,
                )
                return 1
            server = now
        count = len(server["tools"])
        line = f"{server['name']}: {server['state']}, {count} tool{'s' * (count != 1)}"
        if server["last_error"]:
            line += f"\n  last error: {server['last_error']}"
        elif server["state"] != "ready":
            line += f" (not ready after {args.wait:g} s; `metis mcp list` follows it)"
        print(visible_controls(line))  # its error is the server's text, as in `render`
        return 0 if server["state"] == "ready" else 1

    return await with_daemon(args, restart)


async def _reload(args: argparse.Namespace) -> int:
    async def reload(api: DaemonApi) -> int:
        reloaded = await api.reload_mcp_servers()
        print(reload_outcome(reloaded["applied"]))
        sys.stdout.write(render(reloaded["servers"], **_layout()))
        return 0

    return await with_daemon(args, reload)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="the daemon's MCP servers and their tools",
        description="The running daemon's MCP servers (config.yaml `mcp.servers`): list them, "
        "connect to one again, apply config.yaml's changes.",
    )
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
    p.set_defaults(func=lambda a: run_command(_list(a)))
    p = sub.add_parser(
        "restart",
        help="connect to a server again now and wait until it is ready",
        description="End the server's connection (its process, for a stdio server) and connect "
        "again at once with its entry as config.yaml has it now, without waiting out the "
        "restart backoff: for a server fixed since it failed (the server or its entry), or one "
        "stuck starting. A name added to config.yaml is started; one it disables or no longer "
        "has is stopped. A tool call running on it fails. Waits until the server is ready "
        "(exit 0) or its new attempt fails (exit 1, with why).",
    )
    p.add_argument("name", help="the server's name in config.yaml (mcp.servers)")
    p.add_argument(
        "--wait",
        type=seconds_argument,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for it to be ready (default 30)",
    )
    add_arguments(p)
    p.set_defaults(func=lambda a: run_command(_restart(a)))
    p = sub.add_parser(
        "reload",
        help="apply config.yaml's mcp section as it is now",
        description="Apply the mcp section of config.yaml as it is now: a server whose entry "
        "changed is restarted with it, an added one started, a disabled or removed one stopped "
        "and its tools withdrawn; the others go on untouched. Prints the servers then (a "
        "restarted one is `restarting`: `metis mcp list` follows it). A config.yaml with an "
        "error changes nothing (exit 1, naming file, line and key).",
    )
    add_arguments(p)
    # a broken config.yaml is this command's own answer (exit 1): not a warning said before it
    p.set_defaults(func=lambda a: run_command(_reload(a)), config_warning=False)
