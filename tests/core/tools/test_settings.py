"""The `tools` section of config.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from metis.config import load_settings
from metis.core.errors import ConfigError
from metis.core.tools.settings import (
    BUILTIN_TOOL_NAMES,
    ToolsSettings,
    check_env_passthrough,
    limits_from_settings,
)


def test_defaults() -> None:
    settings = ToolsSettings()
    assert settings.enabled == BUILTIN_TOOL_NAMES
    assert (settings.max_concurrent_per_session, settings.max_concurrent_global) == (4, 16)
    assert settings.timeouts.per_tool == {}
    assert settings.abandon_after_seconds == 30
    assert (settings.max_result_bytes, settings.max_write_bytes) == (256 * 1024, 5 * 1024 * 1024)
    shell = settings.shell
    assert (shell.default_timeout_seconds, shell.max_timeout_seconds) == (120, 600)
    assert shell.env_passthrough == ()
    assert settings.sandbox.protected_dirs == (".git",)
    limits = limits_from_settings(settings)
    assert limits.forbidden_env == {"METIS_API_KEY"}
    assert limits.shell_kill_grace_seconds == 5.0 and limits.shell_pipe_wait_seconds == 2.0
    assert 127 * 1024 < limits.shell_head_bytes <= 128 * 1024


def test_partial_per_class_overrides_keep_the_other_defaults() -> None:
    settings = ToolsSettings.model_validate({"timeouts": {"per_class": {"execute": 100}}})
    assert settings.timeouts.per_class["execute"] == 100
    assert settings.timeouts.per_class["read"] == 60


def test_sandbox_off_written_unquoted_is_off(tmp_path: Path) -> None:
    """YAML reads a bare `off` as false; the user wrote the word the docs show."""
    home = tmp_path / "h"
    home.mkdir()
    (home / "config.yaml").write_text("tools:\n  shell:\n    sandbox: off\n")
    assert load_settings(home=home).file.tools.shell.sandbox == "off"
    (home / "config.yaml").write_text("tools:\n  shell:\n    sandbox: true\n")
    with pytest.raises(ConfigError, match=r"tools\.shell\.sandbox"):
        load_settings(home=home)


@pytest.mark.parametrize(
    "raw",
    [
        {"unknown": 1},
        {"confirmation": {"default": {"filesystem": "auto"}}},
        {"confirmation": {"default": {"write": "sometimes"}}},
        {"confirmation": {"per_tool": {"shell": "always"}}},
        {"confirmation": {"per_tool": {"Bad-Name": "auto"}}},
        {"confirmation": {"trusted_workspace_modes": {"disk": "auto"}}},
        {"confirmation": {"timeout_seconds": 0}},
        {"confirmation": {"timeout_seconds": 3601}},
        {"confirmation": {"prompt": "auto"}},
        {"timeouts": {"per_class": {"disk": 5}}},
        {"timeouts": {"per_class": {"read": 0}}},
        {"timeouts": {"per_tool": {"shell": -1}}},
        {"timeouts": {"abandon_after_seconds": 5}},
        {"max_concurrent_per_session": 17},
        {"max_concurrent_per_session": 0},
        {"shell": {"env_passthrough": ["METIS_API_KEY"]}},
        {"shell": {"env_passthrough": ["NOT VALID"]}},
        {"shell": {"default_timeout_seconds": 700}},
        {"sandbox": {"protected_dirs": ["a/b"]}},
        {"enabled": ["shell", "shell"]},
        {"enabled": ["Shell"]},
    ],
)
def test_invalid_settings_are_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ToolsSettings.model_validate(raw)


def test_a_provider_key_in_the_shell_passthrough_is_refused_naming_the_file_and_the_fix() -> None:
    settings = ToolsSettings.model_validate({"shell": {"env_passthrough": ["PATH_EXTRA", "K"]}})
    check_env_passthrough(settings, ["OTHER"])  # no key named: accepted
    with pytest.raises(ConfigError) as refused:
        check_env_passthrough(settings, ["K"])
    assert refused.value.message == (
        "config.yaml tools.shell.env_passthrough: K holds an API key and is never passed to "
        "commands; remove it from the list"
    )
