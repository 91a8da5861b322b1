"""The shell in its bubblewrap sandbox, proved from inside real commands run by the pipeline.

Paths the sandbox must hide or protect live under /var/tmp: /tmp is replaced by a private
tmpfs in the sandbox, so anything under the pytest tmp_path is invisible there anyway and
would prove nothing. Pids written by a command are those of its own PID namespace; processes
are therefore found on the host by a unique token in their command line.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metis.core.tools.bwrap import ShellSandbox, detect
from tests.core.tools.conftest import Harness
from tests.shell_sandbox import require_bwrap


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A writable host folder outside /tmp, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="metis-sandbox-test-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_home(host_dir: Path) -> Path:
    home = host_dir / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE-KEY-MATERIAL\n")
    (home / ".netrc").write_text("machine example.com password NETRC-SECRET\n")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("aws_secret_access_key = AWS-SECRET\n")
    return home


@pytest.fixture
def metis_home(host_dir: Path) -> Path:
    home = host_dir / "metis-home"
    home.mkdir()
    (home / "config.yaml").write_text("# METIS-HOME-SECRET\n")
    return home


@pytest.fixture
def make_sandbox(fake_home: Path, metis_home: Path) -> Callable[..., ShellSandbox]:
    """The sandbox exactly as the daemon's start-up detection builds it."""
    require_bwrap()

    def make(network: bool = False) -> ShellSandbox:
        sandbox, why = detect(
            mode="auto",
            bwrap_path=None,
            network=network,
            metis_home=str(metis_home),
            homes=[str(fake_home)],
        )
        assert sandbox is not None, why
        return sandbox

    return make


@pytest.fixture
def boxed(make_harness: Callable[..., Harness], make_sandbox: Callable[..., ShellSandbox]) -> Any:
    def make(*, network: bool = False, root: Path | None = None) -> Harness:
        harness = make_harness(root=root)
        harness.executor.shell_sandbox = make_sandbox(network)
        return harness

    return make


async def run(harness: Harness, command: str) -> tuple[int | None, str]:
    call = await harness.call("shell", {"command": command})
    assert call.stage == "executed", call.text
    return call.outcome.exit_code, call.outcome.text


def host_processes_with(token: str) -> list[int]:
    """Host pids whose command line holds `token` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


async def none_left(token: str) -> bool:
    for _ in range(50):
        if not host_processes_with(token):
            return True
        await asyncio.sleep(0.02)
    return False


def unique_sleep() -> str:
    """A `sleep` argument no other process on the machine has."""
    return f"{3000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"


# --- filesystem ---------------------------------------------------------------------------


async def test_tmp_is_private(boxed: Any) -> None:
    name = f"metis-sandbox-{secrets.token_hex(8)}"
    code, text = await run(boxed(), f"touch /tmp/{name} && ls /tmp/{name}")
    assert code == 0, text
    assert not Path("/tmp", name).exists()


async def test_writing_outside_the_workspace_fails(boxed: Any, host_dir: Path) -> None:
    target = host_dir / "outside.txt"
    code, text = await run(boxed(), f"echo pwned > {target}")
    assert code != 0 and "Read-only file system" in text
    assert not target.exists()
    code, text = await run(boxed(), "touch /etc/metis-sandbox-probe; mkdir /opt/metis-probe")
    assert code != 0 and text.count("Read-only file system") == 2
    assert not Path("/etc/metis-sandbox-probe").exists()


async def test_credentials_in_the_home_cannot_be_read(boxed: Any, fake_home: Path) -> None:
    code, text = await run(
        boxed(),
        f"ls -A {fake_home}/.ssh {fake_home}/.aws; cat {fake_home}/.netrc; "
        f"cat {fake_home}/.aws/credentials; cat {fake_home}/.ssh/id_ed25519",
    )
    assert code != 0
    for secret in ("PRIVATE-KEY-MATERIAL", "NETRC-SECRET", "AWS-SECRET"):
        assert secret not in text
    assert f"{fake_home}/.ssh/id_ed25519: No such file or directory" in text  # an empty folder
    code, text = await run(boxed(), f"touch {fake_home}/.ssh/authorized_keys")
    assert code != 0 and not (fake_home / ".ssh" / "authorized_keys").exists()


async def test_metis_home_cannot_be_read(boxed: Any, metis_home: Path) -> None:
    code, text = await run(boxed(), f"ls -A {metis_home}; cat {metis_home}/config.yaml")
    assert code != 0
    assert "METIS-HOME-SECRET" not in text and "config.yaml:" in text


async def test_a_workspace_inside_a_hidden_folder_stays_visible(
    boxed: Any, fake_home: Path
) -> None:
    root = fake_home / ".ssh" / "project"
    root.mkdir()
    (root / "notes.txt").write_text("visible\n")
    code, text = await run(
        boxed(root=root), f"cat notes.txt && echo new > made.txt; cat {fake_home}/.ssh/id_ed25519"
    )
    assert "visible" in text and (root / "made.txt").read_text() == "new\n"
    assert code != 0 and "PRIVATE-KEY-MATERIAL" not in text


# --- processes and network ----------------------------------------------------------------


async def test_the_daemon_is_invisible_in_proc(boxed: Any) -> None:
    """The sandbox's /proc shows its own PID namespace: bwrap's init, the shell, its children."""
    me = os.getpid()
    my_cmdline = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    _, text = await run(
        boxed(),
        f"ls /proc/{me}; ls /proc | grep -c '^[0-9]*$'; "
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done",
    )
    assert f"ls: cannot access '/proc/{me}'" in text
    lines = text.splitlines()
    assert int(lines[2]) <= 5  # init, sh, ls/grep/tr: not the machine's processes
    assert my_cmdline not in text


async def test_network_is_cut_unless_configured(boxed: Any) -> None:
    accepted = 0

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = (
        'python3 -c \'import socket; socket.create_connection(("127.0.0.1", '
        f'{port}), timeout=3); print("connected")\''
    )
    try:
        code, text = await run(boxed(), probe)
        assert code != 0 and "connected" not in text and "ConnectionRefusedError" in text
        assert accepted == 0
        code, text = await run(boxed(network=True), probe)
        assert (code, text) == (0, "exit_code: 0\nconnected\n")
        assert accepted == 1
    finally:
        server.close()
        await server.wait_closed()


# --- normal work --------------------------------------------------------------------------


async def test_normal_work_runs_in_the_workspace(boxed: Any, workspace: Path) -> None:
    code, text = await run(
        boxed(),
        "echo hello > hello.txt && mkdir -p src && "
        'python3 -c \'import pathlib; pathlib.Path("src/gen.py").write_text("x = 1\\n")\' && '
        "mktemp && git init -q && git add -A && "
        "git -c user.name=Test -c user.email=test@example.com commit -qm first && "
        "git log --oneline | wc -l",
    )
    assert code == 0, text
    assert text.endswith("\n1\n")
    assert (workspace / "hello.txt").read_text() == "hello\n"
    assert (workspace / "src" / "gen.py").read_text() == "x = 1\n"
    assert (workspace / ".git" / "HEAD").exists()


async def test_the_environment_stays_scrubbed(boxed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-must-not-leak")
    code, text = await run(boxed(), "env")
    assert code == 0 and "sk-must-not-leak" not in text
    assert "TMPDIR=/tmp" in text and "METIS_SHELL_RUN=" in text


# --- the process-group containment still holds --------------------------------------------


async def test_sigterm_reaches_the_command_with_its_grace(boxed: Any, workspace: Path) -> None:
    """bwrap leads the group; were it sent SIGTERM, --die-with-parent would SIGKILL the command
    at once. The command gets SIGTERM and may finish its handler."""
    cancel = asyncio.Event()
    harness = boxed()
    command = "trap 'echo got TERM; exit 3' TERM; echo ready > ready; sleep 60 & wait"
    call = asyncio.create_task(harness.call("shell", {"command": command}, cancel_event=cancel))
    for _ in range(200):
        if (workspace / "ready").exists():
            break
        await asyncio.sleep(0.02)
    cancel.set()
    outcome = (await call).outcome
    assert outcome.error_class == "cancelled"
    assert "got TERM" in outcome.text


async def test_sigterm_ignored_gets_sigkill_after_the_grace(boxed: Any, workspace: Path) -> None:
    cancel = asyncio.Event()
    token = unique_sleep()
    command = f"trap '' TERM; sleep {token} & echo ready > ready; wait"
    call = asyncio.create_task(boxed().call("shell", {"command": command}, cancel_event=cancel))
    for _ in range(200):
        if (workspace / "ready").exists():
            break
        await asyncio.sleep(0.02)
    assert host_processes_with(token)
    started = time.monotonic()
    cancel.set()
    outcome = (await call).outcome
    assert outcome.error_class == "cancelled"
    assert 0.9 < time.monotonic() - started < 2.5  # the grace (1 s here), then SIGKILL
    assert await none_left(token)


async def test_nothing_outlives_the_call(boxed: Any) -> None:
    tokens = [unique_sleep() for _ in range(3)]
    command = (
        f"sleep {tokens[0]} >/dev/null 2>&1 & "
        f"setsid sleep {tokens[1]} >/dev/null 2>&1 & "
        f"setsid sh -c 'exec sleep {tokens[2]}' & echo done"
    )
    started = time.monotonic()
    code, text = await run(boxed(), command)
    assert code == 0 and "done" in text
    assert time.monotonic() - started < 3.0
    for token in tokens:
        assert await none_left(token), token


async def test_timeout_stops_the_sandbox(boxed: Any) -> None:
    token = unique_sleep()
    call = await boxed().call("shell", {"command": f"sleep {token}", "timeout_seconds": 1})
    assert call.outcome.error_class == "timeout"
    assert await none_left(token)
