"""A small REST client for integration tests: the calls tests repeat, over a real HTTP socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

TERMINAL = ("turn.completed", "turn.cancelled", "turn.failed")


class Api:
    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.http = session

    async def call(
        self, method: str, path: str, body: Any = None, **kwargs: Any
    ) -> tuple[int, Any]:
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

    async def wait_for_event(
        self, session_id: str, predicate: Any, timeout: float = 10.0
    ) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            for event in await self.events(session_id):
                if predicate(event):
                    return event
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("event not seen")
            await asyncio.sleep(0.02)

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
