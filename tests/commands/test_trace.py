"""`metis trace prune --days N` against a real store: the real command in a subprocess (with the
daemon serving, and with it stopped and started again afterwards), then WebSocket subscribes
with old cursors; argument and store errors through the CLI entry point."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.cli import main
from metis.commands.trace import DAY_US
from metis.core.events.catalog import SYSTEM_STREAM
from metis.core.store.migrations import LATEST_VERSION
from metis.server.runner import Daemon
from tests.api import Api
from tests.cli import metis, start_metis
from tests.shell_sandbox import require_bwrap
from tests.ws_client import Ws

UNPRUNED_TABLES = ("sessions", "turns", "messages", "tool_calls", "confirmations")


async def prune(*args: str) -> tuple[int, str, str]:
    """The real command, as a user runs it (METIS_HOME comes from the environment)."""
    return await metis("trace", "prune", *args)


def age(db_path: Path, session_id: str, up_to_seq: int, days: int) -> None:
    """Back-date a session's events up to `up_to_seq` (what time would have done)."""
    with sqlite3.connect(db_path, timeout=10) as conn:
        conn.execute(
            "UPDATE events SET timestamp_us = timestamp_us - ? WHERE session_id=? AND seq<=?",
            (days * DAY_US, session_id, up_to_seq),
        )
    conn.close()


def census(db_path: Path) -> dict[str, Any]:
    """Row counts of every table a prune must not touch, and each stream's event seqs."""
    with sqlite3.connect(db_path, timeout=10) as conn:
        counts = {
            t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in UNPRUNED_TABLES
        }
        streams: dict[str, list[int]] = {}
        for sid, seq in conn.execute("SELECT session_id, seq FROM events ORDER BY session_id, seq"):
            streams.setdefault(sid, []).append(seq)
        floors = dict(conn.execute("SELECT id, events_floor_seq FROM sessions"))
    conn.close()
    return {"counts": counts, "streams": streams, "floors": floors}


async def expect_cursor_expired(api: Api, session_id: str, since: str) -> None:
    client = await Ws.open(api, session_id)
    error = await client.subscribe(since=since)
    assert error["type"] == "subscribe_error", error
    assert error["code"] == "cursor_expired" and error["details"]["since"] == since
    closed = await client.closed()
    assert closed.code == 1008 and closed.reason is not None
    assert closed.reason["code"] == "cursor_expired"


async def test_a_prune_while_the_daemon_serves_expires_cursors_at_or_below_the_floor(
    daemon: Daemon, api_of: Callable[[Daemon], Api], workspace: Path
) -> None:
    api = api_of(daemon)
    old = (await api.create_session(workspace))["id"]
    young = (await api.create_session(workspace))["id"]
    for sid in (old, young):
        await api.run_turn(sid, "please use server tool")  # messages, a turn, a tool call
        await api.run_turn(sid, "hello")
    events = await api.events(old)
    await api.events(young)  # flushed
    floor = events[len(events) // 2]["seq"]
    db_path = daemon.settings.db_path
    age(db_path, old, floor, days=40)
    age(db_path, young, 10**9, days=10)
    purged = (await api.create_session(workspace))["id"]
    await api.call("DELETE", f"/sessions/{purged}", params={"purge": "true"})
    await api.events(young)  # `session.purged` is on the system stream, which is never pruned
    age(db_path, SYSTEM_STREAM, 10**9, days=40)
    before = census(db_path)
    assert before["streams"][SYSTEM_STREAM] and before["counts"]["tool_calls"] == 2

    code, out, err = await prune("--days", "30")

    assert code == 0, err
    assert out.startswith(f"pruned {floor} events older than 30 days (") and out.endswith(
        " from 1 session\n"
    )
    after = census(db_path)
    assert after["counts"] == before["counts"]
    assert after["streams"][old] == before["streams"][old][floor:]
    assert after["floors"] == {**before["floors"], old: floor}
    del after["streams"][old], before["streams"][old]
    assert after["streams"] == before["streams"]  # other sessions and the system stream
    for since in (events[0]["id"], events[floor - 1]["id"]):  # below and at the floor
        await expect_cursor_expired(api, old, since)
        status, body = await api.call("GET", f"/sessions/{old}/events", params={"since": since})
        assert status == 400, body  # REST says why too: pruned, not a wrong id
        [error] = body["error"]["details"]["errors"]
        assert (
            error["msg"]
            == f"names no event this session still keeps (its events up to seq {floor} were pruned)"
        )
    client, ack = await Ws.subscribed(api, old, since=events[floor]["id"])  # above it
    assert ack["replay_event_count"] == len(events) - floor - 1
    await client.close()
    client, _ = await Ws.subscribed(api, old, snapshot=True)  # the documented recovery
    await client.close()
    _, done = await api.run_turn(old, "still serving")
    assert done["seq"] > events[-1]["seq"]


async def test_a_daemon_started_after_a_prune_refuses_old_cursors_and_continues_the_stream(
    start_daemon: Callable[..., Any], api_of: Callable[[Daemon], Api], workspace: Path
) -> None:
    d = await start_daemon()
    sid = (await api_of(d).create_session(workspace))["id"]
    await api_of(d).run_turn(sid, "hello")
    events = await api_of(d).events(sid)
    await d.stop()
    age(d.settings.db_path, sid, 10**9, days=3)

    code, out, err = await prune("--days", "2")

    assert code == 0, err
    assert f"pruned {len(events) - 1} events" in out  # the newest event stays
    d = await start_daemon()
    api = api_of(d)
    for since in (events[0]["id"], events[-2]["id"]):
        await expect_cursor_expired(api, sid, since)
    client, ack = await Ws.subscribed(api, sid, since=events[-1]["id"])
    assert ack["replay_event_count"] == 0
    await client.close()
    _, done = await api.run_turn(sid, "again")
    after = await api.events(sid)
    last = events[-1]["seq"]  # kept; the stream continues after it, not from 1 again
    assert [e["seq"] for e in after] == list(range(last, done["seq"] + 1))
    assert not [e for e in after if e["type"] == "bus.gap_detected"]  # never reported


async def test_nothing_older_than_the_cutoff_deletes_nothing(
    daemon: Daemon, api_of: Callable[[Daemon], Api], workspace: Path
) -> None:
    api = api_of(daemon)
    sid = (await api.create_session(workspace))["id"]
    await api.run_turn(sid, "hello")
    await api.events(sid)
    before = census(daemon.settings.db_path)
    code, out, _ = await metis("trace", "prune", "--days", "1", env={"TZ": "Asia/Kolkata"})
    assert code == 0
    # the cut-off in local time, its zone named
    assert re.fullmatch(
        r"nothing to prune: no session has events older than 1 day "
        r"\(before \d{4}-\d\d-\d\d \d\d:\d\d IST\)\n",
        out,
    ), out
    assert census(daemon.settings.db_path) == before


async def aged_session(daemon: Daemon, api_of: Callable[[Daemon], Api], workspace: Path) -> int:
    """A session whose events but the newest are 40 days old; returns how many a prune of 30
    days deletes."""
    api = api_of(daemon)
    sid = (await api.create_session(workspace))["id"]
    await api.run_turn(sid, "hello")
    events = await api.events(sid)
    age(daemon.settings.db_path, sid, events[-2]["seq"], days=40)
    return len(events) - 1


async def prune_at_a_terminal(*args: str, answer: bytes | int | None) -> tuple[int, str]:
    """The real command with a pseudo-terminal as stdin (what `isatty` sees at a prompt);
    `answer` is typed once the question is shown, or sent as a signal when it is one (None:
    expect no question)."""
    leader, follower = os.openpty()
    try:
        proc = await start_metis(
            "trace", "prune", *args, stdin=follower, stderr=asyncio.subprocess.STDOUT
        )
        os.close(follower)
        assert proc.stdout is not None
        seen = b""
        if answer is not None:
            async with asyncio.timeout(60):
                while b"[y/N] " not in seen:
                    chunk = await proc.stdout.read(256)
                    assert chunk, seen.decode()
                    seen += chunk
            if isinstance(answer, bytes):
                os.write(leader, answer)
            else:
                proc.send_signal(answer)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        os.close(leader)
    assert proc.returncode is not None
    return proc.returncode, (seen + out).decode()


async def test_a_dry_run_counts_what_a_prune_deletes_and_deletes_nothing(
    daemon: Daemon, api_of: Callable[[Daemon], Api], workspace: Path
) -> None:
    old = await aged_session(daemon, api_of, workspace)
    before = census(daemon.settings.db_path)
    code, out, err = await prune("--days", "30", "--dry-run")
    assert code == 0, err
    assert out.startswith(f"would prune {old} events older than 30 days (")
    assert out.endswith(" from 1 session\ndry run: nothing was deleted\n")
    assert census(daemon.settings.db_path) == before
    code, out, err = await prune("--days", "30")  # the same count, deleted this time
    assert code == 0 and out.startswith(f"pruned {old} events older than 30 days ("), err


async def test_at_a_terminal_a_prune_asks_first_and_no_deletes_nothing(
    daemon: Daemon, api_of: Callable[[Daemon], Api], workspace: Path
) -> None:
    old = await aged_session(daemon, api_of, workspace)
    before = census(daemon.settings.db_path)
    code, out = await prune_at_a_terminal("--days", "30", answer=b"n\n")
    assert f"delete {old} events older than 30 days (" in out and "? [y/N] " in out
    assert code == 1 and "nothing deleted" in out
    assert census(daemon.settings.db_path) == before
    code, out = await prune_at_a_terminal("--days", "30", answer=signal.SIGINT)  # Ctrl-C
    assert code == 130 and out.endswith("? [y/N] \nnothing deleted\n"), out
    assert "Traceback" not in out and census(daemon.settings.db_path) == before
    code, out = await prune_at_a_terminal("--days", "30", answer=b"y\n")
    assert code == 0 and f"pruned {old} events" in out
    assert census(daemon.settings.db_path) != before


async def test_at_a_terminal_yes_prunes_without_asking(
    daemon: Daemon, api_of: Callable[[Daemon], Api], workspace: Path
) -> None:
    old = await aged_session(daemon, api_of, workspace)
    code, out = await prune_at_a_terminal("--days", "30", "--yes", answer=None)
    assert code == 0 and "[y/N]" not in out and f"pruned {old} events" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["trace", "prune"], "the following arguments are required: --days"),
        (["trace", "prune", "--days", "ten"], "expected a whole number of days, got 'ten'"),
        (["trace", "prune", "--days", "1.5"], "expected a whole number of days, got '1.5'"),
        (["trace", "prune", "--days", "-3"], "expected 0 or more days, got -3"),
        (["trace", "prune", "--days", "3", "--session", "x"], "unrecognized arguments"),
    ],
)
def test_bad_arguments_are_usage_errors_with_exit_code_2(
    metis_home: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: metis") and message in err


def test_trace_without_a_subcommand_shows_its_help(
    metis_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace"]) == 2
    assert "prune" in capsys.readouterr().out


def test_a_missing_store_is_an_error_and_creates_nothing(
    metis_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "prune", "--days", "30"]) == 1
    assert f"no trace store at {metis_home / 'metis.db'}" in capsys.readouterr().err
    assert not (metis_home / "metis.db").exists()


def test_a_store_newer_than_this_metis_is_refused_untouched(
    metis_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metis_home.mkdir()
    path = metis_home / "metis.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {LATEST_VERSION + 1}")
    conn.close()
    assert main(["trace", "prune", "--days", "30"]) == 2
    assert "newer than this metis supports" in capsys.readouterr().err
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION + 1
    conn.close()


async def test_a_file_that_is_not_a_database_is_said_and_the_command_exits(
    metis_home: Path,
) -> None:
    """The store's connection failed to set up was left open, and its thread kept the process
    alive for good after the message."""
    metis_home.mkdir()
    (metis_home / "metis.db").write_text("garbage\n")
    code, _, err = await prune("--days", "0", "--dry-run")
    assert code == 1 and "file is not a database" in err, (code, err)


async def test_days_past_the_first_event_ever_delete_nothing_and_say_so(
    daemon: Daemon, api_of: Callable[[Daemon], Api], workspace: Path
) -> None:
    await aged_session(daemon, api_of, workspace)
    before = census(daemon.settings.db_path)
    code, out, err = await prune("--days", "1000000", "--yes")
    assert (code, err) == (0, "")
    assert out.startswith("nothing to prune: no session has events older than 1000000 days")
    assert "(before 1970-01-01 " in out
    assert census(daemon.settings.db_path) == before


async def test_a_read_only_home_is_said_and_its_store_left_as_it_was(
    daemon: Daemon, api_of: Callable[[Daemon], Api], workspace: Path
) -> None:
    """The command run where METIS_HOME is mounted read-only (bubblewrap binds it so)."""
    bwrap = require_bwrap()
    await aged_session(daemon, api_of, workspace)
    db_path = daemon.settings.db_path
    db_path.chmod(0o644)  # a mode the store tightens at open: the first write it tries
    before = census(db_path)
    home = str(db_path.parent)
    sandbox = [bwrap, "--bind", "/", "/", "--ro-bind", home, home, "--dev", "/dev"]
    proc = await asyncio.create_subprocess_exec(
        *sandbox,
        sys.executable,
        "-m",
        "metis.cli",
        "trace",
        "prune",
        "--days",
        "30",
        "--yes",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, (out, err)
    assert err.decode() == f"metis trace prune: cannot prune {db_path}: Read-only file system\n"
    assert census(db_path) == before
