"""Benchmark: `GET /sessions?q=` over a store of many long conversations, and the one-time cost
of opening a store written by an older release.

The store is built as schema v3 left it (sessions, prompts and replies, a title on every tenth
session), then a daemon opens it: a release with a newer schema migrates it first, and the
time from `Daemon.start()` to its first answer says what that upgrade costs once. Then each
search is sent `--rounds` times by a client in this process; the table gives the p50 of each:

- a miss: a word in no session, so every session is looked through;
- a rare word: in one session, near the oldest (found last, newest first);
- a common word with a limit of 50: the first page fills at once;
- the oldest session's id, which no conversation text holds.

Run: `python scripts/bench_search.py [--sessions 5000] [--messages 20] [--chars 600]
[--rounds 20]` (defaults: ~60 MB of text, a heavy year of use).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

from metis.config import load_settings
from metis.core.canonical.ids import new_session_id, new_ulid
from metis.core.store.migrations import MIGRATIONS
from metis.server.runner import Daemon
from metis.testing.bench import bench_workspace, daemon_headers

WORDS = [f"w{n:04d}" for n in range(4000)]  # a vocabulary none of the searches below is in
COMMON = "deploy"


def build_v3_store(path: Path, sessions: int, messages: int, chars: int) -> list[str]:
    """The store file at schema v3; returns the session ids, oldest first."""
    rng = random.Random(7)
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:3]:
        conn.executescript(script)
    ids = []
    workspace = bench_workspace()
    for n in range(sessions):
        sid = new_session_id()
        ids.append(sid)
        conn.execute(
            "INSERT INTO sessions (id, workspace_path, routing_policy_version, status, "
            "created_at_us, updated_at_us) VALUES (?, ?, 'v', 'active', 1, 1)",
            (sid, workspace),
        )
        if n % 10 == 0:
            conn.execute(
                "INSERT INTO session_titles (session_id, title, updated_at_us) VALUES (?, ?, 1)",
                (sid, f"Session {n} about {rng.choice(WORDS)}"),
            )
        rows = []
        for m in range(messages):
            text = " ".join(rng.choice(WORDS) for _ in range(chars // 6))
            if m == 3:
                text += f" {COMMON}"
            if n == 1 and m == messages - 1:
                text += " Zanzibar"
            content = json.dumps([{"type": "text", "text": text}])
            role = "user" if m % 2 == 0 else "assistant"
            rows.append((new_ulid(), sid, role, content))
        conn.executemany(
            "INSERT INTO messages (id, session_id, turn_id, role, status, content_json, "
            "metadata_json, created_at_us, schema_version) "
            "VALUES (?, ?, NULL, ?, 'complete', ?, '{}', 1, 1)",
            rows,
        )
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    return ids


async def p50_ms(http: aiohttp.ClientSession, params: dict[str, str], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        async with http.get("/sessions", params=params) as response:
            assert response.status == 200, await response.text()
            await response.read()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


async def main(sessions: int, messages: int, chars: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as home:
        started = time.perf_counter()
        ids = build_v3_store(Path(home, "metis.db"), sessions, messages, chars)
        built = time.perf_counter() - started
        size = Path(home, "metis.db").stat().st_size / 2**20
        print(f"store: {sessions:,} sessions × {messages} messages, {size:.0f} MB ({built:.1f} s)")
        daemon = Daemon(load_settings(home=Path(home), port=0, overrides={"log_level": "WARNING"}))
        started = time.perf_counter()
        await daemon.start()
        print(
            f"open (migrating if this release's schema is newer): {time.perf_counter() - started:.2f} s"
        )
        try:
            async with aiohttp.ClientSession(
                base_url=daemon.base_url, headers=daemon_headers(daemon)
            ) as http:
                cases = {
                    "a miss (every session looked through)": {"q": "nowhere"},
                    "a rare word (one session, near the oldest)": {"q": "zanzibar"},
                    f"a common word, limit 50 ('{COMMON}')": {"q": COMMON, "limit": "50"},
                    "the oldest session's id": {"q": ids[0]},
                }
                for label, params in cases.items():
                    print(f"{label}: p50 {await p50_ms(http, params, rounds):.1f} ms")
        finally:
            await daemon.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--chars", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.messages, args.chars, args.rounds))
