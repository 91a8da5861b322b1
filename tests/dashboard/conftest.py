"""Browser tests of the dashboard: a real daemon in a thread, a real Chromium via Playwright.

Chromium comes from the system (`apt-get install chromium`), never from `playwright install`.
Without it these tests skip, except under CI=true where a missing browser is a failure.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from metis.config import load_settings
from metis.server.runner import Daemon

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Slow enough to watch deltas arrive and to cancel mid-stream; one declared model has no key.
SLOW_MODELS = """
pricing_version: "test"
providers:
  local: {adapter: scripted, options: {chunk_chars: 6, delta_delay_ms: 20}}
  anthropic: {adapter: anthropic, api_key_env: METIS_TEST_KEY_NOBODY_SETS}
models:
  - id: local:scripted
  - id: anthropic:claude-haiku-4-5
    aliases: [haiku]
    capabilities: {max_context_tokens: 200000, max_output_tokens: 8192}
    pricing: {input_per_mtok: "1", output_per_mtok: "5"}
"""


def chromium_path() -> str | None:
    """Debian's headless shell build of Chromium first: the same engine without the desktop
    browser's machinery, it drives the dashboard tests for about two thirds of the CPU."""
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _need_browser() -> str:
    path = chromium_path()
    if path is None:
        message = (
            "no chromium on PATH: `apt-get install chromium-headless-shell` (or `chromium`) to "
            "run the dashboard tests"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[test]'")
    return path


class DaemonThread:
    """A daemon on its own event loop in a thread, so sync Playwright can drive the browser
    from the test thread. `restart()` stops it and starts a new one on the same port and home."""

    def __init__(self, home: Path, *, config: dict[str, Any] | None = None) -> None:
        self.home = home
        self.config = config or {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.daemon: Daemon | None = None
        self.port = 0

    def run(self, coro: Any, timeout: float = 60) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def start(self) -> None:
        settings = load_settings(home=self.home, port=self.port, overrides=self.config)
        self.daemon = Daemon(settings)
        self.run(self.daemon.start())
        self.port = self.daemon.state.port

    def stop(self) -> None:
        if self.daemon is not None:
            self.run(self.daemon.stop())
            self.daemon = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def login_url(self) -> str:
        assert self.daemon is not None
        return self.daemon.login_url()

    @property
    def key(self) -> str:
        assert self.daemon is not None and self.daemon.state.auth is not None
        return self.daemon.state.auth.api_key.value


@pytest.fixture(scope="session")
def browser_path() -> str:
    return _need_browser()


@pytest.fixture
def dash_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "metis-home"
    home.mkdir()
    monkeypatch.setenv("METIS_HOME", str(home))
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "METIS_API_KEY", "METIS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    (home / "models.yaml").write_text(SLOW_MODELS)
    return home


@pytest.fixture
def served(
    dash_home: Path, browser_path: str, request: pytest.FixtureRequest
) -> Iterator[DaemonThread]:
    marker = request.node.get_closest_marker("daemon_config")
    d = DaemonThread(dash_home, config=marker.args[0] if marker else None)
    d.start()
    try:
        yield d
    finally:
        d.close()


@pytest.fixture(scope="module")
def browser(browser_path: str) -> Iterator[Any]:
    """One Chromium for a module's run of browser tests: each test still gets a context of its
    own (its own storage, cookies and pages), and starting the browser was a second of every
    test. Not longer: Playwright's sync API holds the thread's event loop while it runs, which
    the asyncio tests of the next module need."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=browser_path, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@contextmanager
def logged_in_page(
    browser: Any,
    served: DaemonThread,
    width: int,
    height: int,
    *,
    platform: str | None = None,
) -> Iterator[Any]:
    """A logged-in page at the dashboard; console errors fail the test. `platform` makes the
    browser say it runs on another system (`navigator.platform`, "MacIntel" for a Mac)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    pg = context.new_page()
    if platform is not None:
        cdp = context.new_cdp_session(pg)
        agent = pg.evaluate("navigator.userAgent")
        cdp.send("Emulation.setUserAgentOverride", {"userAgent": agent, "platform": platform})
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on(
        "console",
        lambda msg: (
            errors.append(msg.text)
            if msg.type == "error"
            and "WebSocket" not in msg.text
            and "Failed to load" not in msg.text
            else None
        ),
    )
    pg.set_default_timeout(15_000)
    auth = served.daemon.state.auth if served.daemon else None
    pg.goto(served.login_url() if auth is not None and auth.required else served.url)
    pg.wait_for_selector("#app[data-ready]")
    pg.errors = errors
    try:
        yield pg
    finally:
        context.close()
    assert not errors, errors


@pytest.fixture
def page(browser: Any, served: DaemonThread) -> Iterator[Any]:
    """A logged-in page at the dashboard on a desktop screen (1280×800)."""
    with logged_in_page(browser, served, 1280, 800) as pg:
        yield pg


@pytest.fixture
def phone(browser: Any, served: DaemonThread) -> Iterator[Any]:
    """A logged-in page at the dashboard on a phone-sized screen (400×800)."""
    with logged_in_page(browser, served, 400, 800) as pg:
        yield pg


@pytest.fixture
def shot() -> Callable[[Any, str], None]:
    ARTIFACTS.mkdir(exist_ok=True)

    def take(pg: Any, name: str) -> None:
        pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=False)

    return take


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "daemon_config(overrides): settings overrides of the dashboard test daemon"
    )


def rest(
    served: DaemonThread, method: str, path: str, body: Any = None, *, timeout: float = 30
) -> tuple[int, Any]:
    """A REST call with the daemon's key, from the test thread (AAP paths too)."""
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(served.url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {served.key}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def events_of(served: DaemonThread, session_id: str, types: str) -> list[dict[str, Any]]:
    status, body = rest(
        served, "GET", f"/sessions/{session_id}/events?event_types={types}&limit=1000"
    )
    assert status == 200, body
    return list(body["events"])
