"""The tool registry: registered factories, what a session is offered, and lookups.

The registry stores factories, not instances, so every dispatch gets a fresh tool and no state
leaks between calls. `enabled` (from `tools.enabled`) limits what any session may be offered;
a surface's `SurfaceToolPolicy` may narrow it further per session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import Tool, ToolNameConflict, ToolRegistrationError
from metis.core.tools.bwrap import ShellSandbox
from metis.core.tools.policy import SurfaceToolPolicy
from metis.core.tools.schema import InputValidation, check_schema, validate_input
from metis.core.tools.settings import TOOL_NAME_RE, Mode, ToolsSettings
from metis.core.tools.timeouts import InputTimeout

ToolFactory = Callable[[], Tool]


@dataclass(frozen=True)
class RegisteredTool:
    """A tool as registered: its definition, a factory for a fresh instance per call, and how its
    timeout follows its input."""

    definition: ToolDefinition
    factory: ToolFactory
    input_timeout: InputTimeout | None = None
    # the confirmation mode its source configures (MCP servers), under tools.confirmation.per_tool
    configured_mode: Mode | None = None

    @property
    def name(self) -> str:
        return self.definition.name

    def validate(self, input: Any) -> InputValidation:
        """Step 2 of the pipeline: strict validation, then defaults filled in."""
        return validate_input(self.definition.input_schema, input)


class ToolRegistry:
    """The tools of the daemon, what each session may be offered, and the MCP sources that replace
    their tools as a whole."""

    def __init__(self, enabled: Iterable[str] | None = None) -> None:
        """`enabled=None` enables every registered tool (tests registering their own)."""
        self._tools: dict[str, RegisteredTool] = {}
        self._enabled = None if enabled is None else frozenset(enabled)
        # tool name → source (`mcp:<server>`), see replace_source
        self._sources: dict[str, str] = {}

    @classmethod
    def with_builtins(
        cls, settings: ToolsSettings, shell_sandbox: ShellSandbox | None = None
    ) -> ToolRegistry:
        """The six builtins in contract order, enabled per `settings.enabled`; the shell's
        description says what `shell_sandbox` allows (None: the shell runs unsandboxed). The
        settings name builtins only (`ToolsSettings` checks that as config.yaml is read)."""
        registry = cls(enabled=settings.enabled)
        registry.register_builtins(settings, shell_sandbox)
        return registry

    def register_builtins(
        self, settings: ToolsSettings, shell_sandbox: ShellSandbox | None = None
    ) -> None:
        """Register the six builtins (the shell's schema follows `settings.shell`)."""
        from metis.core.tools.builtins import builtin_tools

        for definition, factory, input_timeout in builtin_tools(settings, shell_sandbox):
            self.register(definition, factory, input_timeout=input_timeout)

    def register(
        self,
        definition: ToolDefinition,
        factory: ToolFactory,
        *,
        input_timeout: InputTimeout | None = None,
    ) -> RegisteredTool:
        """Add a tool; refuses an invalid name, a duplicate, an invalid schema and a path field the
        schema does not declare."""
        name = definition.name
        if not TOOL_NAME_RE.match(name):
            raise ToolRegistrationError(f"invalid tool name {name!r}")
        if name in self._tools:
            raise ToolRegistrationError(f"tool {name!r} is already registered")
        check_schema(definition.input_schema)
        properties = definition.input_schema["properties"]
        for field in definition.path_fields:
            if properties.get(field, {}).get("type") != "string":
                raise ToolRegistrationError(f"path field {field!r} is not a string property")
        entry = RegisteredTool(definition, factory, input_timeout)
        self._tools[name] = entry
        return entry

    def replace_source(self, source: str, entries: Iterable[RegisteredTool]) -> list[str]:
        """Set the tools of a dynamic source (an MCP server) to `entries`, replacing its previous
        ones; returns the names refused: invalid, or held by a builtin or another source (the
        source's other tools are registered all the same).

        Their schemas are the source's own (validated by their `validate`), so the builtin subset
        check does not apply; `tools.enabled` (a list of builtins) does not limit them either.
        """
        for name in [n for n, owner in self._sources.items() if owner == source]:
            del self._sources[name]
            del self._tools[name]
        refused: list[str] = []
        for entry in entries:
            if not TOOL_NAME_RE.match(entry.name) or entry.name in self._tools:
                refused.append(entry.name)
                continue
            self._tools[entry.name] = entry
            self._sources[entry.name] = source
        return refused

    def source_of(self, name: str) -> str | None:
        """The source (`mcp:<server>`) a tool was registered from; None for builtins and tests' own
        tools."""
        return self._sources.get(name)

    def get(self, name: str) -> RegisteredTool | None:
        """A registered tool whether or not it is enabled (AAP `/meta`, config checks)."""
        return self._tools.get(name)

    def all(self) -> list[RegisteredTool]:
        return list(self._tools.values())

    def is_enabled(self, name: str, surface: SurfaceToolPolicy | None = None) -> bool:
        """Whether the tool may be offered: registered, enabled by `tools.enabled` (MCP tools by
        their server's config) and allowed by the surface's policy."""
        if name not in self._tools:
            return False
        if self._enabled is not None and name not in self._enabled and name not in self._sources:
            return False
        return surface is None or surface.allows(name)

    def lookup(self, name: str, surface: SurfaceToolPolicy | None = None) -> RegisteredTool | None:
        """Step 1: the tool if a session with `surface` may call it, else None (`not_found`)."""
        return self._tools[name] if self.is_enabled(name, surface) else None

    def offered(self, surface: SurfaceToolPolicy | None = None) -> list[ToolDefinition]:
        """The definitions offered to the model, in registration order."""
        return [t.definition for t in self._tools.values() if self.is_enabled(t.name, surface)]

    def offered_names(self, surface: SurfaceToolPolicy | None = None) -> list[str]:
        return [d.name for d in self.offered(surface)]

    def check_application_tools(
        self, names: Iterable[str], surface: SurfaceToolPolicy | None = None
    ) -> None:
        """Raise `ToolNameConflict` for an application tool named like an enabled builtin."""
        for name in names:
            if self.is_enabled(name, surface):
                raise ToolNameConflict(name)
