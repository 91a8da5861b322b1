"""The agents `/meta` declares, built per request from the live registries.

There is one real agent, `metis`: its tools are the dispatcher registry's definitions verbatim
(no hidden tools), its options are `model` (auto + configured models) and `workspace`, and its
capabilities are exactly what the façade implements end to end. Extra agents can be derived
from it (tests declare one with a `secret` option); they share the same core.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from metis.aap.workspaces import Workspaces
from metis.core.application import Models
from metis.core.canonical.tools import ToolDefinition
from metis.version import metis_version

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
