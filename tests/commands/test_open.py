"""`metis open`: a real `metis` subprocess asks a real daemon for a one-time login URL, prints
it (`--print`) or hands it to the browser ($BROWSER), and a browser logs in with it once."""

from __future__ import annotations

import asyncio
import html
import re
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.commands import open_dashboard
from metis.server.runner import Daemon
from metis.testing.serving import free_port
from tests.api import browser_secret_of, key_headers
from tests.cli import metis


async def assert_logs_in_once(d: Daemon, url: str) -> None:
    async with aiohttp.ClientSession() as browser:
        async with browser.get(url, allow_redirects=False) as r:
            assert r.status == 303
            secret = browser_secret_of(r.headers["Location"])
        async with browser.get(d.base_url + "/sessions", headers=key_headers(secret)) as r:
            assert r.status == 200  # the browser session's secret authenticates
        async with browser.get(url, allow_redirects=False) as r:
            assert r.status == 401  # single use: no browser logs in with it again


async def test_print_prints_a_login_url_that_logs_a_browser_in_once(
    daemon: Daemon, metis_home: Path
) -> None:
    code, out, err = await metis("open", "--print", "--url", daemon.base_url)
    assert code == 0, err
    url = out.strip()
    assert url.startswith(f"{daemon.base_url}/login?token=") and "\n" not in url
    key = daemon.state.auth.api_key.value  # type: ignore[union-attr]
    assert key not in out and key not in err
    await assert_logs_in_once(daemon, url)
    # each call mints a new link
    code, again, _ = await metis("open", "--print", "--url", daemon.base_url)
    assert code == 0 and again.strip() != url


async def test_open_hands_the_browser_a_private_file_not_the_url(
    daemon: Daemon, metis_home: Path, tmp_path: Path
) -> None:
    # a browser's command line is readable by every local user (/proc/<pid>/cmdline): it gets
    # the path of an owner-only page that redirects to the one-time link
    seen = tmp_path / "browser-got"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\nprintf %s "$1" > {seen}\n')
    browser.chmod(browser.stat().st_mode | stat.S_IXUSR)
    env = {"BROWSER": f"{browser} %s", "DISPLAY": "", "WAYLAND_DISPLAY": ""}
    code, out, err = await metis("open", "--url", daemon.base_url, env=env)
    assert code == 0, err
    for _ in range(100):  # the browser runs in the background
        if seen.exists() and seen.read_text():
            break
        await asyncio.sleep(0.05)
    argument = seen.read_text()
    page = metis_home / "run" / open_dashboard.REDIRECT_FILE
    assert argument == page.as_uri() and "token" not in argument
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    assert stat.S_IMODE(page.parent.stat().st_mode) == 0o700
    [url] = re.findall(r'content="0;url=([^"]+)"', page.read_text())
    url = html.unescape(url)
    assert url.startswith(f"{daemon.base_url}/login?token=")
    assert url not in out  # opened, so not printed
    assert "Opened the dashboard" in out
    await assert_logs_in_once(daemon, url)


async def test_without_a_browser_the_url_is_printed(
    daemon: Daemon,
    metis_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(open_dashboard.webbrowser, "open", lambda *a, **k: False)
    from metis.cli import main

    code = await asyncio.to_thread(main, ["open", "--url", daemon.base_url])
    assert code == 0
    out = capsys.readouterr().out
    [url] = [line for line in out.splitlines() if line.startswith("http")]
    assert "No browser could be opened" in out
    await assert_logs_in_once(daemon, url)


async def test_no_daemon_or_a_wrong_key_exits_1_saying_why(
    daemon: Daemon, metis_home: Path
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    code, out, err = await metis("open", "--print", "--url", nobody)
    assert code == 1 and out == ""
    # in the words of every other client
    assert (
        err
        == f"metis: cannot reach the daemon at {nobody}; start it with `metis serve --detach` (or `metis serve` in another terminal)\n"
    )
    code, out, err = await metis(
        "open", "--print", "--url", daemon.base_url, env={"METIS_API_KEY": "x" * 40}
    )
    assert code == 1 and out == ""
    assert (
        err
        == f"metis: the daemon at {daemon.base_url} refused the key (METIS_API_KEY, else METIS_HOME/api_key)\n"
    )


def test_help_names_print(capsys: pytest.CaptureFixture[str]) -> None:
    from metis.cli import main

    with pytest.raises(SystemExit):
        main(["open", "--help"])
    text: Any = capsys.readouterr().out
    assert "--print" in text and "one-time" in text
