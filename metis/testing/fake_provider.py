"""A loopback fake of the Anthropic Messages and OpenAI Chat Completions APIs.

The real SDKs talk to it through `base_url`, so tests exercise the adapters' actual wire code:
SSE framing, tool-call fragments, usage chunks, error bodies, retry headers, dropped and hung
connections. Lives in the package (not under tests/) so the offline demo and the benchmarks
share it. Nothing random or clock-based appears in its bodies, so recordings are reproducible.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel

from metis.testing.fake_wire import (
    Api,
    Failure,
    FakeReply,
    FakeToolCall,
    FakeUsage,
    anthropic_error_body,
    anthropic_frames,
    anthropic_message,
    dumps,
    openai_completion,
    openai_error_body,
    openai_frames,
    resolve_content,
    sse_frame,
)

__all__ = [
    "FakeProviderServer",
    "FakeReply",
    "FakeToolCall",
    "FakeUsage",
    "RecordedRequest",
    "is_loopback_host",
    "main",
]

QueueName = Literal["anthropic", "openai", "any"]


class RecordedRequest(BaseModel):
    """Everything a test may want to assert about one provider request."""

    index: int
    api: Api
    path: str
    headers: dict[str, str]
    body: Any
    model: str | None
    stream: bool
    reply_source: Literal["queued", "default", "auth_failure"] | None = None
    status: int | None = None
    events_sent: int = 0
    client_disconnected: bool = False
    completed: bool = False


@dataclass
class _Queued:
    reply: FakeReply
    remaining: int


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class FakeProviderServer:
    """Serve both provider APIs on loopback with a reply queue per API plus `any`."""

    def __init__(self, expected_keys: dict[str, str] | None = None) -> None:
        self.expected_keys: dict[str, str] = dict(expected_keys or {})
        self.requests: list[RecordedRequest] = []
        self._queues: dict[str, list[_Queued]] = {"anthropic": [], "openai": [], "any": []}
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port = 0

    # lifecycle ------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if not is_loopback_host(host):
            raise ValueError(f"the fake provider only binds to loopback, not {host!r}")
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/_fake/enqueue", self._control_enqueue)
        app.router.add_get("/_fake/requests", self._control_requests)
        app.router.add_post("/_fake/reset", self._control_reset)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        self._stopping.clear()
        self._runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=0.5, access_log=None
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self._host = host
        self._port = sockets[0].getsockname()[1] if sockets else port

    async def stop(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeProviderServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # addresses ------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def anthropic_base_url(self) -> str:
        return self.base_url

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    # script ---------------------------------------------------------------------------------

    def enqueue(self, api: QueueName, *replies: FakeReply | dict[str, Any]) -> None:
        if api not in self._queues:
            raise ValueError(f"unknown api {api!r}")
        for reply in replies:
            parsed = reply if isinstance(reply, FakeReply) else FakeReply.model_validate(reply)
            self._queues[api].append(_Queued(parsed, parsed.repeat))

    def pending(self, api: QueueName) -> int:
        return len(self._queues[api])

    def _take(self, api: Api, model: str | None) -> FakeReply | None:
        for name in (api, "any"):
            queue = self._queues[name]
            for i, item in enumerate(queue):
                if item.reply.match_model is None or item.reply.match_model == model:
                    item.remaining -= 1
                    if item.remaining <= 0:
                        del queue[i]
                    return item.reply
        return None

    def reset(self) -> None:
        for queue in self._queues.values():
            queue.clear()
        self.requests.clear()
        self._notify()

    # recordings -----------------------------------------------------------------------------

    def requests_for(self, api: Api) -> list[RecordedRequest]:
        return [r for r in self.requests if r.api == api]

    def _notify(self) -> None:
        self._changed.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until `predicate()` holds, re-checking after every recorded change."""
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                if predicate():
                    return
                await self._changed.wait()

    async def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        await self.wait_until(lambda: len(self.requests) >= n, timeout)
        return self.requests[:n]

    # handlers -------------------------------------------------------------------------------

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        return await self._handle("anthropic", request)

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        return await self._handle("openai", request)

    def _authorized(self, api: Api, headers: dict[str, str]) -> bool:
        key = self.expected_keys.get(api)
        if key is None:
            return True
        bearer = headers.get("authorization") == f"Bearer {key}"
        if api == "anthropic":  # recent SDKs send the key as a bearer token instead of x-api-key
            return headers.get("x-api-key") == key or bearer
        return bearer

    def _error_response(self, api: Api, reply: FakeReply, status: int) -> web.Response:
        if api == "anthropic":
            body = anthropic_error_body(status, reply.error_type, reply.error_message)
        else:
            body = openai_error_body(
                status, reply.error_type, reply.error_code, reply.error_message
            )
        headers = dict(reply.headers)
        if reply.retry_after is not None:
            value = reply.retry_after
            headers["retry-after"] = str(int(value)) if value == int(value) else str(value)
            if api == "openai":
                headers["retry-after-ms"] = str(int(value * 1000))
        return web.json_response(body, status=status, headers=headers, reason=_reason(status))

    async def _handle(self, api: Api, request: web.Request) -> web.StreamResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = None
        model = body.get("model") if isinstance(body, dict) else None
        stream = bool(body.get("stream")) if isinstance(body, dict) else False
        record = RecordedRequest(
            index=len(self.requests),
            api=api,
            path=request.path,
            headers=headers,
            body=body,
            model=model if isinstance(model, str) else None,
            stream=stream,
        )
        self.requests.append(record)
        self._notify()
        try:
            return await self._respond(api, request, record, body)
        except asyncio.CancelledError:
            if not self._stopping.is_set():
                record.client_disconnected = True
            self._notify()
            raise
        except ConnectionError:
            record.client_disconnected = True
            self._notify()
            return web.Response(status=499)

    async def _respond(
        self, api: Api, request: web.Request, record: RecordedRequest, body: Any
    ) -> web.StreamResponse:
        if not self._authorized(api, record.headers):
            record.reply_source = "auth_failure"
            record.status = 401
            record.completed = True
            self._notify()
            return self._error_response(api, FakeReply(), 401)
        if not isinstance(body, dict):
            record.status = 400
            record.completed = True
            self._notify()
            return self._error_response(
                api, FakeReply(error_message="request body is not a JSON object"), 400
            )
        reply = self._take(api, record.model)
        record.reply_source = "queued" if reply is not None else "default"
        reply = reply or FakeReply()
        if reply.first_byte_delay_ms:
            await self._pause(reply.first_byte_delay_ms)
        if reply.status != 200:
            record.status = reply.status
            record.completed = True
            self._notify()
            return self._error_response(api, reply, reply.status)
        n = record.index
        model = record.model or "fake-model"
        if not record.stream:
            return await self._respond_json(api, request, record, body, reply, n, model)
        if reply.raw_sse is not None:
            frames = list(reply.raw_sse)
        else:
            content = resolve_content(api, body, reply)
            if api == "anthropic":
                frames = anthropic_frames(n, model, reply, content)
            else:
                options = body.get("stream_options") or {}
                include = bool(options.get("include_usage")) if isinstance(options, dict) else False
                frames = openai_frames(n, model, reply, content, include)
        return await self._stream(api, request, record, reply, frames)

    async def _respond_json(
        self,
        api: Api,
        request: web.Request,
        record: RecordedRequest,
        body: dict[str, Any],
        reply: FakeReply,
        n: int,
        model: str,
    ) -> web.StreamResponse:
        failure = reply.failure or ("drop" if reply.fail_after_events is not None else None)
        record.status = 200
        if failure == "hang":
            await self._stopping.wait()
            return web.Response(status=200)
        if failure == "drop":
            self._drop(request)
            return web.Response(status=200)
        if failure == "malformed":
            record.completed = True
            self._notify()
            return web.Response(status=200, text="{not json", content_type="application/json")
        if failure == "error_event":
            record.status = 500
            record.completed = True
            self._notify()
            return self._error_response(api, reply, 500)
        if reply.raw_json is not None:
            payload: dict[str, Any] = reply.raw_json
        else:
            content = resolve_content(api, body, reply)
            payload = (
                anthropic_message(n, model, reply, content)
                if api == "anthropic"
                else openai_completion(n, model, reply, content)
            )
        record.completed = True
        self._notify()
        return web.json_response(payload, headers=reply.headers, dumps=dumps)

    async def _stream(
        self,
        api: Api,
        request: web.Request,
        record: RecordedRequest,
        reply: FakeReply,
        frames: Sequence[str],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **reply.headers,
            },
        )
        record.status = 200
        await response.prepare(request)
        failure = reply.failure or ("drop" if reply.fail_after_events is not None else None)
        fail_at = reply.fail_after_events if failure is not None else None
        if reply.single_write and failure is None:
            await response.write("".join(frames).encode())
            record.events_sent += len(frames)
            await response.write_eof()
            record.completed = True
            self._notify()
            return response
        for i, frame in enumerate(frames):
            if fail_at is not None and i >= fail_at:
                break
            if reply.delay_ms:
                await self._pause(reply.delay_ms)
            await response.write(frame.encode())
            record.events_sent += 1
            self._notify()
        else:
            if fail_at is None or fail_at > len(frames):
                await response.write_eof()
                record.completed = True
                self._notify()
                return response
        self._notify()
        await self._fail(api, request, response, record, reply, failure)
        return response

    async def _fail(
        self,
        api: Api,
        request: web.Request,
        response: web.StreamResponse,
        record: RecordedRequest,
        reply: FakeReply,
        failure: Failure | None,
    ) -> None:
        if failure == "hang":
            await self._stopping.wait()
            return
        if failure == "malformed":
            bad = (
                "event: content_block_delta\ndata: {not json\n\n"
                if api == "anthropic"
                else ("data: {not json\n\n")
            )
            await response.write(bad.encode())
            record.events_sent += 1
            await asyncio.sleep(0.01)
            self._drop(request)
            return
        if failure == "error_event":
            if api == "anthropic":
                etype = reply.error_type or "overloaded_error"
                frame = sse_frame(
                    "error",
                    {
                        "type": "error",
                        "error": {
                            "type": etype,
                            "message": reply.error_message or "fake stream error",
                        },
                    },
                )
            else:
                error = openai_error_body(
                    500, reply.error_type, reply.error_code, reply.error_message
                )
                frame = f"data: {dumps(error)}\n\n"
            await response.write(frame.encode())
            record.events_sent += 1
            await response.write_eof()
            record.completed = True
            self._notify()
            return
        self._drop(request)

    @staticmethod
    def _drop(request: web.Request) -> None:
        transport = request.transport
        if transport is not None:
            transport.abort() if hasattr(transport, "abort") else transport.close()

    async def _pause(self, ms: float) -> None:
        await asyncio.sleep(ms / 1000.0)

    # control routes -------------------------------------------------------------------------

    async def _control_enqueue(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            api = data.get("api", "any")
            replies = [FakeReply.model_validate(r) for r in data.get("replies", [])]
            self.enqueue(api, *replies)
        except (ValueError, AttributeError, TypeError) as exc:
            return web.json_response({"error": str(exc)[:500]}, status=400)
        return web.json_response({"queued": len(replies), "api": api})

    async def _control_requests(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": [r.model_dump(mode="json") for r in self.requests]})

    async def _control_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"reset": True})

    async def _not_found(self, request: web.Request) -> web.Response:
        message = f"no route for {request.method} {request.path}"
        anthropic_like = "x-api-key" in request.headers or "anthropic-version" in request.headers
        if anthropic_like:
            body = anthropic_error_body(404, "not_found_error", message)
        else:
            body = openai_error_body(404, "invalid_request_error", "unknown_url", message)
        return web.json_response(body, status=404)


def _reason(status: int) -> str | None:
    return {529: "Overloaded", 499: "Client Closed Request"}.get(status)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def load_script(server: FakeProviderServer, path: Path) -> None:
    """A JSON list of replies (queue `any`) or an object `{anthropic|openai|any: [...]}`."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, list):
        server.enqueue("any", *data)
        return
    if not isinstance(data, dict):
        raise ValueError("a script is a list of replies or an object of lists")
    if isinstance(data.get("expected_keys"), dict):
        server.expected_keys.update(data["expected_keys"])
    for api in ("anthropic", "openai", "any"):
        server.enqueue(api, *data.get(api, []))


async def _serve(host: str, port: int, script: Path | None) -> None:
    server = FakeProviderServer()
    if script is not None:
        load_script(server, script)
    await server.start(host=host, port=port)
    print(f"ANTHROPIC_BASE_URL={server.anthropic_base_url}", flush=True)
    print(f"OPENAI_BASE_URL={server.openai_base_url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m metis.testing.fake_provider",
        description="Fake Anthropic + OpenAI API server on loopback (for tests and the offline demo).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", type=Path, default=None, help="JSON file of replies to queue")
    args = parser.parse_args(argv)
    if not is_loopback_host(args.host):
        print(f"error: refusing to bind to non-loopback host {args.host!r}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.host, args.port, args.script))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
