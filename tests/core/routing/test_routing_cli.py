"""`metis models`, `metis models check` and `metis routing check` (exit codes and output)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from metis.commands import models as models_command
from metis.commands import routing as routing_command
from metis.config import SHIPPED_CONFIG_DIR
from tests.core.routing.routing_kit import MODELS_YAML


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="metis")
    commands = parser.add_subparsers()
    models_command.register(commands)
    routing_command.register(commands)
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("METIS_HOME", str(home))
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OLLAMA_KEY", "METIS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    return home


def test_models_lists_the_shipped_registry_with_key_status(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    assert run("models") == 0
    out = capsys.readouterr().out
    assert "anthropic:claude-haiku-4-5" in out and "configured" in out
    assert "no key (OPENAI_API_KEY unset)" in out
    assert "local:scripted" in out and "offline mode: off" in out
    assert "sk-ant-test" not in out


def test_models_check_reports_every_error_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        MODELS_YAML.replace("tier: deep", "tier: deeep").replace(
            "aliases: [mini]", "aliases: [haiku]"
        )
    )
    assert run("models", "check", str(path)) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{path}:14:5: error: models[1].tier: 'deeep' is not one of")
    assert err[1].startswith(
        f"{path}:28:15: error: models[4].aliases[0]: alias 'haiku' is already used"
    )
    assert run("models", "check", str(SHIPPED_CONFIG_DIR / "models.yaml")) == 0


def test_models_in_metis_home_take_precedence(
    isolated_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (isolated_home / "models.yaml").write_text(MODELS_YAML)
    assert run("models") == 0
    assert "ollama:small:3b" in capsys.readouterr().out


def test_routing_check_prints_positions_and_exits_non_zero_on_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(MODELS_YAML)
    policy = tmp_path / "routing.yaml"
    policy.write_text(
        "schema_version: 1\nglobal_default: nonexistent:model\nrules:\n  - {when: {}, use: small}\n"
    )
    assert run("routing", "check", str(policy), "--models", str(models)) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"{policy}:2:1: error: global_default references unknown model: nonexistent:model [unknown_model]"
    )
    assert "INVALID (1 error, " in lines[-1]


def test_routing_check_passes_a_valid_file_with_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLLAMA_KEY", "x")
    models = tmp_path / "models.yaml"
    models.write_text(MODELS_YAML)
    policy = tmp_path / "routing.yaml"
    policy.write_text("rules:\n  - {when: {}, use: small}\n")
    assert run("routing", "check", str(policy), "--models", str(models)) == 0
    out = capsys.readouterr().out
    assert "warning: rules[0].use references ollama:small:3b, which does not support tools" in out
    assert "valid (0 errors, 1 warning)" in out


def test_routing_check_defaults_to_the_policy_the_daemon_would_load(
    isolated_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("routing", "check") == 0
    assert f"{SHIPPED_CONFIG_DIR / 'routing.yaml'}: valid" in capsys.readouterr().out
    (isolated_home / "routing.yaml").write_text("rules: 3\n")
    assert run("routing", "check") == 1
    assert str(isolated_home / "routing.yaml") in capsys.readouterr().out


def test_routing_check_with_a_broken_registry_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text("providers: {}\n")
    assert run("routing", "check", "--models", str(models)) == 2
    assert "missing required key 'pricing_version'" in capsys.readouterr().err
