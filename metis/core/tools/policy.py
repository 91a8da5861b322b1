"""Effective confirmation mode of a tool for one session. Pure.

The configured mode comes from `config.yaml` only (never from a workspace file, so a
workspace cannot trust itself). A surface may ask for `auto` or `prompt` per tool, but never
lifts a configured `deny`. A remembered session decision then answers without asking, except
that a call made with `always_ask` (the shell without its sandbox) is asked every time: only
a `deny`, configured or remembered, answers it without a question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from metis.core.canonical.tools import SideEffects
from metis.core.tools.sandbox import is_within
from metis.core.tools.settings import ConfirmationSettings, Mode

SurfaceMode = Literal["auto", "prompt"]
Decision = Literal["allow", "deny"]
Scope = Literal["once", "session"]
Action = Literal["run", "ask", "policy_denied", "user_denied"]
Source = Literal["surface", "per_tool", "trusted_workspace", "default"]


@dataclass(frozen=True)
class SurfaceToolPolicy:
    """A surface's narrowing for one session: `enabled=None` keeps every configured tool."""

    enabled: frozenset[str] | None = None
    modes: Mapping[str, SurfaceMode] = field(default_factory=dict)

    def allows(self, name: str) -> bool:
        return self.enabled is None or name in self.enabled


@dataclass(frozen=True)
class ModeResolution:
    """What step 4 of the pipeline does with one tool use.

    `action`: `run` (no confirmation), `ask` (the broker asks), `policy_denied`
    (`tool.failed{policy_denied}`, no confirmation events) or `user_denied` (a remembered
    deny; `tool.failed{user_denied}`). `mode` is the mode before remembered decisions.
    """

    action: Action
    mode: Mode
    source: Source
    remembered: Decision | None = None

    def remembers(self, scope: Scope) -> bool:
        """Whether an answer given with `scope` is stored for the rest of the session."""
        return self.mode == "prompt_once" or scope == "session"


def configured_mode(
    tool_name: str,
    side_effects: SideEffects,
    workspace: str,
    confirmation: ConfirmationSettings,
    trusted_roots: Sequence[str],
    configured: Mode | None = None,
) -> tuple[Mode, Source]:
    """Per-tool, trusted-workspace and default rules; `workspace` and `trusted_roots` are resolved (realpath) paths.

    `configured` is the mode the tool's source sets for it (an MCP server's `policy`): a
    per-tool rule of its own, below `tools.confirmation.per_tool`."""
    if tool_name in confirmation.per_tool:
        return confirmation.per_tool[tool_name], "per_tool"
    if configured is not None:
        return configured, "per_tool"
    if side_effects in confirmation.trusted_workspace_modes and any(
        is_within(root, workspace) for root in trusted_roots
    ):
        return confirmation.trusted_workspace_modes[side_effects], "trusted_workspace"
    return confirmation.default.get(side_effects, "prompt"), "default"


def resolve_mode(
    *,
    tool_name: str,
    side_effects: SideEffects,
    workspace: str,
    confirmation: ConfirmationSettings,
    trusted_roots: Sequence[str],
    surface: SurfaceToolPolicy | None = None,
    remembered: Mapping[str, Decision] | None = None,
    always_ask: bool = False,
    configured: Mode | None = None,
) -> ModeResolution:
    """The effective mode for (session workspace, tool, surface policy, remembered decisions).

    `trusted_roots` is `confirmation.resolved_trusted_workspaces()`, computed once per config
    load; `remembered` maps tool names to the session's remembered decisions.
    """
    mode, source = configured_mode(
        tool_name, side_effects, workspace, confirmation, trusted_roots, configured
    )
    if mode == "deny":
        return ModeResolution("policy_denied", mode, source)
    if surface is not None and tool_name in surface.modes:
        mode, source = surface.modes[tool_name], "surface"
    decision = (remembered or {}).get(tool_name)
    if always_ask:
        if decision == "deny":
            return ModeResolution("user_denied", mode, source, decision)
        return ModeResolution("ask", mode, source)
    if decision == "allow":
        return ModeResolution("run", mode, source, decision)
    if decision == "deny":
        return ModeResolution("user_denied", mode, source, decision)
    return ModeResolution("run" if mode == "auto" else "ask", mode, source)
