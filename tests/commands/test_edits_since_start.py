"""config.yaml and models.yaml are read once, when the daemon starts. An edit made while it
runs changes nothing until it restarts: `metis status` and `metis models` say so (and what is
wrong with a models.yaml the next start would refuse), rather than show the daemon's state as
if the edit were in force."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.commands.since_start import changed_since_start
from tests.cli import metis
from tests.helpers import named_by_home_lock

MODELS = """
pricing_version: "test"
providers:
  local: {adapter: scripted}
models:
  - id: local:scripted
"""
MORE_MODELS = MODELS + "    aliases: [echo]\n"
BROKEN = MODELS + "  - id: nothing:\n    bogus: 1\n"


async def test_status_names_the_files_edited_since_the_start_and_a_broken_models_yaml(
    start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    d = await start_daemon(models=MODELS, config="log_level: INFO\n")
    with named_by_home_lock(metis_home, d.base_url):
        code, out, err = await metis("status", "--json")
        assert code == 0, err
        said = json.loads(out)
        assert (said["changed_since_start"], said["models_error"]) == ([], None), said

        (metis_home / "models.yaml").write_text(MORE_MODELS)
        (metis_home / "config.yaml").write_text("log_level: DEBUG\n")
        code, out, err = await metis("status", "--json")
        assert code == 0, err
        said = json.loads(out)
        assert said["changed_since_start"] == ["config.yaml", "models.yaml"], said
        assert said["models_error"] is None
        code, shown, err = await metis("status")
        assert code == 0, err
        assert (
            "  restart:    config.yaml, models.yaml changed since the daemon started; they "
            "apply when it restarts" in " ".join(shown.split("\n"))
        ), shown

        (metis_home / "models.yaml").write_text(BROKEN)
        code, out, err = await metis("status", "--json")
        said = json.loads(out)
        assert said["models_error"].startswith(f"{metis_home / 'models.yaml'}:7"), said
        code, shown, err = await metis("status")
        assert "(the next start refuses it)" in shown, shown


async def test_models_says_the_list_is_the_registry_loaded_before_an_edit(
    start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    d = await start_daemon(models=MODELS)
    with named_by_home_lock(metis_home, d.base_url):
        code, shown, err = await metis("models")
        assert code == 0, err
        assert "changed since" not in shown
        (metis_home / "models.yaml").write_text(MORE_MODELS)
        code, shown, err = await metis("models")
    assert code == 0, err
    assert "echo" not in shown  # the daemon's registry, as it was loaded
    assert (
        f"{metis_home / 'models.yaml'} changed since the daemon started: it applies when the "
        "daemon restarts (`metis models --models FILE` lists the file)" in shown
    ), shown


async def test_routing_check_by_the_daemon_says_its_models_predate_an_edit(
    start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    """A rule naming a model just added to models.yaml is unknown to the running daemon,
    which checks the policy: the check says why the model is missing."""
    d = await start_daemon(models=MODELS)
    (metis_home / "models.yaml").write_text(MORE_MODELS)
    policy = metis_home / "next-routing.yaml"
    policy.write_text("schema_version: 1\nglobal_default: echo\n")
    with named_by_home_lock(metis_home, d.base_url):
        code, shown, err = await metis("routing", "check", str(policy))
    assert code == 1, err
    assert "unknown model" in shown, shown
    assert (
        f"checked by the daemon at {d.base_url}, against its models and provider keys (the "
        f"models it loaded when it started: {metis_home / 'models.yaml'} changed since, and "
        "applies when it restarts)" in shown
    ), shown


async def _changed(metis_home: Path, url: str) -> list[str]:
    """`metis status --json`'s files edited since the start, asked of the home's daemon."""
    with named_by_home_lock(metis_home, url):
        code, out, err = await metis("status", "--json")
    assert code == 0, err
    changed: list[str] = json.loads(out)["changed_since_start"]
    return changed


async def test_a_save_that_changes_nothing_is_not_an_edit(
    start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    """An editor's `:w` or a `touch` writes the file (a newer change time) with the bytes the
    daemon read: nothing waits for a restart, and nothing says so."""
    d = await start_daemon(models=MODELS, config="log_level: INFO\n")
    later = time.time() + 60
    for name, text in (("models.yaml", MODELS), ("config.yaml", "log_level: INFO\n")):
        (metis_home / name).write_text(text)
        os.utime(metis_home / name, (later, later))
    assert await _changed(metis_home, d.base_url) == []
    with named_by_home_lock(metis_home, d.base_url):
        code, shown, err = await metis("models")
    assert code == 0, err
    assert "changed since" not in shown, shown


async def test_a_file_deleted_or_created_since_the_start_is_an_edit(
    start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    """The daemon started with a models.yaml and no config.yaml: removing the one and writing
    the other both change what the next start reads."""
    d = await start_daemon(models=MODELS)
    assert not (metis_home / "config.yaml").exists()
    (metis_home / "models.yaml").unlink()
    (metis_home / "config.yaml").write_text("log_level: DEBUG\n")
    assert await _changed(metis_home, d.base_url) == ["config.yaml", "models.yaml"]


async def test_a_file_that_cannot_be_read_now_is_an_edit(
    start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    """What cannot be read cannot be shown to be what the daemon read (and the next start
    refuses it)."""
    d = await start_daemon(models=MODELS)
    (metis_home / "models.yaml").unlink()
    (metis_home / "models.yaml").mkdir()  # read as a file: an error, even for root
    assert await _changed(metis_home, d.base_url) == ["models.yaml"]


def test_a_daemon_that_does_not_say_what_it_read_is_never_said_edited_under(
    tmp_path: Path,
) -> None:
    """A daemon older than the command (no `start_up_files`), or one that names no file:
    nothing is claimed either way."""
    (tmp_path / "models.yaml").write_text(MODELS)
    assert changed_since_start(tmp_path, None) == []
    assert changed_since_start(tmp_path, {}) == []
    assert changed_since_start(tmp_path, {"models.yaml": None}) == ["models.yaml"]
