"""`metis open` when what answers at the daemon's address cannot give a login link: it says
what is there, never that no daemon runs (with the advice to start one, which a daemon
holding the home and its port would refuse)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from metis.cli import main
from metis.commands import open_dashboard
from tests.cli import metis


async def test_a_daemon_that_does_not_answer_is_said_to_be_silent_not_absent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(open_dashboard, "DAEMON_TIMEOUT_S", 0.3)  # not the 5 s of a person
    silent = await asyncio.start_server(lambda *_: None, "127.0.0.1", 0)  # accepts, never answers
    url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    try:
        code = await asyncio.to_thread(main, ["open", "--print", "--url", url])
    finally:
        silent.close()
    said = capsys.readouterr()
    assert (code, said.out) == (1, ""), said.err
    assert said.err == f"metis: the daemon at {url} did not answer within 0.3 s\n"


async def test_something_else_answering_at_the_address_is_said_to_be_no_daemon() -> None:
    app = web.Application()
    app.router.add_post("/login/tokens", lambda _: web.Response(text="<html>hello</html>"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        code, out, err = await metis("open", "--print", "--url", url)
    finally:
        await runner.cleanup()
    assert (code, out) == (1, ""), err
    assert err == f"metis: {url} does not answer as a metis daemon (HTTP 200, text/plain)\n"
