"""Effective confirmation mode, as pure unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metis.core.canonical.tools import SideEffects
from metis.core.tools.policy import ModeResolution, SurfaceToolPolicy, resolve_mode
from metis.core.tools.settings import ConfirmationSettings, ToolsSettings


def mode(
    tool: str,
    side_effects: SideEffects,
    *,
    config: dict[str, Any] | None = None,
    workspace: str = "/work/project",
    surface: SurfaceToolPolicy | None = None,
    remembered: dict[str, Any] | None = None,
) -> ModeResolution:
    confirmation = ConfirmationSettings.model_validate(config or {})
    return resolve_mode(
        tool_name=tool,
        side_effects=side_effects,
        workspace=workspace,
        confirmation=confirmation,
        trusted_roots=confirmation.resolved_trusted_workspaces(),
        surface=surface,
        remembered=remembered,
    )


def test_class_defaults() -> None:
    assert mode("read_file", "read").action == "run"
    assert mode("list_dir", "read").action == "run"
    assert mode("write_file", "write").action == "ask"
    assert mode("shell", "execute").action == "ask"
    assert mode("fetch", "network").action == "ask"
    assert mode("noop", "none").action == "run"


def test_deny_is_policy_denied_without_asking() -> None:
    denied = mode("shell", "execute", config={"per_tool": {"shell": "deny"}})
    assert (denied.action, denied.source) == ("policy_denied", "per_tool")
    by_class = mode("shell", "execute", config={"default": {"execute": "deny"}})
    assert by_class.action == "policy_denied"


def test_per_tool_beats_the_class_default() -> None:
    config = {"per_tool": {"write_file": "auto"}}
    assert mode("write_file", "write", config=config).action == "run"
    assert mode("patch_file", "write", config=config).action == "ask"
    assert mode("read_file", "read", config={"per_tool": {"read_file": "prompt"}}).action == "ask"


def test_class_missing_from_a_user_default_prompts() -> None:
    assert mode("read_file", "read", config={"default": {"write": "auto"}}).action == "ask"


def test_trusted_workspace_runs_writes_but_still_asks_for_the_shell(tmp_path: Path) -> None:
    trusted = tmp_path / "code"
    project = trusted / "metis"
    project.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(trusted)
    for entry in (str(trusted), str(link), str(trusted) + "/"):
        config = {"trusted_workspaces": [entry]}
        write = mode("write_file", "write", config=config, workspace=str(project))
        assert (write.action, write.source) == ("run", "trusted_workspace")
        assert mode("shell", "execute", config=config, workspace=str(project)).action == "ask"
        assert mode("write_file", "write", config=config, workspace=str(trusted)).action == "run"
    sibling = tmp_path / "code-other"
    config = {"trusted_workspaces": [str(trusted)]}
    assert mode("write_file", "write", config=config, workspace=str(sibling)).action == "ask"
    opted_in = {
        "trusted_workspaces": [str(trusted)],
        "trusted_workspace_modes": {"execute": "auto"},
    }
    assert mode("shell", "execute", config=opted_in, workspace=str(project)).action == "run"


def test_trusted_workspace_entries_expand_the_home(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "code").mkdir()
    config = {"trusted_workspaces": ["~/code"]}
    assert mode("write_file", "write", config=config, workspace=str(tmp_path / "code")).action == (
        "run"
    )


def test_remembered_decisions_answer_without_asking() -> None:
    once = mode("shell", "execute", config={"per_tool": {"shell": "prompt_once"}})
    assert once.action == "ask"
    assert once.remembers("once") and once.remembers("session")
    prompt = mode("shell", "execute")
    assert not prompt.remembers("once") and prompt.remembers("session")
    # The dispatcher passes what the confirmations table holds (also after a restart).
    for config in ({}, {"per_tool": {"shell": "prompt_once"}}):
        allowed = mode("shell", "execute", config=config, remembered={"shell": "allow"})
        assert (allowed.action, allowed.remembered) == ("run", "allow")
        denied = mode("shell", "execute", config=config, remembered={"shell": "deny"})
        assert denied.action == "user_denied"
        other = mode("write_file", "write", config=config, remembered={"shell": "allow"})
        assert other.action == "ask"


def test_surface_modes_never_lift_a_configured_deny() -> None:
    auto = SurfaceToolPolicy(modes={"shell": "auto", "write_file": "auto", "read_file": "prompt"})
    assert mode("shell", "execute", surface=auto).action == "run"
    assert mode("shell", "execute", surface=auto).source == "surface"
    assert mode("read_file", "read", surface=auto).action == "ask"
    config = {"per_tool": {"shell": "deny"}, "default": {"write": "deny"}}
    assert mode("shell", "execute", config=config, surface=auto).action == "policy_denied"
    assert mode("write_file", "write", config=config, surface=auto).action == "policy_denied"
    remembered = {"shell": "allow"}
    assert (
        mode("shell", "execute", config=config, surface=auto, remembered=remembered).action
        == "policy_denied"
    )


def test_default_settings_are_the_contract_defaults() -> None:
    confirmation = ToolsSettings().confirmation
    assert confirmation.default == {
        "none": "auto",
        "read": "auto",
        "write": "prompt",
        "execute": "prompt",
        "network": "prompt",
    }
    assert confirmation.per_tool == {}
    assert confirmation.trusted_workspaces == ()
    assert confirmation.trusted_workspace_modes == {"write": "auto"}
    assert confirmation.timeout_seconds == 300


def test_always_ask_overrides_auto_and_remembered_allow_but_not_deny() -> None:
    def asked(config: dict[str, Any], remembered: dict[str, Any] | None = None) -> str:
        confirmation = ConfirmationSettings.model_validate(config)
        return resolve_mode(
            tool_name="shell",
            side_effects="execute",
            workspace="/work/project",
            confirmation=confirmation,
            trusted_roots=confirmation.resolved_trusted_workspaces(),
            surface=SurfaceToolPolicy(modes={"shell": "auto"}),
            remembered=remembered,
            always_ask=True,
        ).action

    assert asked({"default": {"execute": "auto"}}) == "ask"
    assert asked({"per_tool": {"shell": "auto"}}, {"shell": "allow"}) == "ask"
    assert asked({}, {"shell": "deny"}) == "user_denied"
    assert asked({"per_tool": {"shell": "deny"}}) == "policy_denied"
