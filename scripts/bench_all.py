"""Every performance figure of the daemon in one run, each beside its goal.

Run: `python scripts/bench_all.py [--runs 3] [--loop asyncio|uvloop] [--only GROUP ...]`
(`--loop` runs the in-process groups on that event loop; `metis serve` uses asyncio's).

Each figure is the median of `--runs` runs (3 by default): the figures are taken on shared
2-core machines where other work comes and goes, and one run can land in someone's test suite.
The fake provider always runs in its own process, so its CPU time never counts as the daemon's.
The other benchmark scripts are imported, not copied, so a figure here is the figure there.
Groups:

- startup: a real `metis serve` subprocess, spawn → first `GET /health` 200, then its resident
  set once idle (health probes only: the SDKs a first turn needs are imported when a client's
  first request comes) — with both providers configured, and with none;
  from compiled bytecode, as an installed metis starts (a first, uncounted start writes it);
- rest: `POST /sessions` and `POST /sessions/{id}/turns` → 202, round trips over loopback
  timed by a client in its own process (one turn per session, each run to its end before the
  next request, so a turn's work is not counted as another's latency); then, for reference,
  the same requests and pauses answered by a bare asyncio responder: the part of the 202 this
  machine takes to wake an idle process, which no server's code can shed;
- turns (`bench_turns.py`): daemon CPU per 200-delta turn, and turns 91–100 of a long session
  against a fresh session's turns 1–10 measured in the same seconds (growth); the growth again
  with a 20,000-token model window, which the long session fills after ~30 turns, so that its
  turns 91–100 are compacted at every model call; then, for reference, the CPU of a turn whose
  reply is one delta (the part no reply length changes) and what the SDK's request layers add
  to one model call over the same request on bare aiohttp (`bench_request.py`);
- ws (`bench_ws.py`): 30 turns × 200 deltas to 1 and to 10 raw-socket clients, with the share
  of a CPU the daemon and the fake provider each used meanwhile (a daemon far from 100 % is
  not what bounds the figure);
- aap (`bench_aap.py`): `text_delta` events/s of one 20,000-delta SSE turn;
- burst: the fake provider writes a 5,000- and a 50,000-delta reply in one socket write, read
  by 1 and by 10 WebSocket clients: did every client get every frame of the turn.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
import bench_aap
import bench_request
import bench_turns
import bench_ws

from metis.config import load_settings
from metis.core.events.catalog import TURN_TERMINAL
from metis.core.events.envelope import AnyEvent
from metis.server.runner import Daemon, freeze_startup_heap
from metis.testing.bench import (
    bench_models_yaml,
    bench_reply,
    bench_workspace,
    daemon_headers,
    spawn_fake_provider,
    stop_process,
)
from metis.testing.serving import free_port

GROUPS = ("startup", "rest", "turns", "ws", "aap", "burst")
BURSTS = ((5_000, 1), (5_000, 10), (50_000, 1), (50_000, 10))
WINDOW_TOKENS = 20_000
"""The model's window when timing a session that outgrew it: ~30 turns of 200 deltas fill it."""


@dataclass
class Figure:
    """One row of the table: its samples (one per run) and the goal they are held to."""

    label: str
    unit: str
    goal: float | None  # None: a yes/no figure or one printed for information
    higher_is_better: bool = False
    samples: list[float] = field(default_factory=list)
    note: str = ""

    def value(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    def met(self) -> str:
        value = self.value()
        if value is None or self.goal is None:
            return ""
        ok = value >= self.goal if self.higher_is_better else value <= self.goal
        return "yes" if ok else "NO"


@dataclass
class YesNo:
    """A figure that is a yes or a no per run (every run must say yes)."""

    label: str
    answers: list[bool] = field(default_factory=list)
    note: str = ""


class Table:
    def __init__(self) -> None:
        self.figures: dict[str, Figure] = {}
        self.checks: dict[str, YesNo] = {}

    def figure(self, key: str, *args: Any, **kw: Any) -> Figure:
        if key not in self.figures:
            self.figures[key] = Figure(*args, **kw)
        return self.figures[key]

    def check(self, key: str, label: str) -> YesNo:
        return self.checks.setdefault(key, YesNo(label))

    def render(self) -> str:
        rows = [("figure", "median", "goal", "met", "runs / note")]
        for f in self.figures.values():
            value = f.value()
            shown = "—" if value is None else _fmt(value, f.unit)
            goal = (
                ""
                if f.goal is None
                else ("≥ " if f.higher_is_better else "≤ ") + _fmt(f.goal, f.unit)
            )
            runs = ", ".join(_fmt(s, "") for s in f.samples)
            rows.append((f.label, shown, goal, f.met(), f"[{runs}] {f.note}".strip()))
        for c in self.checks.values():
            answer = "—" if not c.answers else ("yes" if all(c.answers) else "NO")
            runs = ", ".join("yes" if a else "no" for a in c.answers)
            rows.append((c.label, answer, "yes", answer, f"[{runs}] {c.note}".strip()))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = []
        for n, row in enumerate(rows):
            lines.append(
                "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
            )
            if n == 0:
                lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 11)
        return "\n".join(lines)


def _fmt(value: float, unit: str) -> str:
    if abs(value) >= 10_000:
        text = f"{value:,.0f}"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"
    return f"{text} {unit}".strip()


# -- start-up: a real `metis serve` ------------------------------------------------------------


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match, status
    return int(match.group(1)) / 1024


def _health_ok(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _idle_rss(pid: int, settle_s: float = 1.5, limit_s: float = 15.0) -> float:
    """The resident set once it stops moving (start-up's background work is over)."""
    time.sleep(settle_s)
    deadline = time.monotonic() + limit_s
    last = _rss_mib(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _rss_mib(pid)
        if abs(now - last) < 0.25:
            return now
        last = now
    return last


def _client_came(port: int, home: str) -> None:
    """One authenticated request, as a client's first: the daemon then imports the SDKs."""
    key = Path(home, "api_key").read_text().strip()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/models", headers={"Authorization": f"Bearer {key}"})
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def serve_startup(keys: bool) -> tuple[float, float, float]:
    """(spawn → first /health 200 in s, idle RSS, RSS once a client came, in MiB) of one
    `metis serve` process.

    With `keys`, both shipped providers are configured (dummy keys: nothing is called); while
    only health probes come, their SDKs are not imported (docs/decisions.md, start-up)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.pop("METIS_OFFLINE", None)
    # An installed metis runs from compiled bytecode: keep it (outside the work tree) even where
    # the environment turns writing it off, and time a start that finds it there.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "metis-bench-pycache")
    if keys:
        env |= {"ANTHROPIC_API_KEY": "bench-anthropic", "OPENAI_API_KEY": "bench-openai"}
    with tempfile.TemporaryDirectory() as home:
        command = [sys.executable, "-m", "metis.cli", "serve", "--home", home, "--port", str(port)]
        command += ["--log-level", "WARNING"]
        started = time.perf_counter()
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
        try:
            while not _health_ok(port):
                if proc.poll() is not None:
                    raise SystemExit(f"metis serve exited with {proc.returncode}")
                time.sleep(0.002)
            ready = time.perf_counter() - started
            rss = _idle_rss(proc.pid)
            _client_came(port, home)
            rss_client = _idle_rss(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return ready, rss, rss_client


# -- in-process daemons ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_daemon(fake_url: str, context_tokens: int = 200_000) -> AsyncIterator[Daemon]:
    """A fresh daemon (own home, the fake provider as its model), frozen as `metis serve` is."""
    async with aiohttp.ClientSession() as control:  # no reply left over from another group
        await control.post(f"{fake_url}/_fake/reset")
    with tempfile.TemporaryDirectory() as home:
        models = bench_models_yaml(fake_url, context_tokens=context_tokens)
        Path(home, "models.yaml").write_text(models)
        daemon = Daemon(load_settings(home=Path(home), port=0, overrides={"log_level": "WARNING"}))
        await daemon.start()
        await daemon.warmed()  # the SDKs imported in the background are in
        freeze_startup_heap()
        try:
            yield daemon
        finally:
            await daemon.stop()


def rest_client(port: int, key: str, workspace: str, n: int, floor_port: int) -> None:
    """The client process of `rest_latency`: times each request to its whole response."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def post(path: str, body: dict[str, Any], status: int) -> tuple[float, Any]:
        started = time.perf_counter()
        conn.request("POST", path, json.dumps(body), headers)
        response = conn.getresponse()
        data = response.read()
        elapsed = time.perf_counter() - started
        assert response.status == status, (response.status, data)
        return elapsed, json.loads(data)

    sessions, creates, submits, floor = [], [], [], []
    for _ in range(n):
        elapsed, body = post("/sessions", {"workspace_path": workspace}, 201)
        creates.append(elapsed)
        sessions.append(body["id"])
    turn = {"content": [{"type": "text", "text": "go"}]}
    for sid in sessions:  # one turn per session: none waits for another to end
        elapsed, _ = post(f"/sessions/{sid}/turns", turn, 202)
        submits.append(elapsed)
        time.sleep(TURN_GAP_S)  # the turn runs to its end before the next request
    conn = http.client.HTTPConnection("127.0.0.1", floor_port)
    for sid in sessions:  # the same requests and gaps, answered by the bare responder
        elapsed, _ = post(f"/sessions/{sid}/turns", turn, 202)
        floor.append(elapsed)
        time.sleep(TURN_GAP_S)
    print(json.dumps({"creates": creates, "submits": submits, "floor": floor}))


TURN_GAP_S = 0.02
"""The client's pause after each 202, for the turn to end before the next request comes."""


class _BareResponder(asyncio.Protocol):
    """The least an asyncio server can do per request: answer a fixed 202 once the request's
    body is in (http.client sends the head and the body in two writes)."""

    ANSWER = (
        b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, found, body = self.buffer.partition(b"\r\n\r\n")
        if not found:
            return
        length = re.search(rb"(?i)content-length:\s*(\d+)", head)
        if len(body) >= (int(length.group(1)) if length else 0):
            self.buffer = b""
            self.transport.write(self.ANSWER)


async def _serve_bare_responder() -> None:
    """`--bare-responder`: print its port, answer until stdin closes."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_BareResponder, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()


async def rest_latency(daemon: Daemon, fake_url: str, n: int = 300) -> tuple[float, float, float]:
    """(POST /sessions p50, POST …/turns → 202 p50, the same requests answered by a bare asyncio
    responder p50), in ms, timed by a client in its own process (as a real client is): its CPU
    and the turns it starts do not count as latency.

    The last is the machine's floor for the 202 as timed: between two submissions the daemon is
    idle for `TURN_GAP_S`, and on these virtual machines a process woken from idle answers
    slower than one kept busy (measured: `GET /health` 0.3 ms back to back, 1.1 ms after 20 ms
    idle; a bare responder 0.2 and 0.6 ms)."""
    async with aiohttp.ClientSession() as http:
        replies = [bench_reply(5, repeat=n)]
        await http.post(f"{fake_url}/_fake/enqueue", json={"api": "anthropic", "replies": replies})
    key = daemon_headers(daemon)["Authorization"].removeprefix("Bearer ")
    bare = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--bare-responder",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert bare.stdout is not None and bare.stdin is not None
    bare_port = (await bare.stdout.readline()).decode().strip()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--rest-client",
            str(daemon.port),
            key,
            bench_workspace(),
            str(n),
            bare_port,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
    finally:
        bare.stdin.close()
        await bare.wait()
    assert proc.returncode == 0, "the REST client failed"
    result = json.loads(out.decode().strip().splitlines()[-1])
    await daemon.core.turns.wait_all()
    create, submit, floor = (
        statistics.median(result[key]) * 1000 for key in ("creates", "submits", "floor")
    )
    return create, submit, floor


async def burst(daemon: Daemon, fake_url: str, deltas: int, readers: int) -> tuple[bool, str]:
    """One single-write reply of `deltas` deltas to `readers` WebSocket clients: whether every
    client received every frame the turn emitted on its session, and the delivery rate."""
    core = daemon.core
    async with aiohttp.ClientSession(
        base_url=daemon.base_url, headers=daemon_headers(daemon)
    ) as http:
        async with http.post("/sessions", json={"workspace_path": bench_workspace()}) as r:
            sid = (await r.json())["id"]
        paths = await bench_ws._attach_paths(http, sid, readers)
        proc = await bench_ws._clients(
            "127.0.0.1", daemon.port, 1, '"type":"turn.completed"', paths
        )
        while core.hub.client_count(sid) < readers or any(
            c.accept is not None for c in core.hub._sessions[sid].clients
        ):
            await asyncio.sleep(0.01)
        emitted = 0
        ended = asyncio.Event()

        def count(event: AnyEvent) -> None:
            nonlocal emitted
            if event.session_id == sid and not ended.is_set():
                emitted += 1
                if event.type in TURN_TERMINAL:
                    ended.set()

        core.bus.subscribe(f"bench-burst-{sid}", count, transient=True)
        reply = {
            "text": "".join(str(i % 10) for i in range(deltas)),
            "chunk_chars": 1,
            "single_write": True,
            "usage": {"input_tokens": 100, "output_tokens": deltas},
        }
        await http.post(f"{fake_url}/_fake/enqueue", json={"api": "anthropic", "replies": [reply]})
        async with http.post(
            f"/sessions/{sid}/turns", json={"content": [{"type": "text", "text": "burst"}]}
        ) as r:
            assert r.status == 202, await r.text()
        await asyncio.wait_for(ended.wait(), timeout=300)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
    rows = json.loads(out.decode().strip().splitlines()[-1])
    got = [int(row["frames"]) for row in rows]
    span = max(r["last"] for r in rows) - min(r["first"] for r in rows)
    rate = sum(got) / span if span else 0.0
    ok = all(g == emitted for g in got)
    detail = f"{emitted} frames, {rate:,.0f}/s" if ok else f"got {got} of {emitted}"
    return ok, detail


async def in_process(table: Table, groups: set[str]) -> None:
    fake, fake_url = await spawn_fake_provider()
    try:
        if "rest" in groups:
            async with running_daemon(fake_url) as daemon:
                create, submit, floor = await rest_latency(daemon, fake_url)
            table.figure("sessions", "POST /sessions p50", "ms", 0.5).samples.append(create)
            table.figure("submit", "POST turns → 202 p50", "ms", 1.0).samples.append(submit)
            table.figure(
                "floor", "  the same, a bare asyncio responder (floor)", "ms", None
            ).samples.append(floor)
        if "turns" in groups:
            async with running_daemon(fake_url) as daemon:
                with tempfile.TemporaryDirectory() as workspace:
                    samples = await bench_turns.run_turns(
                        daemon, fake_url, workspace, 100, 200, None
                    )
            cpu = [s[1] for s in samples["long"]]
            fresh_cpu = statistics.median(s[1] for s in samples["fresh"])
            wall = [s[0] for s in samples["long"]]
            fresh_wall = statistics.median(s[0] for s in samples["fresh"])
            table.figure("cpu", "daemon CPU per 200-delta turn p50", "ms", 4.0).samples.append(
                statistics.median(cpu)
            )
            growth = table.figure("growth", "growth turns 91–100 / 1–10 (CPU)", "×", 1.05)
            growth.samples.append(statistics.median(cpu[-10:]) / fresh_cpu)
            wall_growth = table.figure(
                "growth_wall", "growth turns 91–100 / 1–10 (wall)", "×", None
            )
            wall_growth.samples.append(statistics.median(wall[-10:]) / fresh_wall)
            async with running_daemon(fake_url, context_tokens=WINDOW_TOKENS) as daemon:
                with tempfile.TemporaryDirectory() as workspace:
                    samples = await bench_turns.run_turns(
                        daemon, fake_url, workspace, 100, 200, None
                    )
            full = table.figure(
                "growth_full", "growth past a full window, turns 91–100 / 1–10 (CPU)", "×", 1.05
            )
            full.samples.append(
                statistics.median(s[1] for s in samples["long"][-10:])
                / statistics.median(s[1] for s in samples["fresh"])
            )
            # What a turn costs whatever its reply's length, and the share of it the SDK's
            # request layers take (informational: they say where the CPU goal stands).
            async with running_daemon(fake_url) as daemon:
                with tempfile.TemporaryDirectory() as workspace:
                    samples = await bench_turns.run_turns(daemon, fake_url, workspace, 30, 1, None)
            table.figure("cpu1", "daemon CPU per 1-delta turn p50", "ms", None).samples.append(
                statistics.median(s[1] for s in samples["long"])
            )
            request = await bench_request.measure(fake_url, 200, 3)
            sdk = statistics.median(request["SDK request"]) - statistics.median(
                request["bare aiohttp"]
            )
            table.figure(
                "sdk", "of which the SDK's layers per model call (CPU)", "ms", None
            ).samples.append(sdk)
        if "ws" in groups:
            async with (
                running_daemon(fake_url) as daemon,
                aiohttp.ClientSession(
                    base_url=daemon.base_url, headers=daemon_headers(daemon)
                ) as http,
            ):
                await bench_ws.run_turns(daemon, http, fake_url, 1, 2, 200)  # warm-up
                one = await bench_ws.run_turns(daemon, http, fake_url, 1, 30, 200, fake.pid)
                many = await bench_ws.run_turns(daemon, http, fake_url, 10, 30, 200, fake.pid)
            for key, label, goal, run in (
                ("ws1", "WS frames/s, 1 client", 40_000, one),
                ("ws10", "WS frames/s, 10 clients total", 250_000, many),
            ):
                table.figure(key, label, "/s", goal, True).samples.append(run["rate"])
                table.figure(
                    f"{key}_busy", "  CPU share meanwhile: daemon", "%", None
                ).samples.append(100 * run["daemon_busy"])
                table.figure(
                    f"{key}_provider", "  CPU share meanwhile: fake provider", "%", None
                ).samples.append(100 * run["provider_busy"])
        if "aap" in groups:
            async with running_daemon(fake_url) as daemon, aiohttp.ClientSession() as http:
                rate = await bench_aap.relay(http, daemon.base_url, fake_url, 20_000)
            table.figure(
                "aap", "AAP SSE text_delta/s (20,000 deltas)", "/s", 40_000, True
            ).samples.append(rate)
        if "burst" in groups:
            async with running_daemon(fake_url) as daemon:
                for deltas, readers in BURSTS:
                    ok, detail = await burst(daemon, fake_url, deltas, readers)
                    check = table.check(
                        f"burst{deltas}x{readers}",
                        f"burst {deltas:,} deltas → {readers} WS reader(s): all delivered",
                    )
                    check.answers.append(ok)
                    check.note = detail
    finally:
        await stop_process(fake)


def run_loop(loop: str, coro: Any) -> Any:
    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rest-client":
        port, key, workspace, n, floor_port = sys.argv[2:]
        rest_client(int(port), key, workspace, int(n), int(floor_port))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--bare-responder":
        asyncio.run(_serve_bare_responder())
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--only", nargs="*", choices=GROUPS, default=list(GROUPS))
    args = parser.parse_args()
    groups = set(args.only)
    os.environ["METIS_API_KEY"] = bench_aap.KEY  # the AAP relay authenticates with it
    table = Table()
    if "startup" in groups:
        serve_startup(True)  # not counted: compiles the bytecode the others find
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs} …", file=sys.stderr, flush=True)
        if "startup" in groups:
            ready, rss, rss_client = serve_startup(True)
            table.figure("spawn", "spawn → first /health 200", "s", 0.5).samples.append(ready)
            table.figure("rss", "RSS idle, providers configured", "MiB", 60).samples.append(rss)
            table.figure(
                "rss_client", "RSS once a client came, providers configured", "MiB", None
            ).samples.append(rss_client)
            ready_bare, rss_bare, _ = serve_startup(False)
            table.figure(
                "spawn_bare", "spawn → /health 200, no provider key", "s", 0.5
            ).samples.append(ready_bare)
            table.figure("rss_bare", "RSS idle, no provider key", "MiB", 60).samples.append(
                rss_bare
            )
        run_loop(args.loop, in_process(table, groups))
    print(
        f"\nmedians of {args.runs} runs ({args.loop} loop; {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f} at the end)"
    )
    print(table.render())


if __name__ == "__main__":
    main()
