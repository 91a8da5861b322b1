"""`metis run "prompt"`: one turn, non-interactive, for scripts.

It creates a session on the workspace, sends the prompt, streams the reply's text to stdout
(tool calls and confirmations are reported on stderr), then ends the session (its data stays:
`metis sessions export ID`) unless `--keep`; a session it made for a turn the daemon refused
is purged, as it holds nothing. `--session ID` and `--continue` send the turn in a session that
exists already (a script's conversation of several steps, or one begun in `metis chat`) and
leave it active. Confirmations are answered by flag: `--yes` allows, `--deny-all` (the default)
denies. `--json` prints one JSON object at the end instead of the text, also when the daemon
went away mid-turn (`status: interrupted`, tokens and cost unknown) or the run could not be
made (`status: refused` or `error`, with `reason` and `message`). The exit status is 0 when the
turn completed, 3 when it completed with its reply cut off by the output limit (`max_tokens`:
the text is partial and a tool call it was writing never ran), 1 when it failed, was cancelled
or was interrupted, 2 for a refused request, a
usage or configuration error, 130 for Ctrl-C while the prompt is read or before the turn runs
(during the turn, Ctrl-C cancels it; twice, it leaves at once: 130). SIGTERM (`kill`, `timeout`)
does the same, with 143, and leaves if the cancelled turn has not ended within 5 seconds; so
does SIGHUP during the turn (its terminal closed), with 129. A session the run made but could
not end (the daemon stopping meanwhile) is said to be left active.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from metis.commands import hangup_unless_ignored
from metis.commands.client import (
    NOT_A_URL,
    ApiFailure,
    DaemonApi,
    NotADaemon,
    NotUtf8,
    failure_text,
    not_a_url,
    turn_outcome,
)
from metis.commands.daemon_client import add_arguments, target_from_args, unreachable
from metis.commands.daemon_client import session_id as session_argument
from metis.config import AddressError
from metis.core.errors import ConfigError
from metis.core.tools.textutil import visible_controls
from metis.wire import tooldisplay
from metis.wire.counts import INPUT_BUCKETS

TERMINAL_TYPES = ("turn.completed", "turn.cancelled", "turn.failed")
TRUNCATED_EXIT = 3
# How every client says a reply the output limit stopped, and the tool call it cut off
# (`tool.use_end`'s `dropped`), which never runs
CUT_OFF = "cut off by the output limit (max_tokens)"
DROPPED = "dropped: its arguments were cut off by the output limit; not run"
# A complete call of such a reply: the turn ends with the reply, so it is answered, never run
UNRUN = "not run: the reply was cut off by the output limit"
ENDED_WAIT_S = 2.0
REFUSED_STATUSES = (400, 404, 409, 413)  # 413: a prompt larger than the daemon takes


def _err(text: str) -> None:
    """A line of metis's on stderr; what it quotes (a tool's input, the daemon's words) has
    its control characters shown escaped, never obeyed by a terminal."""
    print(f"metis: {visible_controls(text)}", file=sys.stderr, flush=True)


class RunError(Exception):
    """A run that ends before a turn of it does: the reason's code, what it says, the exit
    status (2: refused, by the daemon or before asking it; 1: the daemon failed to answer)."""

    def __init__(self, reason: str, message: str, exit_code: int, *, said: str = "") -> None:
        super().__init__(said or message)  # what stderr says, when not `message`
        self.reason = reason
        self.message = message
        self.exit_code = exit_code

    @classmethod
    def of(cls, exc: ApiFailure) -> RunError:
        """What the daemon said, refused (a bad request, a session that is not there or cannot
        take the turn) or failed."""
        exit_code = 2 if exc.status in REFUSED_STATUSES else 1
        # a refused key reads as every client says it (whose key, where it comes from)
        message = exc.said if exc.status == 401 else str(exc).removeprefix(f"{exc.code}: ")
        return cls(exc.code, message, exit_code, said=exc.said)


def _one_reader() -> bool:
    """Whether stdout and stderr are one open file: the same terminal, or one file or pipe
    (`2>&1`)."""
    try:
        return os.path.samestat(os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno()))
    except (OSError, ValueError):  # a stream without a file descriptor, or a closed one
        return False


class _Reply:
    """The turn's reply text as it streams, and what stdout shows of it: where one reader sees
    both (a terminal, or `2>&1` into one file or pipe), a note on stderr (a tool call, a
    confirmation) starts a line of its own instead of continuing the reply's."""

    def __init__(self, show: bool) -> None:
        self.show = show  # printed as it comes (not `--json`)
        self.interleaved = show and _one_reader()
        # at a terminal, the model's escape sequences are shown, not obeyed (`\x1b]52;…`
        # would set the clipboard); into a pipe, the reply is passed on as written
        self._at_a_terminal = show and sys.stdout.isatty()
        self.parts: list[str] = []
        self._new_message = False  # a later assistant message began: its text is set apart
        self._line_ended = True  # stdout's last output ended its line (or there was none)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def next_message(self) -> None:
        self._new_message = bool(self.parts)

    def add(self, text: str) -> None:
        if not text:
            return
        shown = text
        if self._new_message:  # the turn's next reply starts a paragraph of its own
            self._new_message = False
            self.parts.append("\n" if self.parts[-1].endswith("\n") else "\n\n")
            shown = ("\n" if self._line_ended else "\n\n") + text
        self.parts.append(text)
        if self.show:
            self._write(shown)

    def note(self, text: str) -> None:
        if self.interleaved:
            self.end_line()
        _err(text)

    def end_line(self) -> None:
        """End the reply's last line on stdout, so that what is said next on stderr starts a
        line of its own where one reader sees both."""
        if self.show and not self._line_ended:
            self._write("\n")

    def _write(self, text: str) -> None:
        sys.stdout.write(visible_controls(text) if self._at_a_terminal else text)
        sys.stdout.flush()
        self._line_ended = text.endswith("\n")


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


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt: the argument, or all of stdin for `-` (a long or generated prompt, no shell
    quoting). One with no text is refused here: the daemon would refuse the turn."""
    if args.prompt != "-":
        if not args.prompt.strip():
            raise RunError("empty_prompt", "the prompt is empty", 2)
        return str(args.prompt)
    try:
        if sys.stdin.isatty():
            _err("reading the prompt from stdin (end it with Ctrl-D)")
        text = _read_stdin().decode("utf-8")
    except UnicodeDecodeError:
        raise RunError("prompt_not_utf8", "the prompt on stdin is not UTF-8 text", 2) from None
    except KeyboardInterrupt:  # Ctrl-C while it is typed: nothing is sent
        raise RunError("interrupted", "interrupted: no prompt was sent", 130) from None
    if not text.strip():
        raise RunError("empty_prompt", "the prompt on stdin is empty", 2)
    return text.rstrip("\n")  # the line end `echo` or a file's last line leaves


def _read_stdin() -> bytes:
    """All of stdin, in a way a signal always interrupts.

    A plain blocking `read` misses a SIGTERM or Ctrl-C that lands after Python's last check
    for signals and before the system call starts: its handler would run only once the read
    returns, so a run killed while the prompt is typed could wait for ever. Here the signal
    also writes to a pipe (`set_wakeup_fd`) that `select` watches with stdin: whenever it came,
    `select` returns, and the handler runs before the next read."""
    if os.name != "posix":  # select takes no pipes or consoles elsewhere: the plain read
        return sys.stdin.buffer.read()
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    previous = signal.set_wakeup_fd(wake)
    try:
        fd = sys.stdin.fileno()
        chunks: list[bytes] = []
        while True:
            ready, _, _ = select.select([fd, woken], [], [])
            if woken in ready:
                os.read(woken, 512)  # a signal's byte: its handler has run or runs now
            if fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
    finally:
        signal.set_wakeup_fd(previous)
        os.close(woken)
        os.close(wake)


async def run_turn(
    api: DaemonApi, args: argparse.Namespace, prompt: str, signals: _StopSignals
) -> int:
    session_id, made_here = await _session_for(api, args)
    # a session this run made is ended after its turn, unless asked to keep it for more
    ending = made_here and not (args.keep or args.continue_)
    ws: aiohttp.ClientWebSocketResponse | None = None
    accepted: dict[str, Any] = {}
    left_active: str | None = None  # why the session this run made could not be ended
    try:
        got = await api.call("GET", f"/sessions/{session_id}")
        _check_session(args, got)
        ws = await api.ws_connect(got["ws_url"])
        await ws.send_json({"type": "subscribe", "filter": "preset:chat", "snapshot": True})
        for _ in range(2):  # the ack, then the snapshot
            frame = await ws.receive_json(timeout=10)
            if frame.get("type") == "subscribe_error":
                raise ApiFailure(409, {"error": frame})
        body: dict[str, Any] = {"content": [{"type": "text", "text": prompt}]}
        if args.model:
            body["per_message_override"] = args.model
        accepted = await api.call("POST", f"/sessions/{session_id}/turns", body)
        reply = _Reply(show=not args.json)
        tools: list[dict[str, Any]] = []
        with signals.cancel_the_turn(ws, accepted["turn_id"], reply):
            outcome, answered_by = await _follow(api, ws, args, session_id, accepted, reply, tools)
        kept = "" if ending else " (kept)"
        ended_elsewhere = (
            outcome["status"] == "cancelled" and outcome.get("reason") == "user_cancel"
        )
        if kept and ended_elsewhere and not signals.cancel_sent:
            kept = await _kept_or_ended(api, ws, session_id)
    finally:
        if ws is not None:
            await ws.close()
        with contextlib.suppress(ApiFailure, aiohttp.ClientError):
            if made_here and not accepted:  # refused: an empty session is not worth keeping
                await api.call("DELETE", f"/sessions/{session_id}", params={"purge": "true"})
        if ending and accepted:
            try:
                await api.call("DELETE", f"/sessions/{session_id}")
            except (ApiFailure, aiohttp.ClientError, NotADaemon, TimeoutError) as exc:
                # ended or purged elsewhere meanwhile (409, 404), or not: the daemon stopping
                # (503) or gone, and the session stays active until someone ends it
                if not (isinstance(exc, ApiFailure) and exc.status in (404, 409)):
                    kept = " (left active)"
                    why = (
                        exc.said
                        if isinstance(exc, ApiFailure)
                        else "the daemon could not be reached"
                    )
                    left_active = (
                        f"session {session_id} was left active, not ended ({why}); "
                        f"`metis sessions end {session_id}` ends it"
                    )
    truncated = outcome["status"] == "completed" and outcome.get("stop_reason") == "max_tokens"
    if args.json:
        print(
            json.dumps(
                {
                    "session_id": session_id,
                    "turn_id": accepted["turn_id"],
                    "status": outcome["status"],
                    "reason": outcome.get("reason"),
                    "message": outcome.get("message"),
                    "stop_reason": outcome.get("stop_reason"),
                    "truncated": truncated,
                    "model": answered_by or accepted.get("model"),
                    "text": reply.text,
                    "tool_calls": [
                        {
                            "name": _name(tool),
                            "summary": tooldisplay.summary(_name(tool), tool.get("input")),
                            "is_error": bool(tool.get("is_error")),
                            "not_run": bool(tool.get("not_run")),
                            "duration_ms": tool.get("duration_ms"),
                        }
                        for tool in tools
                        if not tool.get("dropped")
                    ],
                    "dropped_tool_calls": [_name(tool) for tool in tools if tool.get("dropped")],
                    # the turn's usage buckets as its end event has them (disjoint: the
                    # tokens read are the three input ones together)
                    **{name: outcome.get(name, 0) for name in (*INPUT_BUCKETS, "output_tokens")},
                    "cost_usd": outcome.get("total_cost_usd", "0"),
                },
                ensure_ascii=False,
            )
        )
    elif outcome["status"] == "interrupted":
        reply.end_line()
        _err(outcome["message"])
    else:
        reply.end_line()
        # worded as the chat clients word it (`--json` keeps the codes for scripts)
        ended = turn_outcome(f"turn.{outcome['status']}", outcome)
        _err(f"turn {ended} · session {session_id}{kept} · ${outcome.get('total_cost_usd')}")
    if left_active is not None:
        _err(left_active)
    if outcome["status"] != "completed":
        return 1
    return TRUNCATED_EXIT if truncated else 0


class _StopSignals:
    """What Ctrl-C (SIGINT), SIGTERM (`kill`, `timeout`) and SIGHUP (the terminal closed) do to
    a run.

    Before the turn runs, either ends the run: its main task is cancelled, so the session it
    made is ended or purged on the way out. While the turn runs, either asks the daemon to
    cancel the turn, which then ends `cancelled` and is reported as any turn (a kept session
    is left with no turn running); a second signal, or a SIGTERM's turn that has not ended
    within `TERM_GRACE_S`, leaves at once."""

    TERM_GRACE_S = 5.0

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self.received: signal.Signals | None = None  # the first signal
        self._cancel_turn: Callable[[signal.Signals], None] | None = None
        self._cancel_sent = False
        for stop in (signal.SIGINT, signal.SIGTERM, *hangup_unless_ignored()):
            self._loop.add_signal_handler(stop, self._on_signal, stop)

    def _on_signal(self, received: signal.Signals) -> None:
        self.received = self.received or received
        if self._cancel_turn is None or self._cancel_sent:
            self._leave()
            return
        self._cancel_sent = True
        self._cancel_turn(received)
        if received is not signal.SIGINT:  # no one to press Ctrl-C a second time
            self._loop.call_later(self.TERM_GRACE_S, self._leave)

    @property
    def cancel_sent(self) -> bool:
        """Whether this run asked for the turn's cancel (a signal during it)."""
        return self._cancel_sent

    def _leave(self) -> None:
        if self._task is not None:
            self._task.cancel()

    @contextlib.contextmanager
    def cancel_the_turn(
        self, ws: aiohttp.ClientWebSocketResponse, turn_id: str, reply: _Reply
    ) -> Iterator[None]:
        """While the turn runs, a signal sends its cancel (the frame's send kept referenced)."""
        sent: list[asyncio.Task[None]] = []

        def cancel(received: signal.Signals) -> None:
            cancel = {"type": "cancel", "turn_id": turn_id, "reason": "user_cancel"}
            sent.append(asyncio.ensure_future(ws.send_json(cancel)))
            # sent first: after a hangup the terminal may take no more output
            with contextlib.suppress(OSError):
                if received is signal.SIGTERM:
                    reply.note("terminated: cancelling the turn")
                elif received is signal.SIGHUP:
                    reply.note("hung up: cancelling the turn")
                else:
                    reply.note("cancelling the turn (Ctrl-C again leaves at once)")

        self._cancel_turn = cancel
        try:
            yield
        finally:
            self._cancel_turn = None

    def stopped(self) -> RunError:
        """Why the run ended early, once a signal cancelled it: 130 after Ctrl-C, 143 after
        SIGTERM (128 + the signal's number, as a shell reports it)."""
        if self.received is signal.SIGTERM:
            return RunError("terminated", "terminated", 128 + signal.SIGTERM)
        if self.received is signal.SIGHUP:
            return RunError("hung_up", "hung up", 128 + signal.SIGHUP)
        return RunError("interrupted", "interrupted", 128 + signal.SIGINT)


def _check_session(args: argparse.Namespace, session: dict[str, Any]) -> None:
    """Refuse a session that takes no turn, or that works in another directory than the
    `--workspace` given with it: its tools would read and write where the script does not
    expect them to."""
    session_id = session["id"]
    if session["ws_url"] is None:  # ended: it takes no more turns
        raise RunError(
            "session_already_ended",
            f"session {session_id} has ended and takes no more turns "
            f"(`metis sessions export {session_id}` has what it holds)",
            2,
        )
    if args.workspace is None:
        return
    asked = Path(args.workspace).expanduser().resolve()
    if asked != Path(session["workspace_path"]).resolve():
        raise RunError(
            "workspace_mismatch",
            f"session {session_id} works in {session['workspace_path']}, not in {asked} "
            "(--workspace); leave out one or the other",
            2,
        )


async def _follow(
    api: DaemonApi,
    ws: aiohttp.ClientWebSocketResponse,
    args: argparse.Namespace,
    session_id: str,
    accepted: dict[str, Any],
    reply: _Reply,
    tools: list[dict[str, Any]],
) -> tuple[dict[str, Any], str | None]:
    """Follow the accepted turn to its end: the reply into `reply`, the tool calls into
    `tools`, confirmations answered by flag. Returns how it ended and the model of its latest
    reply."""
    turn_id = accepted["turn_id"]
    answered_by: str | None = None
    cut_off = False  # the reply stopped at the output limit: its calls are answered, not run
    decision = "allow" if args.yes else "deny"
    denial = "metis run --deny-all" if args.deny_all else "metis run without --yes"
    while True:
        msg = await ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            # the daemon went away mid-turn: how the turn ended is for its next start to say
            interrupted = {
                "status": "interrupted",
                "reason": "stream_closed",
                "message": f"the daemon's stream closed before the turn ended (session "
                f"{session_id}; `metis sessions show {session_id}` tells how it ended)",
                **dict.fromkeys((*INPUT_BUCKETS, "output_tokens")),
                "total_cost_usd": None,
            }
            return interrupted, answered_by
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
            reply.next_message()
            answered_by = p.get("model") or answered_by
        elif kind == "text.delta":
            reply.add(p.get("text", ""))
        elif kind == "llm.call_failed" and p.get("will_retry"):
            reply.note(retry_note(p))
        elif kind == "llm.call_started" and p.get("failover_from"):
            reply.note(f"{p['failover_from']} failed; failing over to {p.get('model')}")
        elif kind == "tool.use_start":
            tools.append({"id": p["tool_use_id"], "name": p.get("tool_name")})
        elif kind == "tool.use_end":
            for call in tools:
                if call["id"] == p["tool_use_id"] and p.get("dropped"):
                    call["dropped"] = True
                    reply.note(f"tool {_name(call)} {DROPPED}")
                elif call["id"] == p["tool_use_id"]:
                    call["input"] = p.get("final_input")
                    summary = tooldisplay.summary(_name(call), call["input"])
                    if not args.json:
                        reply.note(f"tool {_name(call)} {summary}".rstrip())
        elif kind == "message.complete" and p.get("stop_reason") == "max_tokens":
            reply.note(f"reply {CUT_OFF}")
            cut_off = True
        elif kind == "tool.confirmation_requested":
            asked = p.get("command_summary") or p.get("input_summary")
            reply.note(f"{decision} {p.get('tool_name')}: {asked}")
            answer: dict[str, Any] = {"decision": decision}
            if decision == "deny":
                answer["reason"] = denial
            await api.answer_confirmation(session_id, turn_id, p["confirmation_request_id"], answer)
        elif kind in ("tool.completed", "tool.failed"):
            for call in tools:
                if call["id"] == p["tool_use_id"]:
                    call["is_error"] = kind == "tool.failed" or p.get("is_error")
                    call["duration_ms"] = p.get("duration_ms")
                    if cut_off and p.get("error_class") == "cancelled":
                        call["not_run"] = True
                        reply.note(f"tool {_name(call)} {UNRUN}")
        elif kind in TERMINAL_TYPES:
            return {"status": kind.removeprefix("turn."), **p}, answered_by


async def _kept_or_ended(
    api: DaemonApi, ws: aiohttp.ClientWebSocketResponse, session_id: str
) -> str:
    """How the session is said after a turn cancelled from elsewhere: still there (a Cancel
    elsewhere), or ended or purged, which cancels the turn first and closes this socket once
    the end is stored (waited for, `ENDED_WAIT_S` at most)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(ENDED_WAIT_S):
            while (await ws.receive()).type == aiohttp.WSMsgType.TEXT:
                pass
    try:
        got = await api.call("GET", f"/sessions/{session_id}")
    except ApiFailure as exc:
        return " (purged elsewhere)" if exc.status == 404 else " (kept)"
    except (aiohttp.ClientError, NotADaemon, TimeoutError):  # the daemon went away since
        return " (kept)"
    return " (kept)" if got["ended_at"] is None else " (ended elsewhere)"


def retry_wait(p: dict[str, Any]) -> str:
    """` in 8 s`: how long a retried call's `llm.call_failed` waits (`retry_in_s`), for the
    clients' notes, so that a wait of seconds (a provider's `retry-after`) is not silence."""
    wait = p.get("retry_in_s")
    return f" in {wait:g} s" if isinstance(wait, int | float) else ""


def retry_note(p: dict[str, Any]) -> str:
    """What a retried call's `llm.call_failed` says: the model, why and when it is retried."""
    return f"{p.get('model')}: {p.get('message') or p.get('error_class')}; retrying{retry_wait(p)}"


def _name(tool: dict[str, Any]) -> str:
    return str(tool.get("name") or "")


def _usage_error_as_json(message: str, words: Sequence[str]) -> None:
    """With `--json` among the words (before a `--`), a usage error is one JSON object on
    stdout as well, as any refused run: a script reads why before the usage on stderr."""
    options = words[: words.index("--")] if "--" in words else words
    if "--json" in options:
        failure = {"status": "refused", "reason": "usage_error", "message": message}
        print(json.dumps(failure, ensure_ascii=False), flush=True)


def _say_failure(args: argparse.Namespace, error: RunError) -> int:
    """Say why the run ended before its turn did: on stderr, and with `--json` as the one JSON
    object on stdout (`status`, `reason`, `message`, as a failed turn's), for a script to
    read; returns the exit status."""
    _err(str(error))
    if args.json:
        status = "refused" if error.exit_code == 2 else "error"
        failure = {"status": status, "reason": error.reason, "message": error.message}
        print(json.dumps(failure, ensure_ascii=False))
    return error.exit_code


async def _main(args: argparse.Namespace, prompt: str) -> int:
    signals = _StopSignals()
    try:
        target = target_from_args(args)
    except ConfigError as exc:
        raise RunError("config_error", f"configuration error:\n{exc.message}", 2) from None
    except AddressError as exc:
        raise RunError("invalid_address", str(exc), 2) from None
    try:
        async with DaemonApi(target.url, target.headers()) as api:
            return await run_turn(api, args, prompt, signals)
    except asyncio.CancelledError:
        if signals.received is None:
            raise
        raise signals.stopped() from None
    except NOT_A_URL:
        raise RunError("not_a_url", not_a_url(target.url), 2) from None
    except aiohttp.ClientConnectionError:
        raise RunError("daemon_unreachable", unreachable(target.url, target.home), 1) from None
    except (aiohttp.ClientError, NotADaemon, TimeoutError) as exc:
        raise RunError("daemon_failed", failure_text(exc, target.url), 1) from None
    except NotUtf8 as exc:
        raise RunError("not_utf8", str(exc), 2) from None
    except ApiFailure as exc:
        raise RunError.of(exc) from None


@contextlib.contextmanager
def _terminate_ends_the_read() -> Iterator[None]:
    """SIGTERM while the prompt is read ends the run as Ctrl-C does there (nothing was sent),
    with its own status, and with --json its one object, instead of a silent death."""

    def terminated(*_: object) -> None:
        raise RunError("terminated", "terminated: no prompt was sent", 128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_command(args: argparse.Namespace) -> int:
    try:
        # read before the event loop starts: its Ctrl-C handler would only cancel a task, and a
        # blocking read of a terminal leaves it no moment to
        with _terminate_ends_the_read():
            prompt = read_prompt(args)
        return asyncio.run(_main(args, prompt))
    except RunError as exc:
        return _say_failure(args, exc)
    except KeyboardInterrupt:  # Ctrl-C as the loop starts or ends
        return _say_failure(args, RunError("interrupted", "interrupted", 130))
    except BrokenPipeError:
        raise  # stdout's reader left: `metis.cli.main` ends quietly
    except OSError as exc:  # stdout cannot be written (a full disk, a terminal gone)
        _err(f"cannot write the output: {exc.strerror or exc}")
        return 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run one turn non-interactively and print the reply",
        description="Send PROMPT as one turn in a new session (ended after it unless --keep), "
        "or in an existing one (--session, --continue), stream the reply's text to "
        "stdout, and exit 0 if the turn completed; 3 if it completed with its reply cut off by "
        "the output limit (max_tokens); 1 if it failed or was cancelled, or the daemon "
        "cannot be reached or refuses the key; 2 if the daemon refused the request (say, an "
        "unknown --model, a prompt larger than it takes, a refused workspace, an ended "
        "session, one with a turn running or one working in another directory than "
        "--workspace; a session made for the refused turn is purged) or for a "
        "usage or configuration error; 130 for Ctrl-C while the prompt is read from stdin, or "
        "a second Ctrl-C during the turn (the first cancels it); 143 for SIGTERM, which "
        "cancels the turn as Ctrl-C does and leaves after 5 s at most; 129 for SIGHUP (the "
        "terminal closed), likewise. With --json, stdout holds one JSON object either way.",
    )
    parser.add_argument("prompt", help="the message to send; - reads it from stdin")
    parser.add_argument(
        "--workspace",
        metavar="DIR",
        help="workspace directory of a new session, or the one --continue looks in (default: "
        ".); with --session, if given, the session's own",
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
    parser.set_defaults(func=run_command, on_usage_error=_usage_error_as_json)
