"""End to end against `metis serve` on a fresh METIS_HOME: the independent
client (plain HTTP + the spec-following SSE parser) drives every stream mode with the scripted
model; the generated key is read from its file, printed once, and never logged."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp

from metis.testing.serving import free_port, spawn_serve, wait_until_serving
from tests.aap.client import WEATHER, AapClient, check_stream, tool_result


async def test_metis_serve_speaks_aap_in_every_mode(metis_home: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "METIS_API_KEY"}
    proc = await spawn_serve(metis_home, port, output=asyncio.subprocess.PIPE, environ=env)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            await wait_until_serving(http, "/aap/meta")
            key = (metis_home / "api_key").read_text().strip()
            aap = AapClient(http, key)
            sid = await aap.create(client_tools=[WEATHER])
            for mode in ("none", "delta", "message"):
                reply = await aap.say(sid, f"hello in {mode}", mode)
                assert reply.status == 200 and reply.stop == "end_turn"
                if mode != "none":
                    check_stream(reply, mode)
                assert reply.text() == f'You said: "hello in {mode}"'
                asked = await aap.say(sid, "use tool", mode)
                [call] = asked.tool_calls()
                answered = await aap.turn(sid, [tool_result(call["toolCallId"], "ok")], mode)
                assert answered.stop == "end_turn"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = await proc.communicate()
    assert proc.returncode == 0
    # The key is announced by its file only: it never reaches the terminal or the log.
    assert key not in out.decode() and "api_key (mode 0600)" in out.decode()
    assert key not in err.decode() and "api_key" in err.decode()
