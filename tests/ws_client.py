"""WebSocket test clients: the real aiohttp client (`Ws`) and a raw socket client that can stop
reading (`RawWs`), plus the checks several WebSocket tests share (the per-turn frame grammar, rebuilding
a message from its deltas)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import aiohttp

from metis.core.events.catalog import STREAMING as CATALOG_STREAMING
from metis.testing import FakeProviderServer
from tests.api import TERMINAL, Api

# A scripted model slow enough to join, cancel or drop a socket mid-stream.
SLOW_SCRIPTED = """
pricing_version: "test"
providers:
  local: {adapter: scripted, options: {chunk_chars: 2, delta_delay_ms: 15}}
models:
  - id: local:scripted
"""


def fake_models(server: FakeProviderServer) -> str:
    return f"""
pricing_version: "test"
providers:
  anthropic: {{adapter: anthropic, base_url: "{server.anthropic_base_url}", api_key: "ak-test"}}
models:
  - id: anthropic:claude-haiku-4-5
    capabilities: {{max_context_tokens: 200000, max_output_tokens: 8192, supports_thinking: true}}
    pricing: {{input_per_mtok: "1", output_per_mtok: "5"}}
"""


# The streaming event types in the catalog's order: message.start, the four deltas/markers, then
# message.complete (indexed by the frame folding below).
STREAMING = tuple(CATALOG_STREAMING)


class Closed(Exception):
    """The socket closed; `code` and the parsed JSON `reason`."""

    def __init__(self, code: int | None, reason: dict[str, Any] | None) -> None:
        super().__init__(f"closed {code} {reason}")
        self.code = code
        self.reason = reason


def parse_reason(raw: Any) -> dict[str, Any] | None:
    if not raw:
        return None
    data = raw.encode() if isinstance(raw, str) else raw
    assert len(data) <= 123, data
    return json.loads(data)


class Ws:
    """One aiohttp WebSocket client with frame helpers."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, session_id: str) -> None:
        self.ws = ws
        self.session_id = session_id
        self.frames: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, api: Api, session_id: str, **kw: Any) -> Ws:
        status, body = await api.call("GET", f"/sessions/{session_id}")
        assert status == 200 and body["ws_url"], body
        ws = await api.http.ws_connect(body["ws_url"], max_msg_size=0, **kw)
        return cls(ws, session_id)

    @classmethod
    async def subscribed(cls, api: Api, session_id: str, **subscribe: Any) -> tuple[Ws, dict]:
        client = await cls.open(api, session_id)
        ack = await client.subscribe(**subscribe)
        assert ack["type"] == "subscribe_ack", ack
        return client, ack

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(frame))

    async def subscribe(self, **fields: Any) -> dict[str, Any]:
        await self.send({"type": "subscribe", **fields})
        return await self.recv()

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        msg = await self.ws.receive(timeout=timeout)
        if msg.type == aiohttp.WSMsgType.TEXT:
            frame = json.loads(msg.data)
            self.frames.append(frame)
            return frame
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING):
            raise Closed(msg.data, parse_reason(msg.extra))
        if msg.type == aiohttp.WSMsgType.CLOSED:
            raise Closed(self.ws.close_code, None)
        raise AssertionError(f"unexpected message {msg.type} {msg.data!r}")

    async def take(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        async with asyncio.timeout(timeout):
            return [await self.recv() for _ in range(n)]

    async def until(self, predicate: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Frames up to and including the first one matching `predicate`."""
        out: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.recv()
                out.append(frame)
                if predicate(frame):
                    return out

    async def turn(self, turn_id: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Every live (not catch-up) event of this turn seen so far, read up to its end."""

        def mine(f: dict[str, Any]) -> bool:
            return f.get("type") == "event" and f["event"]["turn_id"] == turn_id

        if not any(mine(f) and f["event"]["type"] in TERMINAL for f in self.frames):
            await self.until(lambda f: mine(f) and f["event"]["type"] in TERMINAL, timeout)
        return [f["event"] for f in self.frames if mine(f) and not f.get("catch_up")]

    async def closed(self, timeout: float = 10.0) -> Closed:
        """Read until the close; returns it (frames read on the way are kept in `frames`)."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await self.recv()
                except Closed as closed:
                    return closed

    async def expect_silence(self, seconds: float) -> None:
        try:
            frame = await self.recv(timeout=seconds)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected frame {frame}")

    async def close(self) -> None:
        await self.ws.close()


def is_event(kind: str) -> Callable[[dict[str, Any]], bool]:
    """A `Ws.until` predicate: an event frame of type `kind`."""
    return lambda f: f.get("type") == "event" and f["event"]["type"] == kind


def events_of(frames: list[dict[str, Any]], *, catch_up: bool = False) -> list[dict[str, Any]]:
    return [
        f["event"]
        for f in frames
        if f.get("type") == "event" and (catch_up or not f.get("catch_up"))
    ]


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def rebuild(events: list[dict[str, Any]], message_id: str) -> list[dict[str, Any]]:
    """A message's content rebuilt from its deltas the way a client renders it."""
    blocks: dict[int, dict[str, Any]] = {}
    for e in events:
        p = e["payload"]
        if p.get("message_id") != message_id or "content_block_index" not in p:
            continue
        i = p["content_block_index"]
        if e["type"] == "text.delta":
            blocks.setdefault(i, {"type": "text", "text": ""})["text"] += p["text"]
        elif e["type"] == "thinking.delta":
            block = blocks.setdefault(i, {"type": "thinking", "thinking": "", "signature": None})
            block["thinking"] += p["text"]
            block["signature"] = p["signature"] or block["signature"]
        elif e["type"] == "tool.use_start":
            blocks[i] = {"type": "tool_use", "id": p["tool_use_id"], "name": p["tool_name"]}
            blocks[i]["partial"] = ""
        elif e["type"] == "tool.use_input_delta":
            blocks[i]["partial"] += p["partial_json"]
        elif e["type"] == "tool.use_end":
            blocks[i]["input"] = p["final_input"]
            assert json.loads(blocks[i].pop("partial") or "{}") == p["final_input"]
    return [blocks[i] for i in sorted(blocks)]


def comparable(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """final_content blocks reduced to what deltas carry."""
    out = []
    for b in content:
        if b["type"] == "text":
            out.append({"type": "text", "text": b["text"]})
        elif b["type"] == "thinking":
            out.append({"type": "thinking", "thinking": b["thinking"], "signature": b["signature"]})
        elif b["type"] == "tool_use":
            out.append({"type": "tool_use", "id": b["id"], "name": b["name"], "input": b["input"]})
    return out


def check_turn_grammar(events: list[dict[str, Any]]) -> None:
    """The per-turn frame grammar and invariants for one turn's events."""
    types = types_of(events)
    assert types[:2] == ["turn.started", "route.decided"], types
    assert types[-1] in TERMINAL and sum(t in TERMINAL for t in types) == 1, types
    call_open = False
    message_open: str | None = None
    open_tools: set[str] = set()
    tools_allowed = closing = False
    started_message = None
    for e in events[2:-1]:
        t, p = e["type"], e["payload"]
        if t == "llm.call_started":
            assert not call_open and message_open is None, types
            call_open, tools_allowed, started_message = True, False, p["message_id"]
        elif t == "message.start":
            assert call_open and message_open is None, types
            message_open = p["message_id"]
            assert message_open == started_message
        elif t in STREAMING[1:6]:
            assert message_open == p["message_id"], (t, types)
            if t == "tool.use_start":
                open_tools.add(p["tool_use_id"])
            elif t == "tool.use_end":
                open_tools.remove(p["tool_use_id"])
            elif t == "tool.use_input_delta":
                assert p["tool_use_id"] in open_tools
        elif t == "message.complete":
            assert message_open == p["message_id"] and not open_tools, types
            message_open = None
        elif t in ("llm.call_completed", "llm.call_failed"):
            assert call_open and message_open is None, types
            call_open = False
            tools_allowed = t == "llm.call_completed" and p["stop_reason"] == "tool_use"
            # a reply ending otherwise closes its tool uses unrun (docs/decisions.md)
            closing = t == "llm.call_completed" and not tools_allowed
        elif t == "tool.failed" and closing and p.get("error_class") == "cancelled":
            assert not call_open, (t, types)
        elif t.startswith("tool."):
            assert tools_allowed and not call_open, (t, types)
    assert not call_open and message_open is None, types


# -- a raw client that can stop reading ---------------------------------------------------------


class RawWs:
    """A minimal RFC 6455 client over a socket with a tiny receive buffer, so that when the test
    stops reading, the server's writes back up quickly (a "stalled" client)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    @classmethod
    async def connect(cls, host: str, port: int, path: str, rcvbuf: int = 4096) -> RawWs:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, port))
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        await loop.sock_sendall(sock, request.encode())
        client = cls(sock)
        while b"\r\n\r\n" not in client.buffer:
            client.buffer += await loop.sock_recv(sock, 4096)
        head, client.buffer = client.buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        return client

    async def send_text(self, text: str) -> None:
        payload = text.encode()
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        assert len(payload) < 126
        frame = bytes([0x81, 0x80 | len(payload)]) + mask + masked
        await asyncio.get_running_loop().sock_sendall(self.sock, frame)

    async def _need(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        while len(self.buffer) < n:
            chunk = await loop.sock_recv(self.sock, 65536)
            if not chunk:
                raise ConnectionError("eof")
            self.buffer += chunk

    async def frame(self) -> tuple[int, bytes]:
        await self._need(2)
        opcode, length = self.buffer[0] & 0x0F, self.buffer[1] & 0x7F
        offset = 2
        if length == 126:
            await self._need(4)
            length, offset = struct.unpack(">H", self.buffer[2:4])[0], 4
        elif length == 127:
            await self._need(10)
            length, offset = struct.unpack(">Q", self.buffer[2:10])[0], 10
        await self._need(offset + length)
        payload = self.buffer[offset : offset + length]
        self.buffer = self.buffer[offset + length :]
        return opcode, payload

    async def read_until_close(self) -> tuple[list[dict[str, Any]], int, dict[str, Any] | None]:
        """Every text frame up to the close frame, then the close code and reason."""
        frames: list[dict[str, Any]] = []
        while True:
            opcode, payload = await self.frame()
            if opcode == 0x1:
                frames.append(json.loads(payload))
            elif opcode == 0x8:
                code = struct.unpack(">H", payload[:2])[0]
                return frames, code, parse_reason(payload[2:])

    def close(self) -> None:
        self.sock.close()
