"""`metis routing check` asks the daemon running on the home, whose provider keys decide which
models turns can use, not the shell's. The real `metis` in a subprocess; the daemon is real, in
the test's process, holding its home's lock as `metis serve` does."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from metis.server.runner import Daemon
from tests.cli import metis
from tests.helpers import named_by_home_lock

MODELS = """\
pricing_version: "t-1"
providers:
  anthropic: {adapter: anthropic, api_key_env: REV_ANTH_KEY}
models:
  - id: anthropic:claude-sonnet-4-6
    aliases: [sonnet]
    capabilities: {max_context_tokens: 200000, max_output_tokens: 8192}
    pricing: {input_per_mtok: "3", output_per_mtok: "15"}
"""
ROUTING = "schema_version: 1\nglobal_default: sonnet\n"
NOT_CONFIGURED = "global_default references anthropic:claude-sonnet-4-6, which is not configured"


@pytest.fixture
async def keyed_daemon(
    start_daemon: Callable[..., Any], metis_home: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Daemon]:
    """A daemon started with the Anthropic key, named by its home's lock; the key is then gone
    from this process's environment, and so from the shell the command runs in."""
    monkeypatch.setenv("REV_ANTH_KEY", "sk-ant-test")
    daemon = await start_daemon(models=MODELS, routing=ROUTING)
    monkeypatch.delenv("REV_ANTH_KEY")
    with named_by_home_lock(metis_home, daemon.base_url):
        yield daemon


async def test_the_daemon_checks_the_file_against_its_own_keys(
    keyed_daemon: Daemon, metis_home: Path
) -> None:
    code, out, err = await metis("routing", "check", "--home", str(metis_home))
    assert code == 0, err
    assert NOT_CONFIGURED not in out
    checked, verdict = out.splitlines()[-2:]
    assert checked == (
        f"checked by the daemon at {keyed_daemon.base_url}, against its models and provider keys"
    )
    assert verdict.startswith(f"{metis_home / 'routing.yaml'}: valid (0 errors, 0 warnings); ")
    # a FILE is sent as text: its errors keep their file and line
    other = metis_home / "other.yaml"
    other.write_text("schema_version: 1\nglobal_default: nowhere:model\n")
    code, out, _ = await metis("routing", "check", str(other), "--home", str(metis_home))
    assert code == 1
    assert out.startswith(f"{other}:2:1: error: global_default references unknown model")


async def test_without_a_daemon_the_shell_s_keys_are_named_as_the_basis(
    metis_home: Path,
) -> None:
    metis_home.mkdir()
    (metis_home / "models.yaml").write_text(MODELS)
    (metis_home / "routing.yaml").write_text(ROUTING)
    code, out, err = await metis("routing", "check", "--home", str(metis_home))
    assert code == 0, err
    lines = out.splitlines()
    assert NOT_CONFIGURED in lines[0]
    assert lines[1] == (
        f"checked against {metis_home / 'models.yaml'} with the provider keys this shell has "
        f"(no daemon runs on {metis_home}; a daemon's keys may differ)"
    )


async def test_a_daemon_that_does_not_check_it_is_named_beside_the_shell_s_check(
    keyed_daemon: Daemon, metis_home: Path
) -> None:
    code, out, _ = await metis(
        "routing", "check", "--home", str(metis_home), env={"METIS_API_KEY": "not-its-key"}
    )
    assert code == 0
    assert NOT_CONFIGURED in out
    assert f"with the provider keys this shell has (the daemon at {keyed_daemon.base_url} " in out
    assert "did not check it: unauthorized" in out


async def test_a_file_that_cannot_be_read_is_said_alone_whatever_the_models_and_keys(
    keyed_daemon: Daemon, metis_home: Path
) -> None:
    """A missing file or one that is not UTF-8 has the same problem for every models.yaml and
    every key: no line on what it was checked against, and a broken models.yaml hides it not."""
    missing = metis_home / "nope.yaml"
    code, out, err = await metis("routing", "check", str(missing), "--home", str(metis_home))
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        f"{missing}: error: cannot read {missing}: No such file or directory [unreadable]",
        f"{missing}: INVALID (1 error, 0 warnings)",
    ]
    latin1 = metis_home / "latin1.yaml"
    latin1.write_bytes(b"global_default: caf\xe9\n")
    (metis_home / "models.yaml").write_text("pricing_version: 5\n")  # broken since the start
    code, out, _ = await metis("routing", "check", str(latin1), "--home", str(metis_home))
    assert code == 1
    [error, verdict] = out.splitlines()
    assert error.startswith(f"{latin1}:") and error.endswith("[not_utf8]")
    assert verdict == f"{latin1}: INVALID (1 error, 0 warnings)"
