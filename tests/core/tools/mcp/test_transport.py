"""The stdio transport with real processes: its stop (and what happens when it is cut short),
and the server's stderr log."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
from pathlib import Path

import anyio
import pytest

from metis.core.tools.groups import ProcessGroupLedger
from metis.core.tools.mcp import transport
from metis.core.tools.mcp.stderr_log import MAX_STDERR_LOG_BYTES, CappedLog
from metis.core.tools.mcp.transport import (
    Liveness,
    StdioProcess,
    server_environment,
    stdio_transport,
)
from tests.processes import gone


async def held_open(
    script: str,
    started: list[StdioProcess],
    *,
    ledger: ProcessGroupLedger | None,
    stderr_path: Path | None,
) -> None:
    """A stdio transport to `/bin/sh -c script`, held open until the task is cancelled."""
    async with stdio_transport(
        "/bin/sh",
        ("-c", script),
        server_environment({}),
        None,
        ledger=ledger,
        stderr_path=stderr_path,
        started=started,
    ):
        await anyio.sleep(3600)


async def test_a_stop_cut_short_kills_the_group_at_once_and_keeps_its_note(tmp_path: Path) -> None:
    """A shutdown past its grace cancels the owner task while the transport stops a server
    that ignores SIGTERM: the group is SIGKILLed there and then, and its note stays in the
    ledger for the next start (it leaves only once the process is known to have exited)."""
    ledger = ProcessGroupLedger(tmp_path / "groups")
    started: list[StdioProcess] = []

    task = asyncio.create_task(
        held_open("trap '' TERM; exec sleep 1003", started, ledger=ledger, stderr_path=None)
    )
    while not started:
        await asyncio.sleep(0.01)
    pid = started[0].pid
    task.cancel()  # the stop begins: stdin closed, then a grace before SIGTERM
    await asyncio.sleep(0.3)
    task.cancel()  # and is cut short
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert await gone(pid, timeout_s=1.0)  # not after the 4 s the whole stop would take
    assert (tmp_path / "groups" / str(pid)).exists()


def test_a_stray_stdout_line_is_kept_once_escaped_and_cut() -> None:
    """The first line that is not JSON-RPC says why a server never answered; it is the server's
    text, shown to a person: its control characters escaped, cut to 80 characters."""
    process = StdioProcess(1, "m", Liveness())
    process.note_stray("\x1b[2Jlistening on " + "x" * 200 + "\n")
    process.note_stray("second line")
    assert process.stray_line == repr("\x1b[2Jlistening on " + "x" * 62 + "…")
    assert "\x1b" not in process.stray_line


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def until_closed(before: set[str], timeout_s: float = 5.0) -> set[str]:
    """The descriptors opened since `before` still open once `timeout_s` has passed (a process's
    pipes close when asyncio has reaped it, a moment after the transport ends)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (left := open_descriptors() - before) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return left


async def run_to_exit(script: str, log: Path) -> StdioProcess:
    """Run `script` (Python) as a stdio server with its stderr logged at `log`, until it exits."""
    started: list[StdioProcess] = []
    async with stdio_transport(
        sys.executable,
        ("-c", script),
        server_environment({}),
        None,
        ledger=None,
        stderr_path=log,
        started=started,
    ):
        with anyio.fail_after(30):
            await started[0].liveness.dead.wait()
    return started[0]


async def test_a_servers_stderr_log_keeps_its_newest_part_and_the_crash_at_its_end(
    tmp_path: Path,
) -> None:
    """A server that writes three times the cap to stderr and then crashes: it is never held up
    (it exits by itself), its log stays within the cap, mode 0600, and keeps the last lines in
    order, the traceback at the end, after a first line saying that the start was dropped."""
    lines = 3 * MAX_STDERR_LOG_BYTES // 100
    script = (
        "import sys\n"
        f"for i in range({lines}): sys.stderr.write(f'line {{i:08d}} ' + 'x' * 86 + '\\n')\n"
        "raise RuntimeError('last words')\n"
    )
    log = tmp_path / "mcp" / "chatty.stderr.log"
    process = await run_to_exit(script, log)
    assert process.liveness.reason == "the server process exited with status 1"
    assert log.stat().st_size <= MAX_STDERR_LOG_BYTES
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    first, *kept = log.read_text().splitlines()
    assert first.startswith("[metis: ") and "earlier bytes of this run's stderr dropped" in first
    assert kept[-1] == "RuntimeError: last words"
    numbered = [int(line.split()[1]) for line in kept if line.startswith("line ")]
    assert numbered == list(range(numbered[0], lines)) and len(numbered) > 10_000


async def test_a_server_writing_stderr_without_end_leaves_no_task_or_descriptor_once_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log is read as long as the server writes; the stop ends the reading (the whole group
    wrote to the pipe: a child shell's `yes` too), closes the pipe and the file, and no task is
    left behind; so does a stop cut short.

    The group ignores SIGTERM, so the whole stop runs: both its graces are shortened to 0.5 s
    (2 s each, 4 s a stop), still longer than the 0.3 s after which the second stop is cut."""
    monkeypatch.setattr(transport, "EXIT_GRACE_SECONDS", 0.5)
    monkeypatch.setattr(transport, "KILL_GRACE_SECONDS", 0.5)
    log = tmp_path / "spam.stderr.log"
    before = open_descriptors()
    tasks_before = asyncio.all_tasks()
    for cut_short in (False, True):
        started: list[StdioProcess] = []
        task = asyncio.create_task(
            held_open("trap '' TERM; yes spam >&2", started, ledger=None, stderr_path=log)
        )
        while not started or log.stat().st_size < MAX_STDERR_LOG_BYTES // 2:
            await asyncio.sleep(0.05)
        task.cancel()
        if cut_short:
            await asyncio.sleep(0.3)
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert await gone(started[0].pid)
        assert 0 < log.stat().st_size <= MAX_STDERR_LOG_BYTES
    assert not await until_closed(before)
    assert asyncio.all_tasks() == tasks_before


def test_a_capped_log_cuts_at_a_line_and_counts_what_it_dropped(tmp_path: Path) -> None:
    """Past its cap the log keeps its newest half from the first whole line in it; the first
    line counts the bytes dropped, so the kept part plus those is all that was written."""
    log = CappedLog(tmp_path / "x.stderr.log", cap=1000)
    written = b"".join(f"{i:04d} ".encode() + b"y" * 25 + b"\n" for i in range(200))
    for start in range(0, len(written), 70):
        log.write(written[start : start + 70])
    log.close()
    head, _, rest = (tmp_path / "x.stderr.log").read_bytes().partition(b"\n")
    assert len(head) + 1 + len(rest) <= 1000
    dropped = int(head.split()[1].replace(b",", b""))
    assert written[:dropped] + rest == written
    assert rest.startswith(b"01") and rest.endswith(b"0199 " + b"y" * 25 + b"\n")
