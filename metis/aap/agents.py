"""The agents `/meta` declares, built per request from the live registries.

There is one real agent, `metis`: its tools are the dispatcher registry's definitions verbatim
(no hidden tools), its options are `model` (auto + configured models) and `workspace`, and its
capabilities are exactly what the façade implements end to end. Extra agents can be derived
from it (tests declare one with a `secret` option); they share the same core.

The `workspace` option's values live here too (`Workspaces`): an absolute directory inside the
allowed roots, or a bare name naming a scratch workspace under `METIS_HOME/workspaces/`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from metis.aap.errors import AapError
from metis.config import AapSettings
from metis.core.application import Models, expand_workspace
from metis.core.canonical.tools import ToolDefinition
from metis.core.errors import WorkspaceInvalid
from metis.version import metis_version

# ---------------------------------------------------------------------------------------------
# The AAP `workspace` option: an absolute directory inside the allowed roots, or a
# ---------------------------------------------------------------------------------------------

BARE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


@dataclass(frozen=True)
class WorkspaceChoice:
    path: Path  # resolved (realpath) directory
    scratch: bool  # a bare name: created by `Workspaces.provisioned` when missing


def _bad(message: str) -> AapError:
    return AapError("invalid_option", message, {"option": "workspace"})


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class Workspaces:
    def __init__(
        self, scratch_root: Path, settings: AapSettings, default_workspace: str | None
    ) -> None:
        self.scratch_root = scratch_root
        self.default = (
            Path(default_workspace).expanduser()
            if default_workspace
            else self.scratch_root / "default"
        )
        self._extra = tuple(Path(p).expanduser() for p in settings.workspace_roots)

    def ensure_default(self) -> None:
        """Start-up: the scratch root and the default workspace exist (mode 0700)."""
        for path in (self.scratch_root, self.default):
            if not path.exists():
                path.mkdir(parents=True, mode=0o700)

    def default_value(self) -> str:
        return str(self.default.resolve())

    def roots(self) -> tuple[Path, ...]:
        """The AAP allowed roots, resolved; the metis setting plays no part."""
        return tuple(
            p.resolve() for p in (self.scratch_root, self.default, *self._extra) if p.exists()
        )

    def resolve(self, value: str) -> WorkspaceChoice:
        """Judge a client value without writing anything; `invalid_option` when refused."""
        if BARE_NAME_RE.fullmatch(value):
            path = self.scratch_root.resolve() / value
            if not os.path.lexists(path):
                return WorkspaceChoice(path, True)
            # An existing entry may be a symlink: judged after resolution, like a path.
            return WorkspaceChoice(self._inside_roots(value, path), True)
        if "\0" in value:  # no directory name holds one (os calls raise ValueError)
            raise _bad("workspace must not contain a NUL character")
        try:
            expanded = expand_workspace(value)
        except WorkspaceInvalid as exc:
            raise _bad(exc.message) from exc
        if not expanded.is_absolute():
            raise _bad(
                "workspace must be an absolute directory or a bare name "
                "(letters, digits, '.', '_', '-'; at most 64 characters)"
            )
        return WorkspaceChoice(self._inside_roots(value, expanded), False)

    def _inside_roots(self, value: str, path: Path) -> Path:
        """The realpath of an existing directory inside an allowed root (symlinks followed)."""
        real = Path(os.path.realpath(path))
        if not os.path.isdir(real):  # False for any OSError (a name too long): `is_dir` raises
            raise _bad(f"workspace {value!r} is not an existing directory")
        if not any(_within(real, root) for root in self.roots()):
            raise _bad(f"workspace {value!r} is outside the allowed workspace roots")
        return real

    @staticmethod
    @contextlib.contextmanager
    def provisioned(choice: WorkspaceChoice) -> Iterator[str]:
        """The workspace directory of a session being created, for the block that creates it.

        A missing scratch directory is created on entry (core checks that the directory
        exists). If the block fails, the request is refused after all: a directory created
        here is removed again while still empty, so a refused request leaves nothing on disk
        A cancellation (BaseException) keeps it: a v1 stream cancelled by its
        client keeps its session, and so its workspace.
        """
        created = choice.scratch and not choice.path.exists()
        if created:
            choice.path.mkdir(mode=0o700)
        try:
            yield str(choice.path.resolve())
        except Exception:
            if created:
                with contextlib.suppress(OSError):  # not empty: something ran in it, keep it
                    choice.path.rmdir()
            raise


# ---------------------------------------------------------------------------------------------
# The agents `/meta` declares, built per request from the live registries.
# ---------------------------------------------------------------------------------------------

OptionType = Literal["text", "select", "secret"]
HistoryType = Literal["compacted", "full"]
HISTORY_TYPES: tuple[HistoryType, ...] = ("compacted", "full")
AUTO = "auto"
METIS_DESCRIPTION = (
    "Coding agent that reads, edits and runs commands inside a workspace directory on this machine."
)


@dataclass(frozen=True)
class OptionSpec:
    name: str
    type: OptionType
    default: str
    title: str | None = None
    description: str | None = None
    choices: tuple[str, ...] = ()

    def wire(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name}
        if self.title is not None:
            data["title"] = self.title
        if self.description is not None:
            data["description"] = self.description
        data["type"] = self.type
        if self.type == "select":
            data["options"] = list(self.choices)
        data["default"] = self.default
        return data


@dataclass(frozen=True)
class AgentSpec:
    name: str
    title: str
    version: str
    description: str
    tools: tuple[ToolDefinition, ...]
    options: tuple[OptionSpec, ...]
    history: tuple[HistoryType, ...] = HISTORY_TYPES
    workspace_default: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def tool(self, name: str) -> ToolDefinition | None:
        return next((t for t in self.tools if t.name == name), None)

    def option(self, name: str) -> OptionSpec | None:
        return next((o for o in self.options if o.name == name), None)

    def secret_names(self) -> frozenset[str]:
        return frozenset(o.name for o in self.options if o.type == "secret")

    def capabilities(self) -> dict[str, Any]:
        return {
            "history": {h: {} for h in self.history},
            "stream": {"delta": {}, "message": {}, "none": {}},
            "application": {"tools": {}},
            "image": {"data": {}},
        }

    def info(self, version: int) -> dict[str, Any]:
        """The AgentInfo object; v1 names each tool schema `inputSchema`."""
        return {
            "name": self.name,
            "title": self.title,
            "version": self.version,
            "description": self.description,
            "tools": [tool_spec(t, version) for t in self.tools],
            "options": [o.wire() for o in self.options],
            "capabilities": self.capabilities(),
        }


def tool_spec(tool: ToolDefinition, version: int) -> dict[str, Any]:
    schema_key = "parameters" if version == 3 else "inputSchema"
    return {
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        schema_key: tool.input_schema,
    }


AgentFactory = Callable[[AgentSpec], AgentSpec]


class AgentCatalog:
    """`/meta`'s agents; `extras` derive further agents from the `metis` one."""

    def __init__(self, models: Models, workspaces: Workspaces) -> None:
        self.models = models
        self.workspaces = workspaces
        self.extras: list[AgentFactory] = []

    def model_choices(self) -> tuple[str, ...]:
        models = self.models
        names = [AUTO]
        for entry in models.entries():
            if models.is_configured(entry.id):
                names.append(entry.aliases[0] if entry.aliases else entry.id)
        return tuple(dict.fromkeys(names))

    def metis(self) -> AgentSpec:
        default_ws = self.workspaces.default_value()
        options = (
            OptionSpec(
                "model",
                "select",
                AUTO,
                title="Model",
                description="The model for every turn; auto lets metis routing choose.",
                choices=self.model_choices(),
            ),
            OptionSpec(
                "workspace",
                "text",
                default_ws,
                title="Workspace",
                description=(
                    "Absolute directory the agent works in, or a bare name for a scratch "
                    "workspace kept by metis. Fixed when the session is created."
                ),
            ),
        )
        return AgentSpec(
            name="metis",
            title="metis",
            version=metis_version(),
            description=METIS_DESCRIPTION,
            tools=tuple(self.models.offered_tools()),
            options=options,
            workspace_default=default_ws,
        )

    def all(self) -> list[AgentSpec]:
        base = self.metis()
        return [base, *(factory(base) for factory in self.extras)]

    def get(self, name: str) -> AgentSpec | None:
        return next((a for a in self.all() if a.name == name), None)


def with_secret_option(name: str, option: str, *, history: tuple[HistoryType, ...]) -> AgentFactory:
    """A derived agent declaring one `secret` option (exercises secret-option redaction)."""

    def build(base: AgentSpec) -> AgentSpec:
        secret = OptionSpec(option, "secret", "", title=option, description="A secret value.")
        return replace(
            base, name=name, title=name, options=(*base.options, secret), history=history
        )

    return build
