"""`metis sessions [list|show ID|end ID|export ID]`: the daemon's sessions, at a terminal or in
a script.

`list` prints the sessions newest first: two lines each at a terminal, one line of
tab-separated fields each into a pipe (`--json` the REST objects); `show` one session with its
turns, `end` ends it (data kept), `export` writes it as Markdown (readable) or JSON (the
canonical messages and events) to stdout or `--output FILE`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from metis.commands import usage
from metis.commands.client import ApiFailure, DaemonApi, turn_outcome, with_daemon
from metis.commands.columns import columns, cut
from metis.commands.daemon_client import add_arguments, session_id
from metis.commands.event_loop import run_command
from metis.commands.export_file import export_path, write_export
from metis.commands.paths import short_path
from metis.commands.printable import printable
from metis.core.sessions.search import SEARCH_CHARS
from metis.core.tools.textutil import visible_controls
from metis.wire.counts import counted, turn_totals
from metis.wire.export import FORMATS as EXPORT_FORMATS
from metis.wire.search import where_said
from metis.wire.when import local_time

ATTACH_FIELDS = ("attach_token", "attach_token_expires_at", "ws_url")
"""What `GET /sessions/{id}` adds for a WebSocket client, left out of what is shown."""


def _search_text(text: str) -> str:
    """`--search`'s text, refused here when the daemon would refuse it."""
    if len(text) > SEARCH_CHARS:
        raise argparse.ArgumentTypeError(f"at most {SEARCH_CHARS} characters")
    return text


_WORKSPACE_ROOM = 20
"""The least room a workspace path is given in a terminal listing's line."""


def _for_a_person(s: dict[str, Any], width: int) -> list[str]:
    """A session as a terminal shows it, in two lines cut to `width` (the listing never wraps):
    its title (cut first) with its status (and the tool calls waiting for an answer), turns and
    cost; then its id, when it was created
    (unless the line is too narrow for it) and its workspace (directories elided from the
    middle). A search result found by words said in a prompt or a reply has a third line with
    them in context (found in the title, it needs none)."""
    turns = s.get("turn_count", 0)
    asks = s.get("pending_confirmation_count", 0)
    status = f"{s['status']}, {asks} to confirm" if asks else s["status"]  # waiting for its user
    outcome = f" · {status} · {counted(turns, 'turn')} · ${s.get('cost_so_far_usd', '0')}"
    title = cut(printable(s.get("title") or "(no prompt yet)"), max(width - columns(outcome), 12))
    created = local_time(s.get("created_at"))
    where = f"  {s['id']} · {created} · "
    if width - len(where) < _WORKSPACE_ROOM:  # narrow: the workspace says more than the date
        where = f"  {s['id']} · "
    workspace = short_path(
        printable(s.get("workspace_path", "")), max(width - len(where), _WORKSPACE_ROOM)
    )
    lines = [cut(title + outcome, width), cut(where + workspace, width)]
    said = where_said(s.get("match"))
    if said is not None:
        lines.append(cut(f"  {said[0]}: {printable(said[1])}", width))
    return lines


def _line(s: dict[str, Any]) -> str:
    return "\t".join(
        [
            s["id"],
            s["status"],
            str(s.get("turn_count", 0)),
            f"${s.get('cost_so_far_usd', '0')}",
            str(s.get("created_at", ""))[:19],
            printable(s.get("workspace_path", "")),
            printable(s.get("title") or "-"),
        ]
    )


def _workspace(args: argparse.Namespace) -> str | None:
    """`--workspace DIR` as the daemon stores workspaces: absolute, symlinks resolved."""
    return str(Path(args.workspace).expanduser().resolve()) if args.workspace else None


async def _list(api: DaemonApi, args: argparse.Namespace) -> int:
    workspace = _workspace(args)
    status = "all" if args.all else "ended" if args.ended else "active"
    sessions = await api.sessions(workspace_path=workspace, status=status, q=args.search, limit=200)
    if args.json:
        print(json.dumps({"sessions": sessions}, ensure_ascii=False, indent=2))
        return 0
    if not sessions:
        # Said on stderr so a script reading stdout still sees an empty list.
        scope = "" if status == "all" else f" {status}"
        found = f" match {printable(args.search)!r}" if args.search else ""
        hint = "" if status == "all" else " (--all lists every session)"
        print(f"no{scope} sessions{found}{hint}", file=sys.stderr)
    # a person at a terminal reads two lines a session; a script reading a pipe, one line of
    # tab-separated fields
    if sys.stdout.isatty():
        width = shutil.get_terminal_size().columns
        for s in sessions:
            print("\n".join(_for_a_person(s, width)))
    else:
        for s in sessions:
            print(_line(s))
    return 0


async def _show(api: DaemonApi, args: argparse.Namespace) -> int:
    session = await api.call("GET", f"/sessions/{args.id}")
    for key in ATTACH_FIELDS:
        session.pop(key, None)
    if args.json:
        print(json.dumps(session, ensure_ascii=False, indent=2))
        return 0
    print(f"session   {session['id']}")
    print(f"title     {printable(session.get('title') or '-')}")
    print(f"workspace {printable(session['workspace_path'])}")
    print(
        f"model     {session.get('active_model')}"
        + ("" if session.get("sticky_model") else " (routing)")
    )
    print(f"created   {local_time(session['created_at'], seconds=True, zone=True)}")
    ended = session.get("ended_at")
    print(
        f"status    {'ended ' + local_time(ended, seconds=True, zone=True) if ended else 'active'}"
    )
    print(f"turns     {session['turn_count']}")
    print(f"cost      ${session['cost_so_far_usd']}")
    ends = await api.all_events(args.id, "turn.completed,turn.cancelled,turn.failed")
    for n, e in enumerate(ends, 1):
        p = e["payload"]
        print(f"  turn {n}: {turn_outcome(e['type'], p)} · {turn_totals(p)}")
    if session.get("current_turn_id"):
        print(f"  turn {len(ends) + 1}: {_running(session)}")
    return 0


def _running(session: dict[str, Any]) -> str:
    """The turn in flight, and what it waits for: a session stuck on a question says so, and
    how to answer it or give up on it."""
    state = "cancelling" if session.get("current_turn_status") == "cancelling" else "running"
    asks = len(session.get("pending_confirmations") or [])
    if not asks:
        return state
    calls = ", ".join(str(p.get("tool_name")) for p in session["pending_confirmations"])
    return (
        f"{state}, waiting for an answer to {counted(asks, 'tool call')} "
        f"({calls}): answer in `metis chat --session {session['id']}` or the dashboard, "
        f"or `metis sessions end {session['id']}`"
    )


async def _end(api: DaemonApi, args: argparse.Namespace) -> int:
    ended = await api.call("DELETE", f"/sessions/{args.id}")
    print(f"ended {ended['id']} at {local_time(ended['ended_at'], seconds=True, zone=True)}")
    return 0


async def _purge(api: DaemonApi, args: argparse.Namespace) -> int:
    if args.id is None and not args.ended:
        print("metis: name a session, or --ended (with --days N) for ended ones", file=sys.stderr)
        return 2
    if args.id is not None and (args.ended or args.days is not None or args.workspace):
        print(
            "metis: a session id, or --ended [--days N] [--workspace DIR], not both",
            file=sys.stderr,
        )
        return 2
    ids = [args.id] if args.id is not None else await _ended_ids(api, args)
    if args.id is None and not ids:
        print(f"no ended sessions to purge{_ended_scope(args)}", file=sys.stderr)
        return 0
    if not args.yes:
        what = (
            args.id
            if args.id is not None
            else f"{counted(len(ids), 'ended session')}{_ended_scope(args)}"
        )
        # ending is the way to keep a session's data, for one that has not ended yet
        keep = " (`metis sessions end` keeps them)" if args.id is not None else ""
        print(
            f"metis: purging deletes every message and event of {what} for good; "
            f"add --yes to purge{keep}",
            file=sys.stderr,
        )
        return 2
    for sid in ids:
        purged = await api.call("DELETE", f"/sessions/{sid}", params={"purge": "true"})
        deleted = purged.get("deleted") or {}
        print(
            f"purged {purged['id']}: {counted(deleted.get('messages', 0), 'message')}, "
            f"{counted(deleted.get('events', 0), 'event')} deleted"
        )
    return 0


async def _ended_ids(api: DaemonApi, args: argparse.Namespace) -> list[str]:
    """The ended sessions `--ended [--days N] [--workspace DIR]` names, oldest end first."""
    workspace = _workspace(args)
    sessions = await api.sessions(workspace_path=workspace, status="ended", limit=200)
    # a number of days further back than the calendar goes is all of it: nothing ended then
    days = min(args.days or 0, (datetime.now(UTC) - datetime.min.replace(tzinfo=UTC)).days)
    cutoff = datetime.now(UTC) - timedelta(days=days)
    old = [s for s in sessions if datetime.fromisoformat(s["ended_at"]) <= cutoff]
    return [s["id"] for s in sorted(old, key=lambda s: (s["ended_at"], s["id"]))]


def _ended_scope(args: argparse.Namespace) -> str:
    days = f" {args.days} or more days ago" if args.days else ""
    where = f" in {printable(args.workspace)}" if args.workspace else ""
    return f" (ended{days}{where})" if days or where else ""


def _days(value: str) -> int:
    """`--days`: a whole number of days, 0 or more."""
    try:
        days = int(value)
    except ValueError:
        days = -1
    if days < 0:
        raise argparse.ArgumentTypeError(f"not a number of days: {value!r}")
    return days


async def _title(api: DaemonApi, args: argparse.Namespace) -> int:
    """Exit 2 for a title that cannot be one, refused here (none, blank, or given with
    --clear) or by the daemon (a rule only it knows: an invisible one, too long)."""
    if args.clear and args.title is not None:
        print("metis: give a title or --clear, not both", file=sys.stderr)
        return 2
    if not args.clear and (args.title is None or not args.title.strip()):
        print(
            "metis: give a title, or --clear to title the session by its first prompt again",
            file=sys.stderr,
        )
        return 2
    try:
        # the answer holds the title in force (a cleared one falls back to the first prompt's)
        patched = await api.call("PATCH", f"/sessions/{args.id}", {"title": args.title})
    except ApiFailure as exc:
        if exc.code != "validation_error":
            raise
        print(f"metis: {exc.said}", file=sys.stderr)
        return 2
    print(f"{args.id}: {printable(patched.get('title') or '-')}")
    return 0


async def _export(api: DaemonApi, args: argparse.Namespace) -> int:
    text = await api.export(args.id, args.format)
    if args.output:
        path = export_path(args.output, args.id, args.format)
        write_export(path, text.encode())
        print(f"exported {args.id} to {path}", file=sys.stderr)
    else:  # at a terminal, the conversation's escape sequences are shown, not obeyed
        sys.stdout.write(visible_controls(text) if sys.stdout.isatty() else text)
    return 0


async def _main(args: argparse.Namespace) -> int:
    async def act(api: DaemonApi) -> int:
        result: int = await args.action(api, args)
        return result

    return await with_daemon(args, act)


_ID_HELP = "the session's id (sess_…; `metis sessions list` shows them)"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sessions",
        help="list, show, title, end, purge and export the daemon's sessions",
        description="List, show, title, end, purge and export the running daemon's sessions. "
        "Exit 1 when the daemon cannot be reached, refuses the call or a file cannot be "
        "written; 2 for a bad argument, config.yaml or daemon URL.",
    )
    sub = parser.add_subparsers(dest="sessions_command")
    parser.set_defaults(func=lambda _args: usage(parser))

    def command(name: str, help_text: str, action: Any, more: str = "") -> argparse.ArgumentParser:
        """A subcommand: `help_text` in the list of them, and as its `--help`'s first
        sentence, followed by `more`."""
        description = f"{help_text[:1].upper()}{help_text[1:]}. {more}".strip()
        p = sub.add_parser(name, help=help_text, description=description)
        p.set_defaults(func=lambda a: run_command(_main(a)), action=action)
        add_arguments(p)
        return p

    p = command(
        "list",
        "sessions, newest first (active ones unless --all or --ended)",
        _list,
        "At a terminal, two lines a session (dates in local time); into a pipe, one line of "
        "tab-separated fields: id, status, turns, cost, created (UTC), workspace, title.",
    )
    p.add_argument("--workspace", metavar="DIR", help="only the sessions of this workspace")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="include ended sessions")
    which.add_argument("--ended", action="store_true", help="only ended sessions")
    p.add_argument(
        "--search",
        metavar="TEXT",
        type=_search_text,
        help=(
            "only sessions whose conversation (title, prompts, replies) holds every word "
            "(or whose id starts so)"
        ),
    )
    p.add_argument("--json", action="store_true", help="the REST objects as JSON")
    p = command("show", "one session and its turns", _show)
    p.add_argument("id", type=session_id, help=_ID_HELP)
    p.add_argument("--json", action="store_true", help="the REST object as JSON")
    p = command("end", "end a session (its data is kept)", _end)
    p.add_argument("id", type=session_id, help=_ID_HELP)
    p = command(
        "purge",
        "delete a session and all it holds, for good; or --ended ones (--days N: ended N or "
        "more days ago)",
        _purge,
        "Without --yes it only says what it would delete (exit 2).",
    )
    p.add_argument("id", type=session_id, nargs="?", help=_ID_HELP)
    p.add_argument("--ended", action="store_true", help="every ended session (never an active one)")
    p.add_argument("--days", type=_days, metavar="N", help="with --ended: ended N or more days ago")
    p.add_argument("--workspace", metavar="DIR", help="with --ended: only this workspace's")
    p.add_argument("--yes", action="store_true", help="really delete them")
    p = command("title", "set a session's title (or --clear it)", _title)
    p.add_argument("id", type=session_id, help=_ID_HELP)
    p.add_argument("title", nargs="?", help="one line of text")
    p.add_argument("--clear", action="store_true", help="back to the first prompt's first line")
    p = command(
        "export",
        "write a session as Markdown or JSON",
        _export,
        "The file the daemon makes (the dashboard's Download). With --output it is written "
        "readable by you only (0600), whole or not at all; a FILE already there is replaced.",
    )
    p.add_argument("id", type=session_id, help=_ID_HELP)
    p.add_argument(
        "--format", choices=tuple(EXPORT_FORMATS), default="md", help="md (default) or json"
    )
    p.add_argument(
        "--output",
        metavar="FILE",
        help="write to FILE, or to ID.md/ID.json in a directory (default: stdout)",
    )
