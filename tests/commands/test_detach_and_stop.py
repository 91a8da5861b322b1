"""`metis serve --detach` and `metis stop` as a person runs them: real subprocesses on a home of
their own (offline scripted model), the daemon left running in the background between them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from metis.commands.detach import LOG_ROTATE_BYTES, DaemonLogHandler, open_daemon_log
from metis.server.lock import LOCK_FILE, is_held, read_holder
from tests.cli import metis, start_metis

BANNER = re.compile(
    r"metis is serving at (http://127\.0\.0\.1:\d+) in the background \(pid (\d+)\)"
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in (
        "METIS_API_KEY",
        "METIS_HOST",
        "METIS_PORT",
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("METIS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("METIS_OFFLINE", "1")
    return tmp_path / "home"


@pytest.fixture
async def detached(home: Path) -> AsyncIterator[tuple[str, int]]:
    """A daemon started with `metis serve --detach`: its URL and pid; killed if a test left it."""
    code, out, err = await metis("serve", "--detach", "--port", "0")
    assert code == 0, err
    found = BANNER.search(out)
    assert found, out
    assert out.splitlines()[1:4] == [
        f"  home:    {home}",
        "  models:  local:scripted (offline: METIS_OFFLINE=1)",
        f"  API key: created in {home / 'api_key'} (mode 0600)",  # where a script finds it
    ]
    assert out.splitlines()[4] == f"  log:     {home / 'logs' / 'daemon.log'}"
    try:
        yield found.group(1), int(found.group(2))
    finally:
        if is_held(home / LOCK_FILE):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(found.group(2)), signal.SIGKILL)


async def health(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as response:
        return response.status


async def test_a_detached_daemon_serves_until_metis_stop_stops_it(
    home: Path, detached: tuple[str, int]
) -> None:
    url, pid = detached
    assert await health(url) == 200  # listening before the command returned
    assert read_holder(home / LOCK_FILE) == (pid, url)
    code, out, err = await metis("status")
    assert code == 0, err
    assert f"is running at {url} (pid {pid}," in out
    log = home / "logs" / "daemon.log"
    assert out.splitlines()[1:3] == [f"  home:       {home}", f"  log:        {log}"]
    code, out, err = await metis("status", "--json")
    assert code == 0 and json.loads(out)["log"] == str(log), err
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    logged = log.read_text()
    assert f"metis listening on {url}" in logged and f"metis is serving at {url}" in logged
    assert "token=" not in logged and "`metis open` logs a browser in" in logged

    code, out, err = await metis("stop")
    assert code == 0, err
    assert out.strip() == f"metis stopped the daemon at {url} (pid {pid})"
    assert not is_held(home / LOCK_FILE)
    with pytest.raises(aiohttp.ClientConnectionError):
        await health(url)
    assert "signal received; shutting down" in log.read_text()
    code, out, err = await metis("stop")
    assert (code, out) == (3, "") and err.strip() == f"metis: no daemon is running on {home}"
    code, out, _ = await metis("status")
    assert code == 3 and f"The log of the daemon last started with --detach: {log}" in out
    code, out, _ = await metis("status", "--json")
    assert code == 3 and json.loads(out)["log"] == str(log)

    code, out, err = await metis("serve", "--detach", "--port", "0")  # the key file is kept
    assert code == 0 and "API key" not in out, err
    assert (await metis("stop"))[0] == 0


async def test_a_second_detach_on_the_same_home_names_the_daemon_running(
    home: Path, detached: tuple[str, int]
) -> None:
    url, pid = detached
    code, out, err = await metis("serve", "--detach", "--port", "0")
    assert (code, out) == (1, "")
    assert f"already running on {home}: pid {pid} at {url}" in err
    assert await health(url) == 200


async def test_a_daemon_that_cannot_start_shows_why_from_its_log(home: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out, err = await metis("serve", "--detach", "--port", str(port))
    assert (code, out) == (1, "")
    assert err.startswith("metis: the daemon did not start (exit status 1).\n")
    assert f"The end of its log, {home / 'logs' / 'daemon.log'}:" in err
    assert f"127.0.0.1:{port}" in err and "Traceback" not in err
    assert not is_held(home / LOCK_FILE)


async def test_a_bad_config_yaml_is_reported_on_the_terminal_and_nothing_starts(
    home: Path,
) -> None:
    home.mkdir(mode=0o700)
    (home / "config.yaml").write_text("limits:\n  max_concurrent_turns: many\n")
    code, out, err = await metis("serve", "--detach", "--port", "0")
    assert (code, out) == (2, "")
    assert "configuration error" in err and "max_concurrent_turns" in err
    assert not (home / "logs" / "daemon.log").exists()


async def test_a_bad_models_yaml_met_by_the_detached_daemon_is_a_configuration_error_too(
    home: Path,
) -> None:
    """models.yaml is read by the daemon itself: its exit status 2 is the command's, as for
    `metis serve` in the foreground."""
    home.mkdir(mode=0o700)
    (home / "models.yaml").write_text("models: [oops\n")
    code, out, err = await metis("serve", "--detach", "--port", "0")
    assert (code, out) == (2, ""), err
    assert err.startswith("metis: the daemon did not start (exit status 2).\n")
    assert "models.yaml" in err and "Traceback" not in err
    code, _, err = await metis("serve", "--port", "0")
    assert code == 2 and "models.yaml" in err
    assert not is_held(home / LOCK_FILE)


async def test_stop_never_signals_a_pid_a_lock_file_names_without_holding_the_lock(
    home: Path,
) -> None:
    bystander = await asyncio.create_subprocess_exec("sleep", "30")
    try:
        home.mkdir(mode=0o700)
        (home / LOCK_FILE).write_text(f'{{"pid": {bystander.pid}, "url": "http://127.0.0.1:9"}}\n')
        code, out, err = await metis("stop")
        assert (code, out) == (3, "") and "no daemon is running" in err
        assert bystander.returncode is None
        await asyncio.sleep(0.1)
        assert bystander.returncode is None  # still sleeping: no signal reached it
    finally:
        bystander.kill()
        await bystander.wait()
    code, _, err = await metis("stop", "--timeout", "soon")
    assert code == 2 and "not a number of seconds: 'soon'" in err


# A process that holds a home's lock as a daemon does, and says so of each SIGTERM, which it
# survives: a daemon slow to stop.
HOLDER = """
import fcntl, json, os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: print("TERM", flush=True))
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": os.getpid(), "url": None}).encode())
print("READY", flush=True)
while True:
    signal.pause()
"""


@pytest.fixture
async def slow_to_stop(home: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    home.mkdir(mode=0o700)
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, str(home / LOCK_FILE), stdout=asyncio.subprocess.PIPE
    )
    assert holder.stdout is not None
    try:
        assert (await holder.stdout.readline()).strip() == b"READY"
        yield holder
    finally:
        holder.kill()
        await holder.wait()


async def test_stop_waits_twice_the_configured_shutdown_grace(
    home: Path, slow_to_stop: asyncio.subprocess.Process
) -> None:
    """As long as the daemon may take: a daemon given a grace shorter or longer than the
    default is not waited for a minute, or called stuck (`kill -9` proposed) within it."""
    (home / "config.yaml").write_text("limits:\n  shutdown_grace_s: 0.75\n")
    code, out, err = await metis("stop")
    assert (code, out) == (1, "")
    assert f"(pid {slow_to_stop.pid}) is still stopping after 1.5 s;" in err, err


async def test_stop_gives_up_on_a_daemon_still_running_when_the_wait_ends(
    slow_to_stop: asyncio.subprocess.Process,
) -> None:
    pid = slow_to_stop.pid
    code, out, err = await metis("stop", "--timeout", "0.5")
    assert (code, out) == (1, "")
    assert f"(pid {pid}) is still stopping after 0.5 s; `kill -9 {pid}` ends it at once" in err
    assert slow_to_stop.stdout is not None
    assert (await slow_to_stop.stdout.readline()).strip() == b"TERM"
    assert slow_to_stop.returncode is None


async def test_ctrl_c_while_stop_waits_leaves_without_a_traceback(
    slow_to_stop: asyncio.subprocess.Process,
) -> None:
    stop = await start_metis("stop")
    assert slow_to_stop.stdout is not None
    assert (await slow_to_stop.stdout.readline()).strip() == b"TERM"  # stop is waiting now
    stop.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(stop.communicate(), 30)
    assert (stop.returncode, out) == (130, b"")
    assert err.decode().strip() == (
        f"metis: stopped waiting; the daemon (pid {slow_to_stop.pid}) was asked to stop and "
        "goes on stopping (`metis status` says when it is gone)"
    )


def test_a_log_past_its_limit_is_kept_as_one_generation_and_a_new_one_begun(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "daemon.log").write_text("older\n")
    os.truncate(logs / "daemon.log", LOG_ROTATE_BYTES + 1)
    (logs / "daemon.log.1").write_text("oldest\n")
    path, fd = open_daemon_log(tmp_path)
    os.close(fd)
    assert path == logs / "daemon.log" and path.stat().st_size == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    kept = logs / "daemon.log.1"
    assert kept.stat().st_size == LOG_ROTATE_BYTES + 1 and kept.read_bytes().startswith(b"older")
    path.write_text("a line\n")
    path.chmod(0o644)
    path, fd = open_daemon_log(tmp_path)  # under the limit: appended to, mode made 0600
    os.close(fd)
    assert path.read_text() == "a line\n" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_running_daemons_log_rotates_and_its_stdout_and_stderr_follow(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "daemon.log"
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # as the parent opens it
    handler = DaemonLogHandler(tmp_path, follow_fds=(out,))
    handler.maxBytes = 200  # the rotation's size, small enough for a test
    logger = logging.getLogger("metis.test.daemon_log")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        os.write(out, b"banner\n")
        for n in range(5):  # ~50 bytes each: the 4th goes past 200, and to a new file
            logger.warning("record %d %s", n, "x" * 40)
        os.write(out, b"after the rotation\n")
        assert "banner" in (tmp_path / "logs" / "daemon.log.1").read_text()
        for n in range(5, 8):  # a second rotation: the first generation is dropped
            logger.warning("record %d %s", n, "x" * 40)
    finally:
        logger.removeHandler(handler)
        handler.close()
        os.close(out)
    kept = (tmp_path / "logs" / "daemon.log.1").read_text()
    current = log.read_text()
    assert kept.startswith("record 3 ") and "after the rotation\nrecord 5 " in kept
    assert current.startswith("record 6 ") and "record 7 " in current
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
