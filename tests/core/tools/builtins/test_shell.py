"""The shell tool: environment, timeouts, process groups, output bounds."""

from __future__ import annotations

import asyncio
import dataclasses
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.config import Settings
from metis.core.errors import ConfigError
from metis.core.runtime import Core
from metis.core.tools.base import ToolLimits
from metis.core.tools.builtins.shell import OutputCapture, scrubbed_env
from metis.core.tools.settings import ToolsSettings, check_env_passthrough, limits_from_settings
from tests.processes import live_group_members

KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "METIS_API_KEY", "CUSTOM_PROVIDER_KEY")


async def shell(harness: Any, command: str, **input: Any) -> Any:
    call = await harness.call("shell", {"command": command, **input})
    assert call.stage == "executed", call.text
    return call.outcome


def alive(pid: int) -> bool:
    """Running or stopped; a zombie (exited, not yet reaped by init) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def survivors(pids: list[int]) -> list[int]:
    """Processes still alive once a SIGKILL sent before the call returned has had 1 s to land."""
    for _ in range(50):
        if not any(alive(pid) for pid in pids):
            return []
        await asyncio.sleep(0.02)
    return [pid for pid in pids if alive(pid)]


async def wait_for_lines(path: Path, count: int) -> list[str]:
    for _ in range(200):
        if path.exists() and len(lines := path.read_text().split()) >= count:
            return lines
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never got {count} lines")


async def test_environment_is_scrubbed(
    harness: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in KEYS:
        monkeypatch.setenv(key, f"sk-test-{key.lower()}-0123456789")
    monkeypatch.setenv("UNRELATED_DAEMON_SETTING", "x")
    monkeypatch.setenv("LC_TIME", "C")
    outcome = await shell(harness, "env")
    assert outcome.error_class is None and outcome.exit_code == 0
    names = {line.split("=", 1)[0] for line in outcome.text.split("\n")[1:] if "=" in line}
    assert not names & {*KEYS, "UNRELATED_DAEMON_SETTING"}
    assert "sk-test" not in outcome.text
    assert {"PATH", "LC_TIME", "PWD", "TERM", "PAGER", "GIT_PAGER", "NO_COLOR"} <= names
    assert f"PWD={workspace}" in outcome.text
    assert "GIT_TERMINAL_PROMPT=0" in outcome.text and "TERM=dumb" in outcome.text


def test_passthrough_never_carries_a_key() -> None:
    source = {"PATH": "/bin", "FOO": "1", "OPENAI_API_KEY": "k", "METIS_API_KEY": "k"}
    env = scrubbed_env("/ws", ["FOO", "OPENAI_API_KEY"], {"OPENAI_API_KEY"}, source)
    assert env["FOO"] == "1" and "OPENAI_API_KEY" not in env and "METIS_API_KEY" not in env
    settings = ToolsSettings.model_validate({"shell": {"env_passthrough": ["OPENAI_API_KEY"]}})
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        check_env_passthrough(settings, {"OPENAI_API_KEY"})
    check_env_passthrough(ToolsSettings(), {"OPENAI_API_KEY"})
    assert "OPENAI_API_KEY" in limits_from_settings(settings, {"OPENAI_API_KEY"}).forbidden_env


# A provider whose key variable looks like a locale setting, which the shell copies wholesale.
LC_KEY_MODELS = """\
schema_version: 1
pricing_version: "2026-05-08"
providers:
  custom: {adapter: openai, base_url: "http://127.0.0.1:9/v1", api_key_env: LC_PROVIDER_KEY}
models:
  - id: custom:m
    capabilities: {max_context_tokens: 8000, max_output_tokens: 1000}
    pricing: {input_per_mtok: "1", output_per_mtok: "1"}
"""


async def test_daemon_shell_never_passes_a_models_yaml_key(
    metis_home: Path,
    make_settings: Callable[..., Settings],
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The daemon's own wiring: every `api_key_env` of models.yaml is forbidden, even `LC_*`."""
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "models.yaml").write_text(LC_KEY_MODELS)
    monkeypatch.setenv("LC_PROVIDER_KEY", "lc-provider-secret-value")
    monkeypatch.setenv("LC_TIME", "C")
    core = Core(make_settings())
    entry = core.tool_registry.lookup("shell")
    assert entry is not None
    outcome = await core.dispatcher.executor.run(
        entry,
        entry.validate({"command": "env"}).value or {},
        sandbox=core.sandboxes.for_workspace(str(workspace)),
        tool_use_id="tu_env",
    )
    assert outcome.exit_code == 0 and "LC_TIME=C" in outcome.text
    assert "LC_PROVIDER_KEY" not in outcome.text
    assert "lc-provider-secret-value" not in outcome.text


def test_daemon_refuses_a_models_yaml_key_in_env_passthrough(
    metis_home: Path, make_settings: Callable[..., Settings]
) -> None:
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "models.yaml").write_text(LC_KEY_MODELS)
    settings = make_settings(tools={"shell": {"env_passthrough": ["LC_PROVIDER_KEY"]}})
    with pytest.raises(ConfigError, match="LC_PROVIDER_KEY"):
        Core(settings)


async def test_pwd_is_the_root_and_stdin_is_empty(harness: Any, workspace: Path) -> None:
    outcome = await shell(harness, "pwd")
    assert outcome.text == f"exit_code: 0\n{workspace}\n"
    started = time.monotonic()
    outcome = await shell(harness, "cat")
    assert outcome.text == "exit_code: 0\n(no output)"
    assert time.monotonic() - started < 2


async def test_non_zero_exit_is_a_completed_error(harness: Any) -> None:
    outcome = await shell(harness, "echo oops >&2; exit 3")
    assert (outcome.error_class, outcome.is_error, outcome.exit_code) == (None, True, 3)
    assert outcome.text == "exit_code: 3\noops\n"
    assert outcome.files_modified is None


async def test_timeout_keeps_earlier_output(harness: Any) -> None:
    started = time.monotonic()
    outcome = await shell(harness, "echo before; sleep 30", timeout_seconds=1)
    assert time.monotonic() - started < 2.5
    assert outcome.error_class == "timeout"
    assert outcome.text == "Timed out after 1 s.\nbefore\n"
    call = await harness.call("shell", {"command": "true", "timeout_seconds": 601})
    assert call.stage == "validate"
    assert call.errors == [{"path": "$.timeout_seconds", "message": "must be <= 600"}]


async def test_cancel_stops_every_process_of_the_group(harness: Any, workspace: Path) -> None:
    cancel = asyncio.Event()
    # "started" is written before the pids the test waits for: written after them, a cancel on
    # a loaded machine could come before the shell had run the echo
    command = "echo started; echo $$ > pids; sleep 300 & echo $! >> pids; sleep 300; wait"
    call = asyncio.create_task(harness.call("shell", {"command": command}, cancel_event=cancel))
    main_pid, background_pid = map(int, await wait_for_lines(workspace / "pids", 2))
    members = live_group_members(main_pid)
    assert {main_pid, background_pid} <= set(members) and len(members) >= 3
    started = time.monotonic()
    cancel.set()
    outcome = (await call).outcome
    assert time.monotonic() - started < 2
    assert outcome.error_class == "cancelled"
    assert outcome.text == "Tool call cancelled\nstarted\n"
    assert await survivors(members) == []


async def test_sigterm_ignored_gets_sigkill_after_the_grace(
    make_harness: Any, test_limits: Any, workspace: Path
) -> None:
    assert ToolLimits().shell_kill_grace_seconds == 5.0
    settings = ToolsSettings()
    harness = make_harness(settings)  # grace lowered to 1 s
    cancel = asyncio.Event()
    command = "trap '' TERM; echo $$ > pids; sleep 60 & echo $! >> pids; wait"
    call = asyncio.create_task(harness.call("shell", {"command": command}, cancel_event=cancel))
    pids = [int(p) for p in await wait_for_lines(workspace / "pids", 2)]
    started = time.monotonic()
    cancel.set()
    outcome = (await call).outcome
    elapsed = time.monotonic() - started
    assert outcome.error_class == "cancelled"
    assert 0.9 < elapsed < 2.5
    assert await survivors(pids) == []


async def test_background_job_holding_the_pipe_cannot_hang_the_call(
    make_harness: Any, test_limits: Any, workspace: Path
) -> None:
    settings = ToolsSettings()
    limits = dataclasses.replace(test_limits(settings), shell_pipe_wait_seconds=2.0)
    harness = make_harness(settings, limits=limits)
    started = time.monotonic()
    outcome = await shell(harness, "sleep 100 & echo $! > bg; echo quick")
    elapsed = time.monotonic() - started
    assert (outcome.error_class, outcome.exit_code) == (None, 0)
    assert outcome.text == "exit_code: 0\nquick\n"
    assert 1.8 < elapsed < 3.5
    assert await survivors([int((workspace / "bg").read_text())]) == []


async def test_background_job_without_the_pipe_does_not_outlive_the_call(
    harness: Any, workspace: Path
) -> None:
    started = time.monotonic()
    outcome = await shell(harness, "sleep 100 >/dev/null 2>&1 & echo $! > bg")
    assert time.monotonic() - started < 1.5
    assert outcome.text == "exit_code: 0\n(no output)"
    assert await survivors([int((workspace / "bg").read_text())]) == []


ESCAPE = "setsid sh -c 'echo $$ > escaped; exec sleep 100'"


async def test_a_process_that_left_the_group_does_not_outlive_the_call(
    harness: Any, workspace: Path
) -> None:
    """`setsid` takes a process out of the command's group (and session): the group kill
    misses it, the run marker in its environment does not."""
    started = time.monotonic()
    outcome = await shell(
        harness, f"{ESCAPE} >/dev/null 2>&1 &\nwhile [ ! -s escaped ]; do :; done"
    )
    assert time.monotonic() - started < 1.5
    assert outcome.exit_code == 0
    assert await survivors([int((workspace / "escaped").read_text())]) == []


async def test_a_process_that_left_the_group_holding_the_pipe_cannot_hang_the_call(
    harness: Any, workspace: Path
) -> None:
    started = time.monotonic()
    outcome = await shell(harness, f"{ESCAPE} &\nwhile [ ! -s escaped ]; do :; done; echo quick")
    assert time.monotonic() - started < 3.0  # pipe wait 0.5 s + grace 1 s, then the kill
    assert outcome.text == "exit_code: 0\nquick\n"
    assert await survivors([int((workspace / "escaped").read_text())]) == []


async def test_cancel_also_stops_a_process_that_left_the_group(
    harness: Any, workspace: Path
) -> None:
    cancel = asyncio.Event()
    command = f"{ESCAPE} & sleep 100"
    call = asyncio.create_task(harness.call("shell", {"command": command}, cancel_event=cancel))
    await wait_for_lines(workspace / "escaped", 1)
    cancel.set()
    assert (await call).outcome.error_class == "cancelled"
    assert await survivors([int((workspace / "escaped").read_text())]) == []


SEE_THE_REST = "to see them, send the output to a file and read it in parts"


async def test_cut_output_says_how_to_see_the_rest(harness: Any) -> None:
    """The model is told the middle of a long output is gone and how to get at it, not only
    how much is gone."""
    outcome = await shell(harness, "seq 1 200000")
    assert outcome.truncated
    assert f"bytes omitted; {SEE_THE_REST} …]\n" in outcome.text


async def test_huge_output_keeps_head_and_tail_within_the_cap(harness: Any) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcome = await shell(harness, "yes | head -c 100000000; echo; echo THE-END")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    text = outcome.text
    size = len(text.encode())
    assert size <= 256 * 1024
    assert outcome.error_class is None and outcome.exit_code == 0
    assert text.startswith("exit_code: 0\ny\ny\n")
    assert text.endswith("y\ny\n\nTHE-END\n")
    kept = 2 * limits_from_settings(ToolsSettings()).shell_head_bytes
    omitted = 100_000_000 + len("\nTHE-END\n") - kept
    assert f"\n[… {omitted} bytes omitted; {SEE_THE_REST} …]\n" in text
    assert outcome.truncated and outcome.output_bytes == size
    assert "[output truncated" not in text  # the shell's own bound already fits the cap
    assert grown_kib < 50 * 1024


def test_output_capture_bounds() -> None:
    capture = OutputCapture(4, 4)
    for chunk in (b"ab", b"cdef", b"ghij", b"kl"):
        capture.feed(chunk)
    assert (bytes(capture.head), bytes(capture.tail), capture.total) == (b"abcd", b"ijkl", 12)
    assert capture.text() == f"abcd\n[… 4 bytes omitted; {SEE_THE_REST} …]\nijkl"
    split = OutputCapture(3, 3)
    split.feed("éééü".encode())  # 8 bytes; both cuts fall inside a character
    assert split.text() == f"é\n[… 2 bytes omitted; {SEE_THE_REST} …]\nü"
    assert OutputCapture(4, 4).text() == "(no output)"


async def test_spawn_failure_is_a_tool_error(harness: Any) -> None:
    outcome = await shell(harness, "echo a\x00b")
    assert outcome.error_class == "tool_error"
    assert outcome.text.startswith("Could not start the shell:")
