"""The prompt's `/` commands: what each does, and the one list `/help` and Tab completion read.

A command is metis talking about the session (its model, cost, title, export, the other
sessions), not a turn: its output is a note in the transcript, and a failed call to the daemon
is a note too, never the end of the app. Switching sessions and leaving are the app's own
actions; the commands only call them.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from textual.screen import Screen

from metis.commands.client import CALL_FAILURES, ApiFailure, DaemonApi
from metis.commands.export_file import export_path, write_export
from metis.commands.tui.code_blocks import code_blocks
from metis.commands.tui.screens import PickedSession, SessionPicker
from metis.wire.counts import counted, tokens_in
from metis.wire.export import FORMATS as EXPORT_FORMATS
from metis.wire.mcp import reload_outcome
from metis.wire.models import unconfigured_reason
from metis.wire.table import table_lines

PICKER_SESSIONS = 50
"""The sessions the picker lists at most, newest first (a search reaches older ones)."""

COMMANDS = {
    "/model": "/model [alias|-]  pin a model (- : routing decides); no argument shows it",
    "/models": "/models  the models, their context windows, and why any cannot answer",
    "/cost": "/cost  this session's cost and tokens",
    "/sessions": "/sessions  pick an active session of this workspace to switch to",
    "/new": "/new  start a new session on this workspace",
    "/title": "/title TEXT  rename this session",
    "/export": "/export [md|json] [FILE]  write this session to a file",
    "/copy": "/copy [code]  put the last reply (or its code blocks) on the clipboard",
    "/mcp": "/mcp [restart NAME | reload]  the MCP servers and their tools, or restart / reload them",
    "/help": "/help  this list",
    "/quit": "/quit  leave (Ctrl-C twice does too)",
}


KEYS = (
    ("Enter", "send"),
    ("Shift+Enter, Ctrl+J", "new line"),
    ("↑ / ↓", "prompt history (on the first / last line)"),
    ("Tab", "complete a /command, /model's alias or @alias; again, the next one"),
    ("PageUp / PageDown", "scroll the transcript"),
    ("Shift+Tab", "to the collapsed parts (thinking, show all…), Enter opens; back to the prompt"),
    ("Esc, Ctrl-C", "cancel the running turn"),
    ("Ctrl-C twice, Ctrl-Q", "quit"),
    ("Ctrl-O", "answer a pending confirmation"),
    ("@alias message", "that model answers this message (@haiku summarise README.md)"),
)
"""The keys `/help` lists after the commands (docs/tui.md has them too)."""


class CommandHost(Protocol):
    """What of the app the commands use."""

    api: DaemonApi
    session_id: str | None
    session: dict[str, Any]
    workspace: str
    models: dict[str, dict[str, Any]]

    @property
    def note_width(self) -> int: ...

    async def note(self, text: str, *, error: bool = False, listing: bool = False) -> object: ...

    def call_failed(self, exc: ApiFailure | aiohttp.ClientError | TimeoutError) -> str: ...

    def last_reply(self) -> str | None: ...

    def copy_to_clipboard(self, text: str) -> None: ...

    async def refresh_status(self, *, fetch: bool = True) -> None: ...

    async def switch_to(self, session_id: str, *, at: str | None = None) -> None: ...

    def show_message(self, message_id: str) -> None: ...

    async def new_session(self) -> None: ...

    async def action_quit_chat(self) -> None: ...

    def push_screen(self, screen: Screen[Any], callback: Callable[[Any], None]) -> object: ...

    def run_worker(self, work: Coroutine[Any, Any, None], *, group: str) -> object: ...


class SlashCommands:
    """`run` takes the prompt's line (`/name args`) and answers it in the transcript."""

    def __init__(self, host: CommandHost) -> None:
        self.host = host
        self._handlers = {
            "/quit": self._quit,
            "/exit": self._quit,
            "/help": self._help,
            "/model": self._model,
            "/models": self._models,
            "/cost": self._cost,
            "/sessions": self._sessions,
            "/new": self._new,
            "/title": self._title,
            "/export": self._export,
            "/copy": self._copy,
            "/mcp": self._mcp,
        }

    def knows(self, line: str) -> bool:
        """Whether the line names a command: an unknown one keeps its text in the prompt."""
        return line.split(maxsplit=1)[0] in self._handlers

    async def run(self, line: str) -> None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        handler = self._handlers.get(name)
        if handler is None:
            await self.host.note(
                f"unknown command {name}: /help lists them; a message that starts with / is "
                "sent when a space comes before it",
                error=True,
            )
            return
        try:
            await handler(arg)
        except CALL_FAILURES as exc:
            await self.host.note(self.host.call_failed(exc), error=True)

    async def _quit(self, arg: str) -> None:
        await self.host.action_quit_chat()

    async def _help(self, arg: str) -> None:
        """The commands, then the keys, in the same two columns: a description too long for
        the terminal wraps within its column."""
        commands = [tuple(line.split("  ", 1)) for line in COMMANDS.values()]
        rows = [*commands, ("", ""), *KEYS]
        await self.host.note("\n".join(table_lines(rows, self.host.note_width)), listing=True)

    async def _model(self, arg: str) -> None:
        host = self.host
        if not arg:
            await host.refresh_status()
            how = "pinned" if host.session.get("sticky_model") else "routing decides"
            await host.note(f"model: {host.session.get('active_model')} ({how})")
            return
        reference = None if arg == "-" else arg
        change = await host.api.call(
            "PATCH", f"/sessions/{host.session_id}", {"active_model": reference}
        )
        when = (
            f" after turn {change['swap_queued_until_turn']}" if change.get("swap_queued") else ""
        )
        how = " (routing decides)" if reference is None else " (pinned)"
        await host.note(f"model: {change.get('active_model')}{how}{when}")
        await host.refresh_status()

    async def _models(self, arg: str) -> None:
        """Every model of the registry: those that answer with their availability, then the
        declared ones that cannot, with why (a key to set, say)."""
        listing = await self.host.api.call("GET", "/models")
        rows = [("model", "aliases", "context", "availability")]
        for m in listing.get("models", []):
            window = (m.get("capabilities") or {}).get("max_context_tokens")
            rows.append(
                (
                    m["id"],
                    ", ".join(m.get("aliases", [])),
                    f"{window:,}" if window else "?",
                    str(m.get("availability")),
                )
            )
        for m in listing.get("unconfigured", []):
            rows.append((m["id"], ", ".join(m.get("aliases") or []), "-", unconfigured_reason(m)))
        # metis's own output: a note, not a reply
        await self.host.note("\n".join(table_lines(rows, self.host.note_width)), listing=True)

    async def _cost(self, arg: str) -> None:
        host = self.host
        await host.refresh_status()
        events = await host.api.all_events(str(host.session_id), "llm.call_completed")
        read = sum(tokens_in(e["payload"]) for e in events)
        tokens_out = sum(e["payload"].get("output_tokens", 0) for e in events)
        await host.note(
            f"session cost ${host.session.get('cost_so_far_usd')} · "
            f"{counted(int(host.session.get('turn_count') or 0), 'turn')} · "
            f"{counted(len(events), 'model call')} · "
            f"{read:,} in / {tokens_out:,} out tokens"
        )

    async def _sessions(self, arg: str) -> None:
        host = self.host

        async def search(text: str) -> list[dict[str, Any]]:
            # ended sessions are not listed: they cannot be continued (`metis sessions export`)
            return await host.api.sessions(
                most=PICKER_SESSIONS,
                workspace_path=host.workspace,
                surface="metis",
                status="active",
                q=text.strip() or None,
                limit=PICKER_SESSIONS,
            )

        sessions = await search("")
        if not [s for s in sessions if s["id"] != host.session_id]:
            await host.note("no other active session on this workspace; /new starts one")
            return

        def picked(choice: PickedSession | None) -> None:
            if choice is None:
                return
            if choice.session_id != host.session_id:
                switching = host.switch_to(choice.session_id, at=choice.message_id)
                host.run_worker(switching, group="switch")
            elif choice.message_id is not None:  # this session, found by words of a message
                host.show_message(choice.message_id)

        host.push_screen(SessionPicker(sessions, host.session_id, search), picked)

    async def _new(self, arg: str) -> None:
        await self.host.new_session()

    async def _title(self, arg: str) -> None:
        host = self.host
        if not arg:
            await host.note(f"title: {host.session.get('title') or '(none yet)'}")
            return
        await host.api.call("PATCH", f"/sessions/{host.session_id}", {"title": arg})
        await host.refresh_status()
        await host.note(f"title: {host.session.get('title')}")

    async def _export(self, arg: str) -> None:
        host = self.host
        parts = arg.split(maxsplit=1)
        fmt = "md"
        if parts and parts[0] in EXPORT_FORMATS:
            fmt = parts.pop(0)
        elif parts and not _names_a_file(parts[0]):
            # a bare word is a format, not a file name: `/export txt` is refused, not a file
            await host.note(
                f"unknown export format {parts[0]}: md or json (/export [md|json] [FILE])",
                error=True,
            )
            return
        path = export_path(parts[0] if parts else None, str(host.session_id), fmt)
        text = await host.api.export(str(host.session_id), fmt)
        try:
            write_export(path, text.encode())
        except OSError as exc:
            await host.note(f"cannot write {path}: {exc}", error=True)
            return
        await host.note(f"exported to {path.resolve()} ({fmt})")

    async def _copy(self, arg: str) -> None:
        host = self.host
        if arg not in ("", "code"):
            await host.note(f"unknown /copy use {arg!r}: /copy or /copy code", error=True)
            return
        reply = host.last_reply()
        if reply is None:
            await host.note("no reply to copy yet", error=True)
            return
        what = "the last reply"
        if arg == "code":
            blocks = code_blocks(reply)
            if not blocks:
                await host.note("the last reply has no code block; /copy copies all of it")
                return
            reply = "\n\n".join(blocks)
            count = "the code block" if len(blocks) == 1 else f"the {len(blocks)} code blocks"
            what = f"{count} of the last reply"
        host.copy_to_clipboard(reply)
        lines = reply.count("\n") + 1
        # through the terminal (OSC 52): a terminal that does not take it says nothing
        await host.note(f"copied {what} to the clipboard ({lines} line{'s' * (lines != 1)})")

    async def _mcp(self, arg: str) -> None:
        action, _, name = arg.partition(" ")
        if action == "restart" and name.strip():
            server = await self.host.api.restart_mcp_server(name.strip())
            await self.host.note(f"MCP server {server['name']}: restarting; /mcp shows its state")
            return
        if arg.strip() == "reload":
            reloaded = await self.host.api.reload_mcp_servers()
            outcome = reload_outcome(reloaded["applied"])
            summary = mcp_summary(reloaded["servers"], self.host.note_width)
            await self.host.note(f"{outcome}\n{summary}", listing=True)
            return
        if arg:
            await self.host.note(
                f"unknown /mcp use {arg!r}: /mcp, /mcp restart NAME or /mcp reload", error=True
            )
            return
        body = await self.host.api.call("GET", "/mcp")
        await self.host.note(mcp_summary(body["servers"], self.host.note_width), listing=True)


def _names_a_file(word: str) -> bool:
    """Whether `/export`'s first word is where to write rather than a format: a file name
    (`notes.md`), a path, or a directory that exists (`~`, `exports`: the export goes inside)."""
    return "." in word or "/" in word or Path(word).expanduser().is_dir()


def mcp_summary(servers: list[dict[str, Any]], width: int | None = None) -> str:
    """A few lines per server for the transcript: what the model can use and, when a server is
    not ready or some of its tools are not offered, why (its `last_error`). A detail line too
    long for `width` wraps under its own indent, not back at the note's left edge where it read
    as the next server."""

    def detail(text: str) -> list[str]:
        if width is None:
            return ["  " + text]
        return textwrap.wrap(
            text, width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False
        )

    if not servers:
        return "no MCP servers configured (config.yaml: mcp.servers)"
    ready = sum(s["state"] == "ready" for s in servers)
    lines = [f"MCP servers: {len(servers)}, {ready} ready"]
    for s in servers:
        count = len(s["tools"])
        facts = [s["name"], s["state"], s["transport"], f"{count} tool{'s' * (count != 1)}"]
        if s["restarts"]:
            facts.append(f"restarted {s['restarts']}×")
        lines.append(" · ".join(facts))
        if s["tools"]:
            lines.extend(detail(", ".join(f"{t['name']} ({t['policy']})" for t in s["tools"])))
        if s["last_error"]:
            # a ready server's is the list of its tools not offered, each saying why
            said = "" if s["state"] == "ready" else "last error: "
            lines.extend(detail(said + s["last_error"]))
    return "\n".join(lines)
