"""Shared fixtures: a temp METIS_HOME, settings, and the real daemon on a loopback port."""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web_app

from metis.config import Settings, load_settings
from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer
from tests.api import Api, api_session
from tests.bytecode_warmup import warm_up

STRICT = {"events": {"strict": True}}


@pytest.fixture
def metis_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "metis-home"
    monkeypatch.setenv("METIS_HOME", str(home))
    for var in (
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "METIS_API_KEY",
        "METIS_OFFLINE",
        "METIS_HOST",
        "METIS_PORT",
    ):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
def make_settings(metis_home: Path) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        merged: dict[str, Any] = {**STRICT, **overrides}
        return load_settings(home=metis_home, port=0, overrides=merged)

    return make


@pytest.fixture
async def daemon(make_settings: Callable[..., Settings]) -> AsyncIterator[Daemon]:
    d = Daemon(make_settings())
    await d.start()
    try:
        yield d
    finally:
        await d.stop()


@pytest.fixture
async def http(daemon: Daemon) -> AsyncIterator[aiohttp.ClientSession]:
    async with api_session(daemon) as session:
        yield session


@pytest.fixture
async def fake() -> AsyncIterator[FakeProviderServer]:
    """The fake provider server, accepting only the keys the end-to-end models.yaml gives its
    providers (tests/e2e/test_provider_turns.py `models_yaml`), so a request sent with any
    other key fails as it would at the real provider. Folders that script it differently
    override it."""
    async with FakeProviderServer(
        expected_keys={"anthropic": "ak-test", "openai": "ok-test"}
    ) as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "README.md").write_text("# demo\n")
    return ws


@pytest.fixture
def brief_mcp_exit_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """An MCP server that an in-process daemon stops is sent SIGTERM 0.1 s after its stdin
    closes, not 2 s after: for tests whose servers never read their stdin (so never exit by
    themselves) and that prove they end, not how long they were given (~2 s of waiting a stop)."""
    from metis.core.tools.mcp import transport

    monkeypatch.setattr(transport, "EXIT_GRACE_SECONDS", 0.1)


@pytest.fixture
async def api_of() -> AsyncIterator[Callable[[Daemon], Api]]:
    """Factory: an Api on a daemon's base URL (its HTTP session closed at teardown)."""
    opened: list[aiohttp.ClientSession] = []

    def make(d: Daemon) -> Api:
        http = api_session(d)
        opened.append(http)
        return Api(http)

    yield make
    for http in opened:
        await http.close()


@pytest.fixture
async def start_daemon(
    metis_home: Path, make_settings: Callable[..., Settings]
) -> AsyncIterator[Callable[..., Any]]:
    """Factory: write config files into METIS_HOME, then start a real daemon (stopped at teardown)."""
    started: list[Daemon] = []

    async def start(
        *,
        config: str | None = None,
        models: str | None = None,
        routing: str | None = None,
        **overrides: Any,
    ) -> Daemon:
        metis_home.mkdir(parents=True, exist_ok=True)
        for name, text in (
            ("config.yaml", config),
            ("models.yaml", models),
            ("routing.yaml", routing),
        ):
            if text is not None:
                (metis_home / name).write_text(text)
        d = Daemon(make_settings(**overrides))
        await d.start()
        started.append(d)
        return d

    yield start
    for d in reversed(started):
        await d.stop()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the imported modules' objects once, as `metis serve` does after start-up.

    Otherwise a full collection over both SDKs' types can pause the test process for hundreds
    of ms on a slow host, in the middle of a test that measures a cancel's latency.
    """
    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)  # after the test's fixtures have stopped its daemons and apps
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Let what a test stopped go: two libraries' caches keep it alive long after, and every
    full collection of the garbage collector walked it again, as did pytest's five at the end
    of a worker's run.

    aiohttp caches each handler's middleware chain keyed by the applications it ran in
    (`web_app._cached_build_middleware`, an lru_cache of 1,024 entries), so a test process held
    on to some hundreds of stopped daemons' applications, routers and signals (343 of the
    tests, run in one process: ~290,000 objects left in the oldest generation, ~46,000 with the
    cache emptied after each test; the full collections 1.9 s of CPU, then 1.1 s). A daemon a
    fixture keeps for longer only builds its chains again.

    Textual caches `StylesCache.get_inner_outer` (an lru_cache of 1,024 entries on a method, so
    keyed by the instance too): it kept the styles caches of the last thousand widgets of
    finished apps, with every line they had rendered (the 76 terminal UI tests, run in one
    process: ~213,000 objects left in the oldest generation, ~65,000 with the cache emptied;
    the full collections 3.3 s of CPU, then 2.3 s). Found in sys.modules: never imported here.
    """
    for cached in (
        getattr(web_app, "_cached_build_middleware", None),
        _textual_inner_outer_cache(),
    ):
        if cached is not None and hasattr(cached, "cache_clear"):
            cached.cache_clear()


def _textual_inner_outer_cache() -> object:
    styles_cache = sys.modules.get("textual._styles_cache")
    if styles_cache is None:
        return None
    return getattr(getattr(styles_cache, "StylesCache", None), "get_inner_outer", None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `runs_long` first, the rest in their order.

    xdist hands each worker a run of tests in collection order, and the others take work from
    it as they run out. A single test of ~20 s under load (the OpenAPI contract pass, in
    `tests/server/`) came near the end of that order: it started late and the run waited on it
    alone. Started first, it runs beside everything else.
    """
    items.sort(key=lambda item: item.get_closest_marker("runs_long") is None)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: a run without xdist ignores it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` starts two workers per CPU.

    A good third of the suite's time is spent waiting, not computing: daemons and MCP servers
    in subprocesses starting and stopping, browsers, timeouts that must expire. With one worker
    per CPU the CPUs sat idle meanwhile (measured on the 2-core machine: 188 s with 2 workers,
    137 s with 3, no faster with 4, when the suite was smaller; with today's, two alternated
    runs each: 158.7 and 160.1 s with 3 workers, 147.8 and 149.3 s with 4).
    `PYTEST_XDIST_AUTO_NUM_WORKERS` still decides when set.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 2 * cpus


def pytest_configure(config: pytest.Config) -> None:
    """Python processes the tests start (`metis serve`, the command line, MCP servers, fake
    providers) reuse compiled bytecode.

    Where the environment turns writing bytecode off (`PYTHONDONTWRITEBYTECODE`), each of the
    suite's ~150 Python subprocesses compiled every metis module it imported again: ~0.2 s of
    CPU a start. Writing it is turned back on for this run (set before the xdist workers start,
    so they and everything they start inherit it): metis's own modules get theirs beside their
    sources (`__pycache__/`, ignored by git), the installed packages keep the bytecode pip wrote.
    A folder of its own for all of it (`PYTHONPYCACHEPREFIX`) was tried: Python then ignores
    the installed packages' bytecode, and in a fresh environment the workers and the first
    subprocesses each compiled aiohttp, pydantic, both SDKs, the MCP SDK and the rest at once,
    ~4.5 s of CPU each (CI's run 15-20 s longer than a local one).
    """
    _hear_ctrl_c()
    config.addinivalue_line(
        "markers", "runs_long: tests of many seconds that no worker can share; run first"
    )
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    distributed = bool(config.getoption("numprocesses", None))
    is_worker = hasattr(config, "workerinput")
    if distributed and not is_worker and config.getoption("assertmode") == "rewrite":
        warm_up(config, Path(__file__).parents[1])


def _hear_ctrl_c() -> None:
    """Let this process and what it starts hear SIGINT again where it was started ignoring it.

    A shell ignores SIGINT for what it runs in the background (`pytest … &`, `nohup`), and an
    ignored signal stays ignored across `exec`: every `metis` the tests start would then shrug
    off the Ctrl-C that the Ctrl-C tests send it, and those tests would fail for a reason that is
    not metis's. Run in each process (the xdist workers inherit the same ignore).
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
