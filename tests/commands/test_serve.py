"""`metis serve` as a user starts it, in a real subprocess on real loopback ports: a busy port,
a second daemon on one METIS_HOME (and the lock a kill -9 leaves), the store's file modes,
the start-up banner, `--home` and `--help`; `metis run` cut off by a daemon killed mid-turn;
and `metis chat` finding a daemon on a non-default port through METIS_PORT and through
config.yaml."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import stat
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.cli import main
from metis.commands.daemon_client import resolve_daemon
from metis.server.lock import LOCK_FILE, read_holder
from metis.testing import FakeProviderServer, FakeReply
from metis.testing.serving import SERVE_START_DEADLINE_S, free_port, wait_until_serving
from tests.api import Api, home_headers
from tests.cli import metis, start_metis
from tests.ws_client import SLOW_SCRIPTED, fake_models

Spawn = Callable[..., Any]


class Serve:
    """One `metis serve` subprocess: stdout piped (the banner), stderr in a file."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.out = ""

    async def banner(self) -> str:
        """Stdout up to the banner's last line (the daemon is healthy by then)."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(SERVE_START_DEADLINE_S):
            while "Next:" not in self.out:
                line = await self.proc.stdout.readline()
                if not line:
                    raise AssertionError(f"metis serve ended: {self.log.read_text()}")
                self.out += line.decode()
        return self.out

    async def finish(self, timeout: float = 60) -> tuple[int, str]:
        out, _ = await asyncio.wait_for(self.proc.communicate(), timeout)
        self.out += out.decode() if out else ""
        assert self.proc.returncode is not None
        return self.proc.returncode, self.log.read_text()


@pytest.fixture
async def serve(tmp_path: Path, metis_home: Path) -> AsyncIterator[Spawn]:
    """Factory: `metis serve ARGS` with METIS_HOME and `env` on top of the test's environment;
    still-running ones are stopped (SIGTERM) at teardown."""
    started: list[Serve] = []

    async def spawn(*args: str, env: dict[str, str] | None = None) -> Serve:
        log = tmp_path / f"serve-{len(started)}.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "metis.cli",
                "serve",
                *args,
                env={**os.environ, "METIS_HOME": str(metis_home), **(env or {})},
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                preexec_fn=lambda: os.umask(0o022),  # a usual umask: 0644 unless metis says so
            )
        started.append(Serve(proc, log))
        return started[-1]

    yield spawn
    for each in started:
        if each.proc.returncode is None:
            each.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(each.proc.communicate(), 60)


async def test_a_busy_port_exits_at_once_naming_the_address_and_how_to_choose_another(
    serve: Spawn, metis_home: Path
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, err = await (await serve("--port", str(port))).finish()
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err and "already in use" in err
    assert "--port" in err and "METIS_PORT" in err
    # stopped before the store was opened, or a key or workspace made for a daemon never run
    left = sorted(p.name for p in metis_home.iterdir()) if metis_home.exists() else []
    assert left in ([], [LOCK_FILE]), left


async def test_a_second_serve_on_the_same_home_exits_naming_the_running_daemon(
    serve: Spawn, metis_home: Path
) -> None:
    port = free_port()
    first = await serve("--port", str(port))
    await first.banner()
    url = f"http://127.0.0.1:{port}"
    assert read_holder(metis_home / LOCK_FILE) == (first.proc.pid, url)
    code, err = await (await serve("--port", "0")).finish()
    assert code == 1
    assert f"already running on {metis_home}: pid {first.proc.pid} at {url}" in err
    assert "stop it (`metis stop`)" in err
    assert first.proc.returncode is None  # the first one serves on, untouched
    async with (
        aiohttp.ClientSession(headers=resolve_daemon().headers()) as http,
        http.get(f"{url}/health") as response,
    ):
        assert response.status == 200


async def test_the_lock_of_a_daemon_killed_with_sigkill_does_not_block_a_start(
    serve: Spawn, metis_home: Path
) -> None:
    killed = await serve("--port", "0")
    await killed.banner()
    killed.proc.send_signal(signal.SIGKILL)
    await killed.finish()
    assert read_holder(metis_home / LOCK_FILE)[0] == killed.proc.pid  # left behind
    again = await serve("--port", "0")
    await again.banner()
    assert read_holder(metis_home / LOCK_FILE)[0] == again.proc.pid


async def test_clients_find_the_daemon_of_their_home_on_the_port_it_was_started_with(
    serve: Spawn, metis_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("METIS_PORT", raising=False)
    monkeypatch.delenv("METIS_HOST", raising=False)
    port = free_port()
    old_log = metis_home / "logs" / "daemon.log"  # left by a detached daemon an hour ago
    old_log.parent.mkdir(parents=True)
    old_log.write_text("earlier\n")
    os.utime(old_log, (time.time() - 3600,) * 2)
    running = await serve("--port", str(port))
    await running.banner()
    assert resolve_daemon().url == f"http://127.0.0.1:{port}"
    code, _, err = await metis("sessions", "list", env={"METIS_HOME": str(metis_home)})
    assert code == 0 and "no active sessions" in err, err
    code, out, err = await metis("status", env={"METIS_HOME": str(metis_home)})
    assert code == 0, err
    assert f"is running at http://127.0.0.1:{port} (pid {running.proc.pid}, up " in out
    assert f"  home:       {metis_home}" in out.splitlines()
    assert "  log:" not in out  # in the foreground it logs to its terminal
    assert resolve_daemon(port=8421).url == "http://127.0.0.1:8421"  # a named port is kept
    running.proc.send_signal(signal.SIGKILL)
    await running.finish()
    assert resolve_daemon().url == "http://127.0.0.1:8421"  # not the dead daemon's address
    code, out, _ = await metis("status", "--port", str(port), env={"METIS_HOME": str(metis_home)})
    assert code == 3 and out.startswith("metis is not running"), out


async def test_run_cut_off_by_a_killed_daemon_ends_its_line_and_names_the_session(
    serve: Spawn, metis_home: Path, workspace: Path
) -> None:
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "models.yaml").write_text(SLOW_SCRIPTED)
    port = free_port()
    running = await serve("--port", str(port))
    await running.banner()

    prompt = "cut me off " * 40  # seconds of streaming: both runs are mid-reply at the kill

    url = f"http://127.0.0.1:{port}"
    run_args = ("run", prompt, "--workspace", str(workspace), "--url", url)
    run, as_json = await start_metis(*run_args), await start_metis(*run_args, "--json")
    assert run.stdout is not None
    started = await asyncio.wait_for(run.stdout.read(1), 30)  # the reply is streaming
    async with aiohttp.ClientSession(headers=resolve_daemon().headers()) as http:
        async with asyncio.timeout(30):  # and the --json run's turn is running too
            while True:
                async with http.get(f"{url}/sessions") as response:
                    listed = (await response.json())["sessions"]
                if sum(bool(s.get("current_turn_id")) for s in listed) == 2:
                    break
                await asyncio.sleep(0.05)
    running.proc.send_signal(signal.SIGKILL)
    await running.finish()
    out, err = await asyncio.wait_for(run.communicate(), 30)
    json_out, _ = await asyncio.wait_for(as_json.communicate(), 30)
    result = json.loads(json_out)  # a script still gets its one JSON object
    assert as_json.returncode == 1 and result["status"] == "interrupted", result
    assert result["reason"] == "stream_closed" and result["cost_usd"] is None
    printed, said = (started + out).decode(), err.decode()
    assert run.returncode == 1, (printed, said)
    assert printed.endswith("\n") and prompt not in printed
    assert "the daemon's stream closed before the turn ended (session sess_" in said, said
    assert "`metis sessions show sess_" in said
    session_id = said.split("(session ")[1].split(";")[0]
    again = await serve("--port", str(port))  # its start fails the interrupted turn
    await again.banner()
    code, shown, err = await metis("sessions", "show", session_id, "--url", url)
    assert code == 0, err
    assert "turn 1: failed: metis stopped while this turn was running" in shown


async def test_config_yaml_sets_the_log_level_and_the_flag_overrides_it(
    serve: Spawn, metis_home: Path
) -> None:
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "config.yaml").write_text("log_level: WARNING\n")
    quiet = await serve("--port", "0")
    await quiet.banner()
    quiet.proc.send_signal(signal.SIGTERM)
    code, log = await quiet.finish()
    assert code == 0 and "level=INFO" not in log.split("API key created")[-1]
    chatty = await serve("--port", "0", "--log-level", "INFO")
    await chatty.banner()
    chatty.proc.send_signal(signal.SIGTERM)
    code, log = await chatty.finish()
    assert code == 0 and "level=INFO logger=metis.server.runner metis listening" in log
    # root reads a non-dumpable process's environment all the same: said once, as a warning
    assert log.count("level=WARNING logger=metis metis runs as root") == (os.geteuid() == 0)
    # each record's time says its zone: local, with its offset from UTC
    [listening] = [line for line in log.splitlines() if "metis listening" in line]
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"
    assert re.match(stamp + " level=INFO ", listening), listening
    (metis_home / "config.yaml").write_text("log_level: LOUD\n")
    code, err = await (await serve("--port", "0")).finish()
    assert code == 2 and "config.yaml:1: log_level:" in err


async def test_the_store_and_its_wal_and_shm_are_created_owner_only(
    serve: Spawn, metis_home: Path, workspace: Path
) -> None:
    port = free_port()
    await (await serve("--port", str(port))).banner()
    async with aiohttp.ClientSession(headers=resolve_daemon().headers()) as http:
        body = {"workspace_path": str(workspace)}
        async with http.post(f"http://127.0.0.1:{port}/sessions", json=body) as response:
            assert response.status == 201, await response.text()
    for name in ("metis.db", "metis.db-wal", "metis.db-shm"):
        mode = stat.S_IMODE((metis_home / name).stat().st_mode)
        assert mode == 0o600, f"{name} has mode {mode:o}"


async def test_serve_prints_its_url_home_models_and_next_step_once_healthy(
    serve: Spawn, metis_home: Path
) -> None:
    port = free_port()
    daemon = await serve("--port", str(port), env={"METIS_OFFLINE": "1"})
    out = await daemon.banner()
    url = f"http://127.0.0.1:{port}"
    async with (
        aiohttp.ClientSession(headers=resolve_daemon().headers()) as http,
        http.get(f"{url}/health") as response,
    ):
        assert response.status == 200  # healthy when the banner is out
    assert f"metis is serving at {url}\n" in out
    assert f"home:    {metis_home}\n" in out
    assert "models:  local:scripted (offline: METIS_OFFLINE=1)\n" in out
    key_file = metis_home / "api_key"  # the first start says where its key is, never the key
    assert f"API key: created in {key_file} (mode 0600)\n" in out
    assert key_file.read_text().strip() not in out
    assert "`metis chat`" in out
    assert "level=" not in out  # plain lines; the logs go to stderr
    [login] = [line.split()[1] for line in out.splitlines() if line.startswith("Dashboard: ")]
    assert login.startswith(f"{url}/login?token=")
    async with aiohttp.ClientSession() as browser:  # the printed link logs a browser in once
        async with browser.get(login, allow_redirects=False) as response:
            assert response.status == 303
            assert response.headers["Location"].startswith("/#login=")
        async with browser.get(login, allow_redirects=False) as response:
            assert response.status == 401


async def test_the_home_flag_overrides_metis_home(
    serve: Spawn, metis_home: Path, tmp_path: Path
) -> None:
    chosen = tmp_path / "chosen-home"
    out = await (await serve("--home", str(chosen), "--port", "0")).banner()
    assert f"home:    {chosen}\n" in out
    assert (chosen / "metis.db").exists() and (chosen / LOCK_FILE).exists()
    assert not (metis_home / "metis.db").exists()


async def test_a_turn_sent_as_soon_as_health_answers_waits_for_the_provider_sdk(
    serve: Spawn, metis_home: Path, workspace: Path
) -> None:
    """`/health` answers before the provider SDKs are imported (a thread imports them once
    the port is bound); a turn that arrives sooner waits for that import and completes."""
    async with FakeProviderServer() as fake:
        metis_home.mkdir(parents=True)
        (metis_home / "models.yaml").write_text(fake_models(fake))
        fake.enqueue("anthropic", FakeReply.say("first answer"))
        port = free_port()
        await serve("--port", str(port))
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(base_url=url) as http:
            await wait_until_serving(http, "/health")
            api = Api(http, home_headers(metis_home))
            sid = (await api.create_session(workspace))["id"]
            status, accepted = await api.submit(sid, "hello")
            assert status == 202, accepted
            ended = await api.wait_turn(sid, accepted["turn_id"], SERVE_START_DEADLINE_S)
            assert ended["type"] == "turn.completed", ended
            stored = (await api.messages(sid))["messages"]
            assert stored[-1]["role"] == "assistant"
            assert stored[-1]["content"] == [{"type": "text", "text": "first answer"}]


def test_serve_help_documents_the_home_and_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    for name in ("--home", "METIS_HOME", "METIS_PORT", "METIS_HOST", "METIS_API_KEY"):
        assert name in text, name
    # it fits an 80-column terminal: the paragraph wrapped, the environment's table as written
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert wide == [], wide
    assert "  METIS_OFFLINE  1 serves only the scripted model local:scripted\n" in text


async def chat_over_a_pipe(env: dict[str, str], workspace: Path) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metis.cli",
        "chat",
        str(workspace),
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(b"hello, daemon\n/quit\n"), 60)
    assert proc.returncode == 0, out.decode() + err.decode()
    return out.decode()


async def test_chat_finds_a_daemon_on_the_port_in_metis_port(
    serve: Spawn, metis_home: Path, workspace: Path
) -> None:
    port = str(free_port())
    await (await serve(env={"METIS_PORT": port})).banner()
    env = {**os.environ, "METIS_HOME": str(metis_home), "METIS_PORT": port}
    out = await chat_over_a_pipe(env, workspace)
    assert 'assistant> You said: "hello, daemon"' in out


async def test_chat_finds_a_daemon_on_the_port_in_config_yaml(
    serve: Spawn, metis_home: Path, workspace: Path
) -> None:
    metis_home.mkdir(parents=True)
    port = free_port()
    (metis_home / "config.yaml").write_text(f"port: {port}\n")
    out = await (await serve()).banner()
    assert f"127.0.0.1:{port}" in out
    env = {**os.environ, "METIS_HOME": str(metis_home)}
    out = await chat_over_a_pipe(env, workspace)
    assert 'assistant> You said: "hello, daemon"' in out
