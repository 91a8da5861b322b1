"""Fixtures for the tools suite: real temp workspaces and a harness that walks the pipeline.

`Harness.call` performs the dispatcher's pure steps in contract order (lookup, validation,
sandbox pre-check, execution) so tests can assert which step ended a call without events.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from metis.core.tools.base import ToolLimits
from metis.core.tools.executor import ToolExecutor
from metis.core.tools.policy import SurfaceToolPolicy
from metis.core.tools.precheck import precheck
from metis.core.tools.registry import ToolRegistry
from metis.core.tools.results import ToolOutcome, failed, input_invalid_text, not_found_text
from metis.core.tools.sandbox import MetisHome, Sandbox
from metis.core.tools.settings import ToolsSettings, limits_from_settings

# Provider-key variables as models.yaml would name them.
API_KEY_ENVS = frozenset({"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CUSTOM_PROVIDER_KEY"})


@dataclass
class Call:
    """How far a call got: `lookup`, `validate`, `precheck` or `executed` (≈ tool.called)."""

    stage: str
    outcome: ToolOutcome
    errors: list[dict[str, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.outcome.text


@dataclass
class Harness:
    registry: ToolRegistry
    executor: ToolExecutor
    sandbox: Sandbox
    settings: ToolsSettings

    async def call(
        self,
        name: str,
        input: Any,
        *,
        surface: SurfaceToolPolicy | None = None,
        cancel_event: asyncio.Event | None = None,
        tool_use_id: str = "tu_test",
    ) -> Call:
        entry = self.registry.lookup(name, surface)
        if entry is None:
            text = not_found_text(name, self.registry.offered_names(surface))
            return Call("lookup", failed("not_found", text))
        checked = entry.validate(input)
        if not checked.ok:
            text = input_invalid_text(name, checked.errors)
            errors = [e.as_dict() for e in checked.errors]
            return Call("validate", failed("tool_error", text), errors)
        assert checked.value is not None
        path_check = precheck(entry.definition, checked.value, self.sandbox)
        if path_check.failure is not None:
            return Call("precheck", path_check.failure)
        outcome = await self.executor.run(
            entry,
            checked.value,
            sandbox=self.sandbox,
            tool_use_id=tool_use_id,
            cancel_event=cancel_event,
        )
        return Call("executed", outcome)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace holding a secret the sandbox must never expose."""
    other = tmp_path / "outside"
    other.mkdir()
    (other / "secret.txt").write_text("TOP-SECRET\n")
    return other


@pytest.fixture
def test_limits() -> Callable[[ToolsSettings], ToolLimits]:
    """Limits with the shell's fixed waits lowered so the suite stays fast."""

    def make(settings: ToolsSettings) -> ToolLimits:
        return dataclasses.replace(
            limits_from_settings(settings, API_KEY_ENVS),
            shell_kill_grace_seconds=1.0,
            shell_pipe_wait_seconds=0.5,
        )

    return make


@pytest.fixture
def make_harness(
    workspace: Path, test_limits: Callable[[ToolsSettings], ToolLimits]
) -> Callable[..., Harness]:
    def make(
        settings: ToolsSettings | None = None,
        *,
        limits: ToolLimits | None = None,
        registry: ToolRegistry | None = None,
        root: Path | None = None,
        metis_home: Path | None = None,
    ) -> Harness:
        settings = settings or ToolsSettings()
        home = None if metis_home is None else MetisHome.at(metis_home, metis_home / "workspaces")
        return Harness(
            registry=registry or ToolRegistry.with_builtins(settings),
            executor=ToolExecutor(settings, limits or test_limits(settings)),
            sandbox=Sandbox(root or workspace, settings.sandbox.protected_dirs, home),
            settings=settings,
        )

    return make


@pytest.fixture
def harness(make_harness: Callable[..., Harness]) -> Harness:
    return make_harness()
