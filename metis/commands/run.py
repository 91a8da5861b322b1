"""`metis run "prompt"`: one turn, non-interactive, for scripts.

It creates a session on the workspace, sends the prompt, streams the reply's text to stdout
(tool calls and confirmations are reported on stderr), then ends the session (its data stays:
`metis sessions export ID`) unless `--keep`. `--session ID` and `--continue` send the turn in a
session that exists already (a script's conversation of several steps, or one begun in `metis
chat`) and leave it active. Confirmations are answered by flag: `--yes` allows, `--deny-all`
(the default) denies. `--json` prints one JSON object at the end instead of the text, also when
the daemon went away mid-turn (`status: interrupted`, tokens and cost unknown). The exit status
is 0 when the turn completed, 1 when it failed, was cancelled or was interrupted, 2 for a usage
or configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp

from metis.commands.client import NOT_A_URL, ApiFailure, DaemonApi, not_a_url
from metis.commands.daemon_client import add_arguments, target_from_args, unreachable
from metis.commands.daemon_client import session_id as session_argument
from metis.core.errors import ConfigError
from metis.wire import tooldisplay

TERMINAL_TYPES = ("turn.completed", "turn.cancelled", "turn.failed")
REFUSED_STATUSES = (400, 404, 409)


def _err(text: str) -> None:
    print(f"metis: {text}", file=sys.stderr, flush=True)


async def _session_for(api: DaemonApi, args: argparse.Namespace) -> tuple[str, bool]:
    """The session the turn goes to, and whether this run made it: `--session ID`, the one
    `--continue` finds, else a new one on the workspace."""
    if args.session:
        return str(args.session), False
    workspace = str(Path(args.workspace or ".").expanduser().resolve())
    if args.continue_:
        found = await api.last_used_session(workspace)
        if found is not None:
            return found, False
        _err("no active session on this workspace to continue; starting a new one")
    session = await api.call("POST", "/sessions", {"workspace_path": workspace})
    return str(session["id"]), True


def read_prompt(args: argparse.Namespace) -> str | None:
    """The prompt: the argument, or all of stdin for `-` (a long or generated prompt, no shell
    quoting); None, said on stderr, when stdin holds no text."""
    if args.prompt != "-":
        return str(args.prompt)
    if sys.stdin.isatty():
        _err("reading the prompt from stdin (end it with Ctrl-D)")
    try:
        text = sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError:
        _err("the prompt on stdin is not UTF-8 text")
        return None
    if not text.strip():
        _err("the prompt on stdin is empty")
        return None
    return text.rstrip("\n")  # the line end `echo` or a file's last line leaves


async def run_turn(api: DaemonApi, args: argparse.Namespace, prompt: str) -> int:
    session_id, made_here = await _session_for(api, args)
    # a session this run made is ended after its turn, unless asked to keep it for more
    ending = made_here and not (args.keep or args.continue_)
    got = await api.call("GET", f"/sessions/{session_id}")
    if got["ws_url"] is None:  # ended: it takes no more turns
        _err(
            f"session {session_id} has ended and takes no more turns "
            f"(`metis sessions export {session_id}` has what it holds)"
        )
        return 2
    ws = await api.ws_connect(got["ws_url"])
    text_parts: list[str] = []
    answered_by: str | None = None  # the model of the turn's latest reply
    new_message = False  # a later assistant message began: its text is set apart
    tools: list[dict[str, Any]] = []
    outcome: dict[str, Any] = {}
    try:
        await ws.send_json({"type": "subscribe", "filter": "preset:chat", "snapshot": True})
        for _ in range(2):  # the ack, then the snapshot
            frame = await ws.receive_json(timeout=10)
            if frame.get("type") == "subscribe_error":
                raise ApiFailure(409, {"error": frame})
        body: dict[str, Any] = {"content": [{"type": "text", "text": prompt}]}
        if args.model:
            body["per_message_override"] = args.model
        accepted = await api.call("POST", f"/sessions/{session_id}/turns", body)
        turn_id = accepted["turn_id"]
        decision = "allow" if args.yes else "deny"
        while not outcome:
            msg = await ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                # the daemon went away mid-turn: how the turn ended is for its next start to say
                outcome = {
                    "status": "interrupted",
                    "reason": "stream_closed",
                    "message": f"the daemon's stream closed before the turn ended (session "
                    f"{session_id}; `metis sessions show {session_id}` tells how it ended)",
                    "input_tokens": None,
                    "output_tokens": None,
                    "total_cost_usd": None,
                }
                break
            frame = json.loads(msg.data)
            if frame.get("type") == "ping":
                await ws.send_json({"type": "pong", "nonce": frame.get("nonce")})
                continue
            if frame.get("type") != "event":
                continue
            event = frame["event"]
            kind, p = event["type"], event.get("payload") or {}
            if event.get("turn_id") not in (None, turn_id):
                continue
            if kind == "message.start":
                new_message = bool(text_parts)
                answered_by = p.get("model") or answered_by
            elif kind == "text.delta":
                text = p.get("text", "")
                if new_message and text:  # the turn's next reply starts a paragraph of its own
                    text = ("\n" if text_parts[-1].endswith("\n") else "\n\n") + text
                    new_message = False
                text_parts.append(text)
                if not args.json:
                    sys.stdout.write(text)
                    sys.stdout.flush()
            elif kind == "tool.use_start":
                tools.append({"id": p["tool_use_id"], "name": p.get("tool_name")})
            elif kind == "tool.use_end":
                for call in tools:
                    if call["id"] == p["tool_use_id"]:
                        call["input"] = p.get("final_input")
                        summary = tooldisplay.summary(_name(call), call["input"])
                        if not args.json:
                            _err(f"tool {_name(call)} {summary}")
            elif kind == "tool.confirmation_requested":
                asked = p.get("command_summary") or p.get("input_summary")
                _err(f"{decision} {p.get('tool_name')}: {asked}")
                answer: dict[str, Any] = {"decision": decision}
                if decision == "deny":
                    answer["reason"] = "metis run without --yes"
                await api.answer_confirmation(
                    session_id, turn_id, p["confirmation_request_id"], answer
                )
            elif kind in ("tool.completed", "tool.failed"):
                for call in tools:
                    if call["id"] == p["tool_use_id"]:
                        call["is_error"] = kind == "tool.failed" or p.get("is_error")
                        call["duration_ms"] = p.get("duration_ms")
            elif kind in TERMINAL_TYPES:
                outcome = {"status": kind.removeprefix("turn."), **p}
    finally:
        await ws.close()
        if ending:
            with contextlib.suppress(ApiFailure, aiohttp.ClientError):
                await api.call("DELETE", f"/sessions/{session_id}")
    if args.json:
        print(
            json.dumps(
                {
                    "session_id": session_id,
                    "turn_id": turn_id,
                    "status": outcome["status"],
                    "reason": outcome.get("reason"),
                    "message": outcome.get("message"),
                    "model": answered_by or accepted.get("model"),
                    "text": "".join(text_parts),
                    "tool_calls": [
                        {
                            "name": _name(tool),
                            "summary": tooldisplay.summary(_name(tool), tool.get("input")),
                            "is_error": bool(tool.get("is_error")),
                            "duration_ms": tool.get("duration_ms"),
                        }
                        for tool in tools
                    ],
                    "input_tokens": outcome.get("input_tokens", 0),
                    "output_tokens": outcome.get("output_tokens", 0),
                    "cost_usd": outcome.get("total_cost_usd", "0"),
                },
                ensure_ascii=False,
            )
        )
    elif outcome["status"] == "interrupted":
        _end_line(text_parts)
        _err(outcome["message"])
    else:
        _end_line(text_parts)
        kept = "" if ending else " (kept)"
        line = (
            f"turn {outcome['status']} · session {session_id}{kept} · "
            f"${outcome.get('total_cost_usd')}"
        )
        if outcome["status"] != "completed":
            line += f" · {outcome.get('reason')}: {outcome.get('message') or ''}"
        _err(line)
    return 0 if outcome["status"] == "completed" else 1


def _end_line(text_parts: list[str]) -> None:
    """End the reply's last line on stdout, so that what is said next on stderr starts a line
    of its own in a terminal showing both."""
    if text_parts and not "".join(text_parts).endswith("\n"):
        print(flush=True)


def _name(tool: dict[str, Any]) -> str:
    return str(tool.get("name") or "")


async def _main(args: argparse.Namespace) -> int:
    try:
        target = target_from_args(args)
    except ConfigError as exc:
        _err(f"configuration error:\n{exc.message}")
        return 2
    prompt = read_prompt(args)
    if prompt is None:
        return 2
    try:
        async with DaemonApi(target.url, target.headers()) as api:
            return await run_turn(api, args, prompt)
    except NOT_A_URL:
        _err(not_a_url(target.url))
        return 2
    except aiohttp.ClientConnectionError:
        _err(unreachable(target.url))
        return 1
    except ApiFailure as exc:
        _err(str(exc))
        # refused: a bad request, or a session that is not there or cannot take the turn
        return 2 if exc.status in REFUSED_STATUSES else 1


def run_command(args: argparse.Namespace) -> int:
    return asyncio.run(_main(args))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run one turn non-interactively and print the reply",
        description="Send PROMPT as one turn in a new session (ended after it unless --keep), "
        "or in an existing one (--session, --continue), stream the reply's text to "
        "stdout, and exit 0 if the turn completed; 1 if it failed or was cancelled or the daemon "
        "cannot be reached; 2 if the daemon refused the request (say, an unknown --model, a "
        "refused workspace, an ended session or one with a turn running) or for a usage or "
        "configuration error.",
    )
    parser.add_argument("prompt", help="the message to send; - reads it from stdin")
    parser.add_argument(
        "--workspace",
        metavar="DIR",
        help="workspace directory of a new session, or the one --continue looks in (default: .)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--session",
        type=session_argument,
        help="send the turn in this active session (it stays active)",
    )
    which.add_argument(
        "--continue",
        dest="continue_",
        action="store_true",
        help="send the turn in the active session of the workspace used last (a new one, kept, "
        "if there is none)",
    )
    which.add_argument(
        "--keep",
        action="store_true",
        help="leave the new session active after the turn, for --session or --continue",
    )
    parser.add_argument("--model", metavar="ALIAS", help="model for this turn (default: routing)")
    answers = parser.add_mutually_exclusive_group()
    answers.add_argument("--yes", action="store_true", help="allow every tool confirmation")
    answers.add_argument(
        "--deny-all", action="store_true", help="deny every tool confirmation (the default)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    add_arguments(parser)
    parser.set_defaults(func=run_command)
