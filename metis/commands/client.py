"""A small REST client of the daemon shared by `metis chat`, `metis run` and `metis sessions`.

Every request carries the daemon's key (`daemon_client.DaemonTarget.headers`); the key is never
shown. A non-2xx answer raises `ApiFailure` with the error envelope's code (for scripts) and
its message (for people).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from metis.commands.daemon_client import refused_key, target_from_args, unreachable
from metis.core.errors import ConfigError
from metis.core.tools.textutil import visible_controls


class ApiFailure(Exception):
    """A non-2xx answer from the daemon, with its error envelope's code. `said` is what a
    person reads: the daemon's message without the code (`--json` and the events keep that),
    and for a refused key (401, from the daemon at `url`) the sentence every client uses."""

    def __init__(self, status: int, body: Any, url: str | None = None) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.status = status
        self.code = error.get("code", f"http_{status}")
        self.details = error.get("details") or {}
        message = error.get("message")
        super().__init__(f"{self.code}: {message or body}{_first_problem(self.details)}")
        if status == 401 and url:
            self.said = refused_key(url)
        elif message:
            self.said = f"{message}{_first_problem(self.details)}"
        else:
            self.said = str(self)


def _first_problem(details: Any) -> str:
    """`: title: a title is one line…` — what a validation error's first entry says, since
    its message alone ("request validation failed") does not say what to fix."""
    errors = details.get("errors") if isinstance(details, dict) else None
    if not errors or not isinstance(errors[0], dict):
        return ""
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc") or [] if p not in ("body", "query"))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f": {where + ': ' if where else ''}{first.get('msg', '')}{more}"


class NotADaemon(Exception):
    """An answer that is not JSON: something else listens at the address."""

    def __init__(self, url: str, status: int, content_type: str) -> None:
        super().__init__(
            f"{url} does not answer as a metis daemon (HTTP {status}, {content_type or 'no type'})"
        )


def _holds_surrogates(value: Any) -> bool:
    """Whether `value` (JSON-like) holds a string UTF-8 cannot encode."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False


class NotUtf8(Exception):
    """A request holding text that is not UTF-8: an argument or a path in another encoding,
    which Python keeps as lone surrogates and JSON cannot carry (the daemon would refuse the
    body as malformed). Said before anything is sent."""

    def __init__(self) -> None:
        super().__init__(
            "a value given is not UTF-8 text (an argument or a path in another encoding); "
            "metis sends and stores text as UTF-8"
        )


CALL_TIMEOUT_S = 60.0
"""A REST call that has not been answered in this long is abandoned: every call the commands
make is answered in milliseconds, so a daemon that is this late is stuck, and the command says
so instead of waiting for aiohttp's five minutes."""


class DaemonApi:
    """REST calls over one aiohttp session (use as `async with DaemonApi(url, headers)`). A call
    not answered within `call_timeout_s` (default `CALL_TIMEOUT_S`) raises `TimeoutError`."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        call_timeout_s: float | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = dict(headers or {})
        self.call_timeout_s = CALL_TIMEOUT_S if call_timeout_s is None else call_timeout_s
        self.http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> DaemonApi:
        self.http = aiohttp.ClientSession(headers=self.headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.http is not None:
            await self.http.close()

    async def call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        assert self.http is not None
        if _holds_surrogates(body) or _holds_surrogates(params):
            raise NotUtf8()
        timeout = aiohttp.ClientTimeout(total=self.call_timeout_s)
        async with self.http.request(
            method, self.url + path, json=body, params=params, timeout=timeout
        ) as r:
            try:
                data = await r.json(content_type=None)
            except ValueError:  # JSON or UTF-8 that does not decode
                raise NotADaemon(self.url, r.status, r.content_type) from None
            if r.status >= 300:
                raise ApiFailure(r.status, data, self.url)
            return data

    async def export(self, session_id: str, fmt: str) -> str:
        """The session as a document the daemon renders (`GET /sessions/{id}/export`): what
        `metis sessions export` and the app's `/export` write. No total timeout: a long session's
        document takes as long as it takes, while the daemon keeps sending."""
        assert self.http is not None
        timeout = aiohttp.ClientTimeout(total=None, sock_read=self.call_timeout_s)
        async with self.http.get(
            f"{self.url}/sessions/{session_id}/export", params={"format": fmt}, timeout=timeout
        ) as r:
            if r.status >= 300:
                try:
                    data = await r.json(content_type=None)
                except ValueError:
                    raise NotADaemon(self.url, r.status, r.content_type) from None
                raise ApiFailure(r.status, data, self.url)
            return await r.text(encoding="utf-8")

    async def restart_mcp_server(self, name: str) -> dict[str, Any]:
        """Ask the daemon to connect to an MCP server again now; the server as it is then."""
        result: dict[str, Any] = await self.call("POST", f"/mcp/{quote(name, safe='')}/restart")
        return result

    async def reload_mcp_servers(self) -> dict[str, Any]:
        """Ask the daemon to apply config.yaml's `mcp` section as it is now: every server then
        (`servers`) and what changed (`applied`)."""
        body: dict[str, Any] = await self.call("POST", "/mcp/reload")
        return body

    async def ws_connect(self, ws_url: str) -> aiohttp.ClientWebSocketResponse:
        assert self.http is not None
        return await self.http.ws_connect(ws_url, max_msg_size=0)

    async def all_messages(self, session_id: str) -> list[dict[str, Any]]:
        """Every stored message of a session, oldest first (paged back with `before`)."""
        out: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 200}
        while True:
            page = await self.call("GET", f"/sessions/{session_id}/messages", params=params)
            out[:0] = page["messages"]
            if not page.get("has_more_before") or not page["messages"]:
                return out
            params = {"limit": 200, "before": page["messages"][0]["id"]}

    async def all_events(self, session_id: str, event_types: str | None = None) -> list[Any]:
        """Every persisted event of a session (optionally of some types), oldest first."""
        out: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 1000}
        if event_types:
            params["event_types"] = event_types
        while True:
            page = await self.call("GET", f"/sessions/{session_id}/events", params=params)
            out.extend(page["events"])
            if page.get("next_cursor") is None:
                return out
            params["cursor"] = page["next_cursor"]

    async def answer_confirmation(
        self, session_id: str, turn_id: str, request_id: str, body: dict[str, Any]
    ) -> Any:
        """POST a decision (`{"decision", "scope"?, "reason"?}`) for a tool confirmation."""
        path = f"/sessions/{session_id}/turns/{turn_id}/confirmations/{request_id}"
        return await self.call("POST", path, body)

    async def sessions(self, most: int | None = None, **query: Any) -> list[dict[str, Any]]:
        """Sessions matching `query` (GET /sessions filters), newest first: every page, or
        the pages that hold the `most` newest."""
        out: list[dict[str, Any]] = []
        params = {k: v for k, v in query.items() if v is not None}
        while True:
            page = await self.call("GET", "/sessions", params=params)
            out.extend(page["sessions"])
            if page.get("next_cursor") is None or (most is not None and len(out) >= most):
                return out[:most]
            params["cursor"] = page["next_cursor"]

    async def last_used_session(self, workspace: str) -> str | None:
        """The active metis session of `workspace` used last (`--continue`): the one a turn
        changed last, not the newest created (which may be empty), if any."""
        found = await self.sessions(
            workspace_path=workspace, status="active", surface="metis", limit=200
        )
        latest = max(found, key=lambda s: (s["updated_at"], s["id"]), default=None)
        return str(latest["id"]) if latest else None


CALL_FAILURES = (ApiFailure, aiohttp.ClientError, TimeoutError)
"""What a `DaemonApi` call raises when it gets no answer to use: the daemon refused, could not
be reached, or did not answer in time (the chat app says each in a note and carries on)."""

NOT_A_URL = (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)
"""What aiohttp raises for a daemon URL it cannot use (`--url 127.0.0.1:8421`, no scheme)."""


def not_a_url(url: str) -> str:
    return f"{url!r} is not a daemon URL (http://HOST:PORT)"


async def with_daemon(
    args: argparse.Namespace,
    action: Callable[[DaemonApi], Awaitable[int]],
    json_fields: Mapping[str, Any] | None = None,
) -> int:
    """Run `action` against the daemon `args` name (`daemon_client.add_arguments`), so the
    one-shot commands fail alike: exit 2 for a bad config.yaml or daemon URL, 1 for an
    unreachable daemon, a refused call or a file that cannot be read or written, the reason on
    stderr. With `--json`, a failure is also one object on stdout, `{"error": code, "message":
    text}` after `json_fields`: a script that reads stdout always gets JSON."""

    def failed(status: int, reason: str, message: str, said: str | None = None) -> int:
        # what it quotes (the daemon's words, a path) is shown, never obeyed by a terminal
        print(f"metis: {visible_controls(said or message)}", file=sys.stderr)
        if getattr(args, "json", False):
            failure = {**(json_fields or {}), "error": reason, "message": message}
            print(json.dumps(failure, ensure_ascii=False))
        return status

    try:
        target = target_from_args(args)
    except ConfigError as exc:
        return failed(2, "configuration_error", exc.message, f"configuration error:\n{exc.message}")
    try:
        async with DaemonApi(target.url, target.headers()) as api:
            return await action(api)
    except NOT_A_URL:
        return failed(2, "invalid_url", not_a_url(target.url))
    except aiohttp.ClientConnectionError:
        return failed(1, "unreachable", unreachable(target.url, target.home))
    except aiohttp.ClientError as exc:
        return failed(1, "call_failed", f"the call to the daemon at {target.url} failed: {exc}")
    except ApiFailure as exc:
        return failed(1, exc.code, exc.said)
    except NotADaemon as exc:
        return failed(1, "not_a_daemon", str(exc))
    except NotUtf8 as exc:
        return failed(2, "not_utf8", str(exc))
    except TimeoutError as exc:  # an OSError too: before the clause for files
        return failed(1, "timeout", failure_text(exc, target.url))
    except BrokenPipeError:
        raise  # stdout's reader left: `metis.cli.main` ends quietly
    except OSError as exc:  # a file the command writes (`sessions export --output`)
        named = f"cannot write {exc.filename}: {exc.strerror}" if exc.filename else str(exc)
        return failed(1, "cannot_write", named)


def failure_text(exc: BaseException, url: str, within_s: float | None = None) -> str:
    """What a failed call to the daemon says; a timeout's own text is empty (`within_s`: the
    call's timeout, `CALL_TIMEOUT_S` unless the call was given another)."""
    if isinstance(exc, TimeoutError):
        return f"the daemon at {url} did not answer within {within_s or CALL_TIMEOUT_S:g} s"
    return str(exc) or type(exc).__name__


# A dropped stream is attached again after REATTACH_FIRST_S, then twice as long each time, at
# most REATTACH_MAX_S apart: a daemon restart takes seconds (both chat clients).
REATTACH_FIRST_S = 0.2
REATTACH_MAX_S = 5.0
# Error codes meaning the session is gone: nothing to retry.
SESSION_GONE_CODES = ("session_not_found", "session_already_ended")


def reason_code(reason: Any) -> str | None:
    """The `code` of a WebSocket JSON close reason, if it is one."""
    try:
        return str(json.loads(reason)["code"]) if reason else None
    except (ValueError, TypeError, KeyError):
        return None


# Why the daemon closed a session's stream, in words (its close codes are the API's)
_CLOSED_BECAUSE = {
    "server_shutdown": "the daemon stopped",
    "client_too_slow": "this client fell too far behind the stream",
    "heartbeat_timeout": "the daemon heard nothing from this client for too long",
    "internal_error": "the daemon's stream failed",
}


def closed_because(reason: str) -> str:
    """What a chat client says when the stream is closed under it (`reason`: the close frame's
    code; empty when the connection was simply lost, a daemon killed, say)."""
    if not reason:
        return "the connection to the daemon was lost"
    return _CLOSED_BECAUSE.get(reason, f"the daemon closed the stream ({reason})")


async def subscribe_answer(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    """The next frame of a subscribe exchange (its ack, then the snapshot). The daemon may close
    the socket instead (its queue overflowed during a long load, a shutdown): that is a failed
    attach, with the close reason's code, for the caller to retry."""
    msg = await ws.receive(timeout=10)
    if msg.type == aiohttp.WSMsgType.TEXT:
        frame: dict[str, Any] = json.loads(msg.data)
        return frame
    code = reason_code(msg.extra) or ""
    message = f"{closed_because(code)} while attaching"
    raise ApiFailure(409, {"error": {"code": code or "connection_lost", "message": message}})


# Why a turn was cancelled, in words (a cancel the user asked for, here or in another client,
# needs none)
_CANCELLED_BECAUSE = {
    "user_cancel": "cancelled",
    "client_disconnect": "cancelled: its client went away",
    "timeout": "cancelled: it ran past its time limit",
    "server_shutdown": "cancelled: the daemon stopped",
}


def turn_outcome(event_type: str, payload: Mapping[str, Any]) -> str:
    """How a turn ended, from its terminal event: `completed`, `cancelled` (with why, when
    the user did not ask for it) or `failed: message` (the message says it in words; its
    `reason` code is for scripts: `--json`, the events). What every client prints, live or from
    the stored events, as the dashboard does."""
    if event_type == "turn.cancelled":
        reason = str(payload.get("reason"))
        return _CANCELLED_BECAUSE.get(reason, f"cancelled ({reason})")
    if event_type == "turn.failed":
        return f"failed: {payload.get('message') or payload.get('reason')}"
    return "completed"
