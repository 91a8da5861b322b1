"""The one-shot commands' REST client: how a call that fails is said."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from metis.cli import build_parser
from metis.commands import client, daemon_client
from metis.commands.client import ApiFailure, DaemonApi, with_daemon


async def test_a_daemon_that_never_answers_is_said_to_be_late_not_left_blank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stuck = asyncio.Event()

    async def never(request: web.Request) -> web.Response:
        await stuck.wait()
        return web.Response()

    app = web.Application()
    app.router.add_get("/sessions", never)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    monkeypatch.setattr(client, "CALL_TIMEOUT_S", 0.3)
    monkeypatch.setenv("METIS_API_KEY", "k")
    parser = argparse.ArgumentParser()
    daemon_client.add_arguments(parser)
    args = parser.parse_args(["--url", url, "--home", str(tmp_path)])

    async def list_sessions(api: client.DaemonApi) -> int:
        await api.sessions()
        return 0

    try:
        code = await client.with_daemon(args, list_sessions)
    finally:
        stuck.set()
        await runner.cleanup()
    assert code == 1
    assert capsys.readouterr().err == f"metis: the daemon at {url} did not answer within 0.3 s\n"


def test_a_turns_outcome_says_why_it_was_cancelled_in_words_unless_the_user_asked() -> None:
    def cancelled(reason: str) -> str:
        return client.turn_outcome("turn.cancelled", {"reason": reason})

    assert cancelled("user_cancel") == "cancelled"
    assert cancelled("server_shutdown") == "cancelled: the daemon stopped"
    assert cancelled("client_disconnect") == "cancelled: its client went away"
    assert cancelled("timeout") == "cancelled: it ran past its time limit"
    assert cancelled("something_new") == "cancelled (something_new)"
    assert client.turn_outcome("turn.completed", {}) == "completed"
    failed = {"reason": "provider_error", "message": "503 from the provider"}
    # in words: the code is for scripts
    assert client.turn_outcome("turn.failed", failed) == "failed: 503 from the provider"
    assert client.turn_outcome("turn.failed", {"reason": "loop_limit"}) == "failed: loop_limit"


def test_a_closed_stream_is_said_in_words_whatever_its_close_code() -> None:
    assert client.closed_because("server_shutdown") == "the daemon stopped"
    assert client.closed_because("client_too_slow") == "this client fell too far behind the stream"
    assert client.closed_because("") == "the connection to the daemon was lost"
    assert client.closed_because("new_code") == "the daemon closed the stream (new_code)"


async def test_a_refusal_quoting_control_characters_is_printed_escaped(
    metis_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon's words may quote what it was sent (a path, a name): on stderr they are
    shown, never obeyed by the terminal."""
    args = build_parser("sessions").parse_args(["sessions", "list", "--url", "http://127.0.0.1:9"])

    async def refused(_: DaemonApi) -> int:
        raise ApiFailure(400, {"error": {"code": "bad", "message": "no dir '\x1b]0;x\x07'"}})

    assert await with_daemon(args, refused) == 1
    assert capsys.readouterr().err == "metis: no dir '\\x1b]0;x\\x07'\n"
