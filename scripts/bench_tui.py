#!/usr/bin/env python3
"""`metis chat` (the Textual app) under a fast reply: does the transcript get all of it, and
does typing stay responsive while it streams? (issue goals: the whole reply in the transcript;
key-to-screen latency under 50 ms while a 5,000-delta reply streams).

Setup: the fake provider in its own process, `metis serve` in another (real REST, WebSocket,
SQLite and the real Anthropic adapter), and the app in this process, headless
(`App.run_test`), as a user runs `metis chat` against a running daemon. A turn's reply is
5,000 text deltas of Markdown (paragraphs, lists, code blocks), sent in one socket write by the
provider (`--mode burst`: everything arrives at once) or one delta every `--delay-ms`
(`--mode paced`).

While the reply streams, a thread plays the terminal: every `--key-interval-ms` it hands the
app a key press the way Textual's terminal drivers do (`Driver.send_message` from the input
thread). Per key:
- value: from the press until the prompt's text holds the character;
- screen: from the press until the first screen update after that (the headless app skips the
  terminal write; the benchmark renders each update's segments itself, so their cost is in).

Usage: .venv/bin/python scripts/bench_tui.py [--deltas 5000] [--chunk 8] [--turns 3]
       [--mode burst|paced|both] [--delay-ms 0.5] [--key-interval-ms 20] [--in-process]
       (--in-process: the daemon in this process and loop, the worst case for the app)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from textual import events

from metis.commands.daemon_client import resolve_daemon
from metis.commands.tui.app import ChatApp
from metis.commands.tui.widgets import AssistantMessage, PromptInput
from metis.testing.bench import bench_models_yaml, spawn_fake_provider, stop_process
from metis.testing.fake_wire import FakeReply, FakeUsage
from metis.testing.serving import free_port, spawn_serve, wait_until_serving

GOAL_MS = 50.0
SIZE = (120, 40)


def markdown_reply(chars: int) -> str:
    """Markdown of exactly `chars` characters: headings, paragraphs, lists and code blocks."""
    parts: list[str] = []
    n = 0
    while sum(map(len, parts)) < chars:
        n += 1
        parts.append(
            f"## Part {n}\n\n"
            f"The function `step_{n}` reads the **input** and writes the *output*; it keeps "
            f"the state between calls and returns early when nothing changed.\n\n"
            f"- first, check the arguments of call {n}\n"
            f"- then, update the cache\n"
            f"- finally, report the result\n\n"
            f"```python\ndef step_{n}(value: int) -> int:\n    return value * {n} + 1\n```\n\n"
        )
    return "".join(parts)[:chars]


# -- the daemon and the provider ----------------------------------------------------------------


@dataclass
class Backend:
    url: str
    home: Path
    headers: dict[str, str]
    fake_url: str
    stop: Callable[[], Any]


async def start_backend(in_process: bool) -> Backend:
    fake, fake_url = await spawn_fake_provider()
    home = Path(tempfile.mkdtemp(prefix="metis-bench-tui-"))
    (home / "models.yaml").write_text(bench_models_yaml(fake_url))
    if in_process:
        from metis.config import load_settings
        from metis.server.runner import Daemon

        d = Daemon(load_settings(home=home, port=0, overrides={"log_level": "WARNING"}))
        await d.start()
        url = d.base_url

        async def stop() -> None:
            await d.stop()
            await stop_process(fake)

    else:
        port = free_port()
        log = open(home / "serve.log", "wb")  # noqa: SIM115 (closed by stop)
        serve = await spawn_serve(
            home, port, output=log, environ={**os.environ, "METIS_LOG_LEVEL": "WARNING"}
        )
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(base_url=url) as http:
            await wait_until_serving(http, "/health")

        async def stop() -> None:
            await stop_process(serve)
            await stop_process(fake)
            log.close()

    target = resolve_daemon(url=url, home=home)
    return Backend(url, home, target.headers(), fake_url, stop)


async def enqueue(fake_url: str, text: str, args: argparse.Namespace, burst: bool) -> None:
    reply = FakeReply.say(
        text,
        chunk_chars=args.chunk,
        single_write=burst,
        delay_ms=0 if burst else args.delay_ms,
        usage=FakeUsage(input_tokens=1000, output_tokens=args.deltas),
    )
    async with (
        aiohttp.ClientSession() as control,
        control.post(
            f"{fake_url}/_fake/enqueue",
            json={"api": "anthropic", "replies": [reply.model_dump(exclude_defaults=True)]},
        ) as r,
    ):
        assert r.status == 200, await r.text()


# -- measuring the app ---------------------------------------------------------------------------


@dataclass
class Keys:
    """Presses (perf_counter at the press), and when each reached the value and the screen."""

    pressed: list[float] = field(default_factory=list)
    value: dict[int, float] = field(default_factory=dict)
    screen: dict[int, float] = field(default_factory=dict)
    base = 0  # the prompt's length before the first press
    prompt: PromptInput | None = None
    updates = 0  # screen updates during the turn
    render_s = 0.0  # time spent rendering them to segments

    def on_value(self, text: str) -> None:
        now = time.perf_counter()
        for i in range(min(len(text) - self.base, len(self.pressed))):
            self.value.setdefault(i, now)

    def on_screen(self) -> None:
        now = time.perf_counter()
        for i in self.value:
            self.screen.setdefault(i, now)


KEYS = Keys()


def instrument(app: ChatApp) -> None:
    """Watch the prompt's edits and the app's screen updates (class-level wraps: Textual finds
    handlers on the class)."""
    original_key = PromptInput._on_key

    async def on_key(self: PromptInput, event: events.Key) -> None:
        await original_key(self, event)
        if self is KEYS.prompt:
            KEYS.on_value(self.text)

    PromptInput._on_key = on_key  # type: ignore[method-assign]
    original_display = app._display

    def display(screen: Any, renderable: Any) -> None:
        original_display(screen, renderable)
        if renderable is None or app._batch_count:
            return
        started = time.perf_counter()
        if hasattr(renderable, "render_segments"):
            renderable.render_segments(app.console)  # what a terminal write would cost
        KEYS.render_s += time.perf_counter() - started
        KEYS.updates += 1
        KEYS.on_screen()

    app._display = display  # type: ignore[method-assign]


def typist(app: ChatApp, interval_s: float, stop: threading.Event) -> None:
    """The terminal's input thread: one key press every `interval_s`."""
    driver = app._driver
    assert driver is not None
    while not stop.wait(interval_s):
        KEYS.pressed.append(time.perf_counter())
        driver.send_message(events.Key("x", "x"))


@dataclass
class TurnResult:
    mode: str
    complete: bool
    stream_s: float
    drawn_s: float
    cpu_s: float
    value_ms: list[float]
    screen_ms: list[float]
    missed: int
    updates: int
    render_ms: float


async def until(condition: Callable[[], Any], timeout: float = 120.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


async def one_turn(
    app: ChatApp, backend: Backend, text: str, args: argparse.Namespace, mode: str
) -> TurnResult:
    global KEYS
    await enqueue(backend.fake_url, text, args, burst=mode == "burst")
    app.prompt.set_text("")
    before = len(app.query(AssistantMessage))
    KEYS = Keys(prompt=app.prompt)
    started = time.perf_counter()
    cpu_started = time.thread_time()
    app.prompt.post_message(PromptInput.Submitted("go"))
    await until(lambda: len(app.query(AssistantMessage)) > before)
    await until(lambda: app.prompt.text == "")
    stop = threading.Event()
    thread = threading.Thread(
        target=typist, args=(app, args.key_interval_ms / 1000, stop), daemon=True
    )
    thread.start()
    await until(lambda: app.turn.id is None)
    stream_s = time.perf_counter() - started
    reply = list(app.query(AssistantMessage))[-1]
    with contextlib.suppress(TimeoutError):
        await until(lambda: reply.source == text, timeout=30)
    drawn_s = time.perf_counter() - started
    cpu_s = time.thread_time() - cpu_started
    stop.set()
    thread.join()
    await asyncio.sleep(0.2)  # the last presses settle
    complete = reply.text == text and reply.source == text
    value = [1000 * (KEYS.value[i] - t) for i, t in enumerate(KEYS.pressed) if i in KEYS.value]
    screen = [1000 * (KEYS.screen[i] - t) for i, t in enumerate(KEYS.pressed) if i in KEYS.screen]
    return TurnResult(
        mode,
        complete,
        stream_s,
        drawn_s,
        cpu_s,
        value,
        screen,
        len(KEYS.pressed) - len(screen),
        KEYS.updates,
        1000 * KEYS.render_s,
    )


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(results: list[TurnResult], args: argparse.Namespace) -> bool:
    print()
    print(
        f"{args.deltas} deltas of {args.chunk} chars per turn, a key every "
        f"{args.key_interval_ms:g} ms while it streams, daemon "
        f"{'in this process' if args.in_process else 'in its own process'}"
    )
    header = (
        f"{'mode':<6} {'turn':>4} {'complete':>8} {'turn s':>6} {'drawn s':>7} {'keys':>5} "
        f"{'value p50/p95/max ms':>22} {'screen p50/p95/max ms':>23} {'updates':>7} {'app cpu s':>9}"
    )
    print(header)
    print("-" * len(header))
    ok = True
    for mode in ("burst", "paced"):
        rows = [r for r in results if r.mode == mode]
        for n, r in enumerate(rows, 1):
            v, s = r.value_ms, r.screen_ms
            print(
                f"{mode:<6} {n:>4} {'yes' if r.complete else 'NO':>8} {r.stream_s:>6.2f} {r.drawn_s:>7.2f} "
                f"{len(s):>5} {pct(v, 0.5):>6.1f}/{pct(v, 0.95):>6.1f}/{max(v, default=0):>6.1f}"
                f"   {pct(s, 0.5):>6.1f}/{pct(s, 0.95):>6.1f}/{max(s, default=0):>6.1f}"
                f" {r.updates:>7} {r.cpu_s:>9.2f}"
            )
    print()
    print(f"{'goal':<44} {'figure':>22} {'met':>4}")
    for mode in ("burst", "paced"):
        rows = [r for r in results if r.mode == mode]
        if not rows:
            continue
        screen = [x for r in rows for x in r.screen_ms]
        missed = sum(r.missed for r in rows)
        complete = all(r.complete for r in rows)
        lines = [
            (
                f"{mode}: the whole reply in the transcript",
                f"{sum(r.complete for r in rows)}/{len(rows)} turns",
                complete,
            ),
            (
                f"{mode}: key to screen p50 < {GOAL_MS:g} ms",
                f"{pct(screen, 0.5):.1f} ms",
                pct(screen, 0.5) < GOAL_MS,
            ),
            (
                f"{mode}: key to screen p95 < {GOAL_MS:g} ms",
                f"{pct(screen, 0.95):.1f} ms",
                pct(screen, 0.95) < GOAL_MS,
            ),
            (
                f"{mode}: key to screen max (n={len(screen)})",
                f"{max(screen, default=0):.1f} ms",
                True,
            ),
            (f"{mode}: every key reached the screen", f"{missed} missed", missed == 0),
        ]
        for goal, figure, met in lines:
            ok = ok and met
            print(f"{goal:<44} {figure:>22} {'yes' if met else 'NO':>4}")
    return ok


async def main_async(args: argparse.Namespace) -> bool:
    backend = await start_backend(args.in_process)
    workspace = Path(tempfile.mkdtemp(prefix="metis-bench-ws-"))
    text = markdown_reply(args.deltas * args.chunk)
    results: list[TurnResult] = []
    try:
        app = ChatApp(
            backend.url,
            backend.headers,
            workspace=str(workspace),
            home=backend.home,
            freeze_heap=True,  # as `metis chat` does
        )
        async with app.run_test(size=SIZE) as pilot:
            await until(lambda: app.stream.reader is not None, timeout=30)
            instrument(app)
            modes = ["burst", "paced"] if args.mode == "both" else [args.mode]
            for mode in modes:
                for _ in range(args.turns):
                    results.append(await one_turn(app, backend, text, args, mode))
                    print(f"  {mode} turn: {results[-1].stream_s:.2f} s", file=sys.stderr)
            await pilot.press("ctrl+q")
    finally:
        await backend.stop()
    return report(results, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deltas", type=int, default=5000)
    parser.add_argument("--chunk", type=int, default=8, help="characters per delta")
    parser.add_argument("--turns", type=int, default=3, help="turns per mode")
    parser.add_argument("--mode", choices=("burst", "paced", "both"), default="both")
    parser.add_argument("--delay-ms", type=float, default=0.5, help="between deltas (paced)")
    parser.add_argument("--key-interval-ms", type=float, default=20)
    parser.add_argument("--in-process", action="store_true")
    ok = asyncio.run(main_async(parser.parse_args()))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
