"""`metis status`: is the daemon running, where, and is it ready to work.

One look at what a person checks before (or instead of) opening the dashboard: the daemon's
address, process and uptime, its sessions and running turns, which models can answer, the
routing policy in force, the MCP servers and whether the shell tool is sandboxed (and a
config.yaml broken since the daemon started, which the next start would refuse, and the files
read at start-up that were edited since, in force only once it restarts). Everything
comes from the daemon's public API with its key (`/health`, `/server/version`, `/models`,
`/routing/policy`, `/mcp`), asked at once; the pid and home from the lock file of the home
whose daemon it is (none for a `--url` elsewhere). Exit status: 0 running, 3 not running (as
service managers say it), 1 running but refusing the key or not a metis daemon, 2 for a
configuration error or a daemon URL it cannot use (as every one-shot command, `with_daemon`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from metis.commands.client import ApiFailure, DaemonApi, with_daemon
from metis.commands.daemon_client import (
    START_HINT,
    DaemonTarget,
    add_arguments,
    refused_key,
    target_from_args,
)
from metis.commands.detach import DAEMON_LOG
from metis.commands.event_loop import run_command
from metis.commands.printable import printable
from metis.commands.since_start import changed_since_start, models_problem
from metis.core.tools.textutil import visible_controls
from metis.server.lock import LOCK_FILE, read_holder, running_url
from metis.wire.when import local_time

NOT_RUNNING = 3
STATUS_TIMEOUT_S = 5.0
PATHS = ("/health", "/server/version", "/models", "/routing/policy", "/mcp")


def _pid(target: DaemonTarget) -> int | None:
    """The daemon's pid, when the lock file of its home names the daemon at this URL."""
    lock = target.home / LOCK_FILE
    if running_url(lock) != target.url:
        return None
    pid, _ = read_holder(lock)
    return pid


def _uptime(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{int(seconds)} s"
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} days"


def _in_use(sessions: int, turns: int) -> str:
    """Sessions in use right now: a turn running or a client attached (`/health`)."""
    if not sessions:
        return "none in use"
    running = f"{turns} turn{'s' * (turns != 1)} running" if turns else "no turn running"
    return f"{sessions} in use ({running})"


def _availability(model: dict[str, Any]) -> str:
    """A model's availability in words: why routing set it aside (the provider's words) and
    until when, in local time; the codes (`provider_unavailable`, `auth_error`) are in --json."""
    if model["availability"] == "healthy":
        return "healthy"
    detail = model.get("availability_detail")
    if not isinstance(detail, dict):
        return f"unavailable: {detail}" if detail else "unavailable"
    why = detail.get("message") or detail.get("trigger_reason")
    until = local_time(detail.get("recovers_at"), seconds=True, zone=True)
    return f"unavailable: {why}" + (f", until {until}" if until else "")


def _models_line(models: dict[str, Any]) -> str:
    usable = [f"{m['id']} ({_availability(m)})" for m in models["models"]]
    line = ", ".join(usable) or "none"
    if models["unconfigured"]:
        why = "not served offline" if models.get("offline_mode") else "without a key"
        line += f"; {len(models['unconfigured'])} more declared {why} (see `metis models`)"
    return line


def _mcp_line(servers: list[dict[str, Any]]) -> str:
    if not servers:
        return "none configured"
    ready = sum(s["state"] == "ready" for s in servers)
    states = ", ".join(f"{s['name']} {s['state']}" for s in servers)
    return f"{ready} of {len(servers)} ready: {states}"


def _routing_line(policy: dict[str, Any]) -> str:
    # a warning may mean turns go elsewhere than the file says (a global_default with no key)
    warnings = len(policy.get("warnings") or [])
    them = "it" if warnings == 1 else "them"
    warned = f", {warnings} warning{'s' * (warnings != 1)}: `metis routing check` shows {them}"
    if not policy["errors"] and policy["in_force"] == "user_file":
        return f"routing.yaml (valid{warned if warnings else ''})"
    if not policy["errors"] and policy["in_force"] == "shipped_default":
        return "the shipped default (there is no routing.yaml)"
    return f"{policy['reason']} (`metis routing check` says why)"


def _log_of(target: DaemonTarget, pid: int | None, health: dict[str, Any]) -> Path | None:
    """The log file of this home's daemon when it was started with `--detach`: the file has
    been written since the daemon started (a foreground daemon logs to its terminal)."""
    if pid is None:
        return None
    log = target.home / DAEMON_LOG
    try:
        written = log.stat().st_mtime
    except OSError:
        return None
    return log if written >= time.time() - health["uptime_seconds"] - 1 else None


_VALUE_AT = len("  shell tool: ")
"""The column where each fact's value starts, and a wrapped one goes on."""


def _wrapped(line: str, width: int) -> str:
    """`line` (a fact) wrapped to `width` with its value's column kept: a long routing or
    config line reads as one block at a terminal, not under the labels. Words are never
    split (a path longer than the line stays whole), nor is a command to type (`metis
    models`)."""
    if len(line) <= width or not line.startswith("  "):
        return line
    # the spaces of a `command` held as one word while the line is filled
    held = re.sub(r"`[^`]*`", lambda m: m.group().replace(" ", "\0"), line)
    filled = textwrap.fill(
        held,
        width,
        subsequent_indent=" " * _VALUE_AT,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return filled.replace("\0", " ")


@dataclass(frozen=True)
class Edits:
    """The files the daemon read at start-up that were edited since (`since_start`), and the
    first error of its models.yaml among them, which the next start would refuse."""

    changed: tuple[str, ...] = ()
    models_error: str | None = None

    @classmethod
    def of(cls, target: DaemonTarget, pid: int | None, version: dict[str, Any]) -> Edits:
        """Asked only of the home's own daemon (its lock names it): files in the home of a
        daemon found at another address say nothing about that daemon."""
        if pid is None:
            return cls()
        changed = tuple(changed_since_start(target.home, version.get("start_up_files")))
        return cls(changed, models_problem(target.home) if "models.yaml" in changed else None)


def _restart_line(edits: Edits, config_error: str | None) -> str | None:
    """What the edits since the start mean: nothing until a restart, which refuses a broken
    models.yaml (a broken config.yaml has its own line)."""
    changed = [n for n in edits.changed if not (n == "config.yaml" and config_error)]
    if not changed:
        return None
    they = "they apply" if len(changed) > 1 else "it applies"
    line = f"{', '.join(changed)} changed since the daemon started; {they} when it restarts"
    if "config.yaml" in changed:
        line += " (config.yaml's mcp section: `metis mcp reload` applies it now)"
    if edits.models_error is not None:
        line += f"; {edits.models_error} (the next start refuses it)"
    return line


def render(
    target: DaemonTarget,
    pid: int | None,
    body: dict[str, Any],
    log: Path | None = None,
    width: int | None = None,
    edits: Edits | None = None,
) -> str:
    """The status as a person reads it; `width` (a terminal's) wraps each fact to it."""
    health, version = body["/health"], body["/server/version"]
    who = f"pid {pid}, " if pid is not None else ""
    turns = health["active_turns"]
    sandbox = health["shell_sandbox"]
    lines = [
        f"metis {version['version']} is running at {target.url} "
        f"({who}up {_uptime(health['uptime_seconds'])})",
        f"  sessions:   {_in_use(health['active_sessions'], turns)}",
        f"  models:     {_models_line(body['/models'])}",
        f"  routing:    {_routing_line(body['/routing/policy'])}",
        f"  MCP:        {_mcp_line(body['/mcp']['servers'])}",
        "  shell tool: "
        + (
            f"sandboxed ({sandbox})" if sandbox != "none" else "NOT sandboxed (see docs/sandbox.md)"
        ),
        "Dashboard: `metis open`; chat: `metis chat`.",
    ]
    if pid is not None:  # the lock of this home names the daemon: it is that home's daemon
        lines.insert(1, f"  home:       {printable(target.home)}")
    if log is not None:
        lines.insert(2, f"  log:        {printable(log)}")
    if target.config_error is not None:
        lines.insert(-1, f"  config:     {target.config_error} (the next start refuses it)")
    restart = _restart_line(edits or Edits(), target.config_error)
    if restart is not None:
        lines.insert(-1, f"  restart:    {restart}")
    # a provider's or an MCP server's words are shown, never obeyed by a terminal
    lines = [visible_controls(line) for line in lines]
    if width is not None:
        lines = [_wrapped(line, width) for line in lines]
    return "\n".join(lines)


def as_json(
    target: DaemonTarget,
    pid: int | None,
    body: dict[str, Any],
    log: Path | None = None,
    edits: Edits | None = None,
) -> dict[str, Any]:
    """The status for scripts: the same facts, as the API gives them."""
    health = body["/health"]
    edits = edits or Edits()
    policy = body["/routing/policy"]
    return {
        "running": True,
        "url": target.url,
        "pid": pid,
        "home": str(target.home) if pid is not None else None,
        "log": str(log) if log is not None else None,
        "config_error": target.config_error,
        # read at start-up, edited since: in force once the daemon restarts
        "changed_since_start": list(edits.changed),
        "models_error": edits.models_error,
        "version": body["/server/version"]["version"],
        "started_at": health["started_at"],
        "uptime_seconds": health["uptime_seconds"],
        "active_sessions": health["active_sessions"],
        "active_turns": health["active_turns"],
        "shell_sandbox": health["shell_sandbox"],
        "models": [
            {"id": m["id"], "availability": m["availability"]} for m in body["/models"]["models"]
        ],
        "routing": {
            "in_force": policy["in_force"],
            "valid": policy["valid"],
            "reason": policy["reason"],
            "warnings": list(policy.get("warnings") or []),
        },
        "mcp": [{"name": s["name"], "state": s["state"]} for s in body["/mcp"]["servers"]],
    }


async def _ask(api: DaemonApi) -> dict[str, Any]:
    # awaited here, not through wait_for: a Ctrl-C meanwhile cancels the calls and the
    # gathering is seen to end, instead of being reported unretrieved at the exit
    async with asyncio.timeout(STATUS_TIMEOUT_S):
        answers = await asyncio.gather(*(api.call("GET", path) for path in PATHS))
    return dict(zip(PATHS, answers, strict=True))


def _not_running(target: DaemonTarget, args: argparse.Namespace) -> int:
    """Nothing answers. The home's daemon may run at another URL (`--url`, `--port`); if none
    does, the log of the home's last detached daemon, if any, may say why."""
    running = running_url(target.home / LOCK_FILE)
    elsewhere = running if running != target.url else None
    log = target.home / DAEMON_LOG
    last_log = str(log) if log.is_file() and elsewhere is None else None
    if args.json:
        print(
            json.dumps(
                {
                    "running": False,
                    "url": target.url,
                    "home": str(target.home),
                    "log": last_log,
                    "home_daemon_url": elsewhere,
                }
            )
        )
    elif elsewhere is not None:
        print(
            f"nothing answers at {target.url}; the daemon of {printable(target.home)} runs at "
            f"{elsewhere}"
        )
    else:
        print(
            f"metis is not running: nothing answers at {target.url} (home {printable(target.home)})"
        )
        if last_log is not None:
            print(f"The log of the daemon last started with --detach: {printable(last_log)}")
        print(f"{START_HINT[:1].upper()}{START_HINT[1:]}.")
    return NOT_RUNNING


def _not_answering(target: DaemonTarget, pid: int) -> str:
    return (
        f"the daemon of {printable(target.home)} (pid {pid}) holds {target.url} but did not answer within "
        f"{STATUS_TIMEOUT_S:g} s: stopped or stuck (`metis stop` ends it, after its timeout "
        "with kill -9)"
    )


def _failed(args: argparse.Namespace, reason: str, message: str) -> int:
    """A daemon that is there but cannot be asked (a refused key, no answer): said on stderr,
    and with --json as the one object on stdout as well (exit 1)."""
    print(f"metis: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps({"running": True, "error": reason, "message": message}))
    return 1


async def _status(args: argparse.Namespace) -> int:
    async def report(api: DaemonApi) -> int:
        # the target `with_daemon` resolved (it raises no error a second time): its home
        # names the lock file that may hold the daemon's pid
        target = target_from_args(args)
        try:
            body = await _ask(api)
        except aiohttp.ClientConnectionError:
            return _not_running(target, args)
        except TimeoutError:
            pid = _pid(target)
            if pid is None:  # no daemon of this home holds the address: something else does
                return _not_running(target, args)
            return _failed(args, "not_answering", _not_answering(target, pid))
        except ApiFailure as exc:
            if exc.status != 401:
                raise
            return _failed(args, "key_refused", refused_key(target.url))
        pid = _pid(target)
        log = _log_of(target, pid, body["/health"])
        edits = Edits.of(target, pid, body["/server/version"])
        if args.json:
            print(json.dumps(as_json(target, pid, body, log, edits), ensure_ascii=False))
        else:
            width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
            print(render(target, pid, body, log, width, edits))
        return 0

    # a bad config.yaml or URL, a refusal or an answer that is not a daemon's: said as every
    # one-shot command says them (whether a daemon runs is then unknown)
    return await with_daemon(args, report, {"running": None})


def status_command(args: argparse.Namespace) -> int:
    return run_command(_status(args))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status",
        help="is the daemon running, where, and with which models",
        description="Say whether the daemon is running and how it is: address, pid and uptime, "
        "sessions and running turns, the models that can answer, the routing policy in force, "
        "the MCP servers and the shell tool's sandbox. Exit 0 when it runs, 3 when nothing "
        "answers, 1 when it refuses the key or holds its home and port without answering "
        "(stopped or stuck), 2 for a bad config.yaml (with no daemon running) or a bad "
        "daemon URL.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_arguments(parser)
    # a config.yaml broken while the daemon runs is a line of the status, not a warning
    parser.set_defaults(func=status_command, config_warning=False)
