"""The `tools` section of `METIS_HOME/config.yaml`.

Every default of the contract lives here and nowhere else. Unknown keys, classes and modes are
refused (`extra="forbid"`, literal keys), so a typo stops the daemon instead of silently
weakening the confirmation policy. `metis/config.py` embeds `ToolsSettings`.
"""

import os
import re
from collections.abc import Iterable
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from metis.core.canonical.tools import SideEffects
from metis.core.datamodel import DataModel
from metis.core.errors import ConfigError
from metis.core.tools.base import (
    DEFAULT_MAX_RESULT_BYTES,
    MIB,
    ToolLimits,
    shell_keep_bytes,
)

Mode = Literal["auto", "prompt", "prompt_once", "deny"]

BUILTIN_TOOL_NAMES: tuple[str, ...] = (
    "read_file",
    "write_file",
    "patch_file",
    "list_dir",
    "grep_files",
    "shell",
)
DEFAULT_CLASS_TIMEOUTS: dict[SideEffects, float] = {
    "none": 60,
    "read": 60,
    "write": 60,
    "execute": 600,
    "network": 600,
}
# The daemon's own key is never passed to a command, whatever models.yaml says.
ALWAYS_FORBIDDEN_ENV = frozenset({"METIS_API_KEY"})

TOOL_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def _check_tool_names(names: Iterable[str]) -> None:
    bad = [n for n in names if not TOOL_NAME_RE.match(n)]
    if bad:
        raise ValueError(f"invalid tool names: {', '.join(bad)}")


BUILTINS_ONLY = "builtin_tool_names_only"
"""The validation context key under which tool names must be builtins: config.yaml's (an MCP
server's tools take their policy and timeouts from its own entry). Settings a program builds for
a registry of its own tools (the tests') name those."""


def _builtin(name: str, info: ValidationInfo) -> str:
    """A name config.yaml's tool settings may use: a builtin. Checked as the file is read, so a
    typo is said with the file, line and key, a likely name and the list."""
    builtins_only = bool(info.context and info.context.get(BUILTINS_ONLY))
    if builtins_only and TOOL_NAME_RE.match(name) and name not in BUILTIN_TOOL_NAMES:
        from metis.core.config.yaml_source import suggest

        raise ValueError(
            f"unknown tool {name!r}{suggest(name, BUILTIN_TOOL_NAMES)} "
            f"(the tools are: {', '.join(sorted(BUILTIN_TOOL_NAMES))})"
        )
    return name


BuiltinToolName = Annotated[str, AfterValidator(_builtin)]


class _Section(DataModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimeoutsSettings(_Section):
    """`per_class` entries override the default timeouts one class at a time."""

    per_class: dict[SideEffects, float] = Field(
        default_factory=lambda: dict(DEFAULT_CLASS_TIMEOUTS)
    )
    per_tool: dict[BuiltinToolName, float] = Field(default_factory=dict)

    @field_validator("per_class")
    @classmethod
    def _merge_class_defaults(cls, value: dict[SideEffects, float]) -> dict[SideEffects, float]:
        if any(v <= 0 for v in value.values()):
            raise ValueError("timeouts must be positive")
        return {**DEFAULT_CLASS_TIMEOUTS, **value}

    @field_validator("per_tool")
    @classmethod
    def _check_per_tool(cls, value: dict[str, float]) -> dict[str, float]:
        _check_tool_names(value)
        if any(v <= 0 for v in value.values()):
            raise ValueError("timeouts must be positive")
        return value


class ShellSettings(_Section):
    """`sandbox: auto` runs commands in bubblewrap when it works here (`bwrap_path`, else
    `bwrap` on PATH); `off`, or no usable bwrap, runs them unsandboxed, each one confirmed."""

    default_timeout_seconds: int = Field(default=120, ge=1)
    max_timeout_seconds: int = Field(default=600, ge=1)
    env_passthrough: tuple[str, ...] = ()
    sandbox: Literal["auto", "off"] = "auto"
    network: bool = False
    bwrap_path: str | None = Field(default=None, min_length=1)

    @field_validator("sandbox", mode="before")
    @classmethod
    def _off_as_yaml_reads_it(cls, value: object) -> object:
        """`sandbox: off` unquoted is the boolean false to YAML: the word the user wrote."""
        return "off" if value is False else value

    @field_validator("env_passthrough")
    @classmethod
    def _check_env_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in value if not _ENV_NAME_RE.match(n)]
        if bad:
            raise ValueError(f"invalid environment variable names: {', '.join(bad)}")
        forbidden = sorted(ALWAYS_FORBIDDEN_ENV.intersection(value))
        if forbidden:
            raise ValueError(f"{', '.join(forbidden)} is never passed to commands")
        return value

    @model_validator(mode="after")
    def _default_within_max(self) -> Self:
        if self.default_timeout_seconds > self.max_timeout_seconds:
            raise ValueError("default_timeout_seconds must not exceed max_timeout_seconds")
        return self


class SandboxSettings(_Section):
    """`tools.sandbox`: directory names (not paths) no tool may write under, at any depth of the
    workspace."""

    protected_dirs: tuple[str, ...] = (".git",)

    @field_validator("protected_dirs")
    @classmethod
    def _plain_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in value if not n or "/" in n or "\0" in n or n in (".", "..")]
        if bad:
            raise ValueError("protected_dirs holds directory names, not paths")
        return value


def _default_modes() -> dict[SideEffects, Mode]:
    return {
        "none": "auto",
        "read": "auto",
        "write": "prompt",
        "execute": "prompt",
        "network": "prompt",
    }


def _trusted_workspace_modes() -> dict[SideEffects, Mode]:
    return {"write": "auto"}


class ConfirmationSettings(_Section):
    """A class missing from a user-given `default` resolves to `prompt`."""

    default: dict[SideEffects, Mode] = Field(default_factory=_default_modes)
    per_tool: dict[BuiltinToolName, Mode] = Field(default_factory=dict)
    trusted_workspaces: tuple[str, ...] = ()
    trusted_workspace_modes: dict[SideEffects, Mode] = Field(
        default_factory=_trusted_workspace_modes
    )
    timeout_seconds: int = Field(default=300, ge=1, le=3600)

    @field_validator("per_tool")
    @classmethod
    def _check_per_tool(cls, value: dict[str, Mode]) -> dict[str, Mode]:
        _check_tool_names(value)
        return value

    def resolved_trusted_workspaces(self) -> tuple[str, ...]:
        """`~` expanded and symlinks resolved, as rule 3 compares resolved paths."""
        return tuple(os.path.realpath(os.path.expanduser(p)) for p in self.trusted_workspaces)


class ToolsSettings(_Section):
    """The `tools` section of config.yaml: which tools exist for sessions, concurrency, timeouts,
    size limits, the shell, the sandbox and the confirmation policy."""

    enabled: tuple[BuiltinToolName, ...] = BUILTIN_TOOL_NAMES
    max_concurrent_per_session: int = Field(default=4, ge=1, le=16)
    max_concurrent_global: int = Field(default=16, ge=1)
    timeouts: TimeoutsSettings = Field(default_factory=TimeoutsSettings)
    abandon_after_seconds: float = Field(default=30, gt=0)
    max_result_bytes: int = Field(default=DEFAULT_MAX_RESULT_BYTES, ge=1024)
    max_write_bytes: int = Field(default=5 * MIB, ge=1)
    shell: ShellSettings = Field(default_factory=ShellSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    confirmation: ConfirmationSettings = Field(default_factory=ConfirmationSettings)

    @field_validator("enabled")
    @classmethod
    def _check_enabled(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _check_tool_names(value)
        if len(set(value)) != len(value):
            raise ValueError("enabled lists a tool twice")
        return value


def check_env_passthrough(settings: ToolsSettings, forbidden: Iterable[str]) -> None:
    """Refuse a passthrough naming a provider key (`api_key_env` names come from models.yaml).

    Called by the config loader once both files are read; raises `ConfigError`.
    """
    names = sorted(set(settings.shell.env_passthrough) & (set(forbidden) | ALWAYS_FORBIDDEN_ENV))
    if names:
        raise ConfigError(
            f"config.yaml tools.shell.env_passthrough: {', '.join(names)} holds an API key and "
            "is never passed to commands; remove it from the list"
        )


def limits_from_settings(settings: ToolsSettings, forbidden_env: Iterable[str] = ()) -> ToolLimits:
    """The run-time limits of the tools; `forbidden_env` are the models.yaml key variables.

    Tests lower the shell's fixed waits with `dataclasses.replace` on the result.
    """
    half = shell_keep_bytes(settings.max_result_bytes)
    return ToolLimits(
        max_write_bytes=settings.max_write_bytes,
        max_result_bytes=settings.max_result_bytes,
        shell_head_bytes=half,
        shell_tail_bytes=half,
        env_passthrough=settings.shell.env_passthrough,
        forbidden_env=ALWAYS_FORBIDDEN_ENV | frozenset(forbidden_env),
    )
