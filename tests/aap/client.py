"""An independent AAP test client: plain HTTP plus the spec-following SSE parser.

It knows the AAP documents, not metis's wire models: requests are dicts, replies are parsed
JSON or parsed event streams, and `check_stream` asserts the invariants every stream must hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from tests.aap.sse import SseEvent, SseParser

WEATHER = {
    "name": "get_weather",
    "description": "Get current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
    },
}
ALLOWED = {
    "delta": {
        "turn_start",
        "text_delta",
        "thinking_delta",
        "tool_call",
        "tool_result",
        "turn_stop",
    },
    "message": {"turn_start", "text", "thinking", "tool_call", "tool_result", "turn_stop"},
}


@dataclass
class Reply:
    status: int
    headers: CIMultiDictProxy[str]
    body: Any = None
    events: list[SseEvent] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)

    @property
    def is_stream(self) -> bool:
        return self.headers.get("Content-Type", "").startswith("text/event-stream")

    @property
    def names(self) -> list[str]:
        return [e.event for e in self.events]

    def data(self, name: str) -> list[dict[str, Any]]:
        return [e.json() for e in self.events if e.event == name]

    @property
    def stop(self) -> str:
        if self.is_stream:
            return self.data("turn_stop")[-1]["stopReason"]
        return self.body["stopReason"]

    @property
    def error(self) -> str:
        return self.body["error"]["code"]

    def tool_calls(self) -> list[dict[str, Any]]:
        """Announced calls: `tool_call` events, or the tool_use blocks of a `none` reply."""
        if self.is_stream:
            return self.data("tool_call")
        return [
            {"toolCallId": b["toolCallId"], "name": b["name"], "input": b["input"]}
            for m in self.body["messages"]
            if m["role"] == "assistant" and isinstance(m["content"], list)
            for b in m["content"]
            if b["type"] == "tool_use"
        ]

    def tool_results(self) -> list[dict[str, Any]]:
        """Server-side results: `tool_result` events, or the tool messages of a `none` reply."""
        if self.is_stream:
            return self.data("tool_result")
        return [
            {"toolCallId": m["toolCallId"], "content": m["content"]}
            for m in self.body["messages"]
            if m["role"] == "tool"
        ]

    def text(self) -> str:
        """All assistant text of the turn, however it was delivered."""
        if self.is_stream:
            return "".join(d["delta"] for d in self.data("text_delta")) + "".join(
                d["text"] for d in self.data("text")
            )
        out = []
        for m in self.body["messages"]:
            if m["role"] != "assistant":
                continue
            if isinstance(m["content"], str):
                out.append(m["content"])
            else:
                out.extend(b["text"] for b in m["content"] if b["type"] == "text")
        return "".join(out)


def check_stream(reply: Reply, mode: str, *, session_start: bool = False) -> None:
    """The stream invariants every stream test checks."""
    assert reply.status == 200 and reply.is_stream, (reply.status, reply.body)
    names = reply.names
    if session_start:
        assert names[0] == "session_start" and names.count("session_start") == 1
        names = names[1:]
    assert names[0] == "turn_start" and names.count("turn_start") == 1, names
    assert names[-1] == "turn_stop" and names.count("turn_stop") == 1, names
    assert set(names) <= ALLOWED[mode], set(names) - ALLOWED[mode]
    for event in reply.events:
        assert isinstance(event.json(), dict), event
    ids = [d["toolCallId"] for d in reply.data("tool_call")]
    assert len(ids) == len(set(ids)), ids


class AapClient:
    def __init__(
        self,
        http: aiohttp.ClientSession,
        key: str | None,
        base: str = "/aap",
        workspace: str | None = None,
    ) -> None:
        self.http = http
        self.key = key
        self.base = base
        self.workspace = workspace  # the `workspace` option `create` sends unless told otherwise

    @property
    def v1(self) -> AapClient:
        return AapClient(self.http, self.key, "/aap/v1", self.workspace)

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        auth: bool = True,
        raw: bytes | None = None,
    ) -> Reply:
        merged = {**(self.auth() if auth else {}), **(headers or {})}
        kwargs: dict[str, Any] = {"headers": merged}
        if raw is not None:
            kwargs["data"] = raw
        elif body is not None:
            kwargs["json"] = body
        async with self.http.request(method, self.base + path, **kwargs) as r:
            reply = Reply(r.status, r.headers)
            if reply.is_stream:
                parser = SseParser()
                async for chunk in r.content.iter_any():
                    parser.feed(chunk)
                reply.events, reply.comments = parser.events, parser.comments
            elif r.content_type == "application/json":
                reply.body = await r.json()
            else:
                reply.body = await r.read()
        return reply

    async def create(
        self,
        *,
        tools: list[dict[str, Any]] | None = None,
        client_tools: list[dict[str, Any]] | None = None,
        options: dict[str, Any] | None = None,
        messages: list[dict[str, Any]] | None = None,
        agent: str = "metis",
    ) -> str:
        body: dict[str, Any] = {"agent": {"name": agent}}
        if tools is not None:
            body["agent"]["tools"] = tools
        if options is None and self.workspace is not None:
            options = {"workspace": self.workspace}
        if options is not None:
            body["agent"]["options"] = options
        if client_tools is not None:
            body["tools"] = client_tools
        if messages is not None:
            body["messages"] = messages
        reply = await self.request("POST", "/sessions", body)
        assert reply.status == 201, reply.body
        return reply.body["sessionId"]

    async def turn(
        self, session_id: str, messages: list[dict[str, Any]], stream: str = "none", **extra: Any
    ) -> Reply:
        body = {"stream": stream, "messages": messages, **extra}
        path = f"/sessions/{session_id}/turns" if self.base == "/aap" else f"/session/{session_id}"
        reply = await self.request("POST", path, body)
        if stream != "none" and reply.status == 200:
            check_stream(reply, stream)
        return reply

    async def say(self, session_id: str, text: str, stream: str = "none", **extra: Any) -> Reply:
        return await self.turn(session_id, [{"role": "user", "content": text}], stream, **extra)

    async def history(self, session_id: str, kind: str = "full") -> list[dict[str, Any]]:
        reply = await self.request("GET", f"/sessions/{session_id}/history?type={kind}")
        assert reply.status == 200, reply.body
        return reply.body["history"][kind]


def tool_result(call_id: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "toolCallId": call_id, "content": content}


def permission(call_id: str, granted: bool, reason: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool_permission", "toolCallId": call_id, "granted": granted}
    if reason is not None:
        message["reason"] = reason
    return message
