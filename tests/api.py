"""A small REST client for integration tests: the calls tests repeat, over a real HTTP socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from metis.server.runner import Daemon

TERMINAL = ("turn.completed", "turn.cancelled", "turn.failed")


def key_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def auth_headers(daemon: Daemon) -> dict[str, str]:
    """The header every metis REST client sends: the daemon's key (metis/server/auth.py)."""
    assert daemon.state.auth is not None
    return key_headers(daemon.state.auth.api_key.value)


def home_headers(metis_home: Path) -> dict[str, str]:
    """The key of a `metis serve` subprocess: it wrote METIS_HOME/api_key at its first start."""
    return key_headers((metis_home / "api_key").read_text().strip())


def api_session(daemon: Daemon, **kwargs: Any) -> aiohttp.ClientSession:
    """An HTTP client of a daemon that sends its key with every request."""
    return aiohttp.ClientSession(base_url=daemon.base_url, headers=auth_headers(daemon), **kwargs)


class Api:
    def __init__(
        self, session: aiohttp.ClientSession, headers: dict[str, str] | None = None
    ) -> None:
        self.http = session
        self.headers = headers or {}  # sent with every call (on top of the session's own)

    async def call(
        self, method: str, path: str, body: Any = None, **kwargs: Any
    ) -> tuple[int, Any]:
        if self.headers:
            kwargs["headers"] = {**self.headers, **kwargs.get("headers", {})}
        async with self.http.request(method, path, json=body, **kwargs) as r:
            data = await r.json() if r.content_type == "application/json" else await r.text()
            return r.status, data

    async def create_session(self, workspace: Path | str, **fields: Any) -> dict[str, Any]:
        status, body = await self.call(
            "POST", "/sessions", {"workspace_path": str(workspace), **fields}
        )
        assert status == 201, body
        return body

    async def submit(self, session_id: str, text: str, **fields: Any) -> tuple[int, Any]:
        return await self.call(
            "POST",
            f"/sessions/{session_id}/turns",
            {"content": [{"type": "text", "text": text}], **fields},
        )

    async def answer(
        self, session_id: str, turn_id: str, request_id: str, decision: str = "allow", **fields: Any
    ) -> tuple[int, Any]:
        """Decide a tool confirmation (POST .../confirmations/{id}); `fields`: scope, reason."""
        return await self.call(
            "POST",
            f"/sessions/{session_id}/turns/{turn_id}/confirmations/{request_id}",
            {"decision": decision, **fields},
        )

    async def decisions(self, session_id: str) -> list[tuple[str, str, str | None]]:
        """(decision, scope, reason) of each tool confirmation the session resolved, in order."""
        events = await self.events(session_id, event_types="tool.confirmation_resolved")
        return [
            (e["payload"]["decision"], e["payload"]["scope"], e["payload"]["reason"])
            for e in events
        ]

    async def events(self, session_id: str, **query: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        cursor = None
        while True:
            params = {**query, "limit": 1000, **({"cursor": cursor} if cursor else {})}
            status, body = await self.call("GET", f"/sessions/{session_id}/events", params=params)
            assert status == 200, body
            out.extend(body["events"])
            cursor = body["next_cursor"]
            if cursor is None:
                return out

    async def wait_for_events(
        self, session_id: str, predicate: Any, count: int, timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """The first `count` events matching `predicate`, in seq order; each poll reads only the
        events after the last one seen (`since`), so waiting costs the same however long the
        session is."""
        deadline = asyncio.get_running_loop().time() + timeout
        found: list[dict[str, Any]] = []
        since: dict[str, str] = {}
        while True:
            page = await self.events(session_id, **since)
            found.extend(e for e in page if predicate(e))
            if len(found) >= count:
                return found[:count]
            if page:
                since = {"since": page[-1]["id"]}
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{count} events not seen: {len(found)}")
            await asyncio.sleep(0.02)

    async def wait_for_event(
        self, session_id: str, predicate: Any, timeout: float = 10.0
    ) -> dict[str, Any]:
        return (await self.wait_for_events(session_id, predicate, 1, timeout))[0]

    async def wait_turn(
        self, session_id: str, turn_id: str, timeout: float = 10.0
    ) -> dict[str, Any]:
        return await self.wait_for_event(
            session_id, lambda e: e["turn_id"] == turn_id and e["type"] in TERMINAL, timeout
        )

    async def turn_events(self, session_id: str, turn_id: str) -> list[dict[str, Any]]:
        return [e for e in await self.events(session_id) if e["turn_id"] == turn_id]

    async def run_turn(
        self, session_id: str, text: str, **fields: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        status, accepted = await self.submit(session_id, text, **fields)
        assert status == 202, accepted
        return accepted, await self.wait_turn(session_id, accepted["turn_id"])

    async def messages(self, session_id: str, **query: Any) -> dict[str, Any]:
        status, body = await self.call("GET", f"/sessions/{session_id}/messages", params=query)
        assert status == 200, body
        return body


def browser_secret_of(location: str) -> str:
    """The browser-session secret of `GET /login`'s redirect, `Location: /#login=<secret>`."""
    assert location.startswith("/#login="), location
    secret = location.removeprefix("/#login=")
    assert len(secret) >= 32, location
    return secret
