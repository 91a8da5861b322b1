"""The builtin registry, input validation, `not_found`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from metis.config import load_file_settings
from metis.core.errors import ConfigError
from metis.core.tools.base import ToolNameConflict
from metis.core.tools.bwrap import ShellSandbox
from metis.core.tools.policy import SurfaceToolPolicy
from metis.core.tools.registry import ToolRegistry
from metis.core.tools.settings import BUILTIN_TOOL_NAMES, ToolsSettings

ALL = "read_file, write_file, patch_file, list_dir, grep_files, shell"

# (tool, input, expected (path, message) errors): wrong type, missing required, extra
# property and out-of-range value for each builtin.
INVALID: list[tuple[str, dict[str, Any], list[tuple[str, str]]]] = [
    ("read_file", {"path": "a", "offset": "10"}, [("$.offset", "expected integer, got string")]),
    ("read_file", {}, [("$.path", "is required")]),
    ("read_file", {"path": "a", "lines": 3}, [("$.lines", "is not an allowed property")]),
    ("read_file", {"path": "a", "limit": 5001}, [("$.limit", "must be <= 5000")]),
    ("read_file", {"path": "a", "offset": 0}, [("$.offset", "must be >= 1")]),
    ("write_file", {"path": "a", "content": 5}, [("$.content", "expected string, got integer")]),
    ("write_file", {"path": "a"}, [("$.content", "is required")]),
    (
        "write_file",
        {"path": "a", "content": "", "mode": "w"},
        [("$.mode", "is not an allowed property")],
    ),
    (
        "write_file",
        {"path": "", "content": ""},
        [("$.path", "must be at least 1 characters long")],
    ),
    (
        "patch_file",
        {"path": "a", "old_text": ["x"], "new_text": ""},
        [("$.old_text", "expected string, got array")],
    ),
    ("patch_file", {"path": "a", "old_text": "x"}, [("$.new_text", "is required")]),
    (
        "patch_file",
        {"path": "a", "old_text": "x", "new_text": "y", "all": True},
        [("$.all", "is not an allowed property")],
    ),
    (
        "patch_file",
        {"path": "a", "old_text": "", "new_text": "y"},
        [("$.old_text", "must be at least 1 characters long")],
    ),
    ("list_dir", {"path": 3}, [("$.path", "expected string, got integer")]),
    ("list_dir", {"recursive": True}, [("$.recursive", "is not an allowed property")]),
    ("list_dir", {"path": "x" * 5000}, [("$.path", "must be at most 4096 characters long")]),
    ("grep_files", {"pattern": 1}, [("$.pattern", "expected string, got integer")]),
    ("grep_files", {"path": "."}, [("$.pattern", "is required")]),
    ("grep_files", {"pattern": "a", "regex": True}, [("$.regex", "is not an allowed property")]),
    ("grep_files", {"pattern": "a", "max_results": 501}, [("$.max_results", "must be <= 500")]),
    (
        "grep_files",
        {"pattern": "a", "ignore_case": "yes"},
        [("$.ignore_case", "expected boolean, got string")],
    ),
    ("shell", {"command": ["ls"]}, [("$.command", "expected string, got array")]),
    ("shell", {}, [("$.command", "is required")]),
    ("shell", {"command": "ls", "cwd": "/"}, [("$.cwd", "is not an allowed property")]),
    ("shell", {"command": "ls", "timeout_seconds": 601}, [("$.timeout_seconds", "must be <= 600")]),
    (
        "shell",
        {"command": "ls", "timeout_seconds": "5"},
        [("$.timeout_seconds", "expected integer, got string")],
    ),
]


@pytest.mark.parametrize(("name", "input", "expected"), INVALID)
async def test_invalid_input_stops_before_execution(
    harness: Any, workspace: Path, name: str, input: dict[str, Any], expected: list[Any]
) -> None:
    call = await harness.call(name, input)
    assert call.stage == "validate"  # no tool.called, no tool.failed
    assert [(e["path"], e["message"]) for e in call.errors] == expected
    assert call.outcome.is_error
    lines = [f"- {p}: {m}" for p, m in expected]
    assert call.text == "\n".join([f"Invalid input for {name}:", *lines])
    assert list(workspace.iterdir()) == []


async def test_unknown_tool_is_not_found_listing_the_tools(harness: Any) -> None:
    call = await harness.call("delete_everything", {})
    assert call.stage == "lookup"
    assert call.outcome.error_class == "not_found"
    assert call.text == f'Unknown tool "delete_everything". Available tools: {ALL}.'


async def test_not_enabled_tools_are_not_found(make_harness: Any) -> None:
    harness = make_harness(ToolsSettings(enabled=("read_file", "list_dir")))
    call = await harness.call("shell", {"command": "true"})
    assert call.outcome.error_class == "not_found"
    assert call.text == 'Unknown tool "shell". Available tools: read_file, list_dir.'
    surface = SurfaceToolPolicy(enabled=frozenset({"list_dir"}))
    call = await harness.call("read_file", {"path": "x"}, surface=surface)
    assert call.text == 'Unknown tool "read_file". Available tools: list_dir.'
    assert harness.registry.offered_names(surface) == ["list_dir"]


def test_builtin_definitions() -> None:
    registry = ToolRegistry.with_builtins(ToolsSettings())
    definitions = {d.name: d for d in registry.offered()}
    assert tuple(definitions) == BUILTIN_TOOL_NAMES
    assert {n: (d.title, d.side_effects, d.path_fields) for n, d in definitions.items()} == {
        "read_file": ("Read file", "read", ("path",)),
        "write_file": ("Write file", "write", ("path",)),
        "patch_file": ("Patch file", "write", ("path",)),
        "list_dir": ("List directory", "read", ("path",)),
        "grep_files": ("Search files", "read", ("path",)),
        "shell": ("Run shell command", "execute", ()),
    }
    for d in definitions.values():
        assert d.input_schema["additionalProperties"] is False
        assert d.origin == "builtin"
        assert d.description
    assert definitions["list_dir"].input_schema["properties"]["path"]["default"] == "."
    shell = definitions["shell"].input_schema["properties"]["timeout_seconds"]
    assert (shell["minimum"], shell["maximum"], shell["default"]) == (1, 600, 120)


def test_shell_schema_follows_the_configured_cap() -> None:
    settings = ToolsSettings.model_validate(
        {"shell": {"default_timeout_seconds": 30, "max_timeout_seconds": 90}}
    )
    shell = ToolRegistry.with_builtins(settings).get("shell")
    assert shell is not None
    timeout = shell.definition.input_schema["properties"]["timeout_seconds"]
    assert (timeout["maximum"], timeout["default"]) == (90, 30)
    assert shell.validate({"command": "x", "timeout_seconds": 91}).errors[0].message == (
        "must be <= 90"
    )


@pytest.mark.parametrize(
    ("sandbox", "said"),
    [
        (None, None),
        (ShellSandbox("/usr/bin/bwrap", network=False, hidden=()), "there is no network access"),
        (ShellSandbox("/usr/bin/bwrap", network=True, hidden=()), "the network is reachable"),
    ],
)
def test_the_shell_description_tells_the_model_what_its_sandbox_allows(
    sandbox: ShellSandbox | None, said: str | None
) -> None:
    shell = ToolRegistry.with_builtins(ToolsSettings(), sandbox).get("shell")
    assert shell is not None
    description = shell.definition.description
    if said is None:  # unsandboxed: every call is confirmed, nothing is promised
        assert "sandbox" not in description
    else:
        assert "only the workspace and a private, empty /tmp are writable" in description
        assert description.endswith(f"{said}.")


def test_application_tools_may_not_shadow_enabled_builtins() -> None:
    registry = ToolRegistry.with_builtins(ToolsSettings())
    with pytest.raises(ToolNameConflict):
        registry.check_application_tools(["ask_user", "shell"])
    registry.check_application_tools(["ask_user"])
    registry.check_application_tools(["shell"], SurfaceToolPolicy(enabled=frozenset({"read_file"})))


def test_an_unknown_tool_in_the_settings_is_said_at_its_line_with_a_likely_name_and_the_tools(
    tmp_path: Path,
) -> None:
    """Every other config.yaml error names the file, line and key: so does a tool name that
    no builtin has, where the daemon used to say only `config.yaml tools.enabled`."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "tools:\n  enabled: [read_file, shel]\n  timeouts:\n    per_tool: {read_fil: 3}\n"
        "  confirmation:\n    per_tool:\n      web_fetch: auto\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_file_settings(config)
    tools = "(the tools are: grep_files, list_dir, patch_file, read_file, shell, write_file)"
    assert refused.value.message.splitlines() == [
        f"{config}:2: tools.enabled.1: unknown tool 'shel'; did you mean 'shell'? {tools}",
        f"{config}:4: tools.timeouts.per_tool.read_fil: unknown tool 'read_fil'; did you mean "
        f"'read_file'? {tools}",
        f"{config}:7: tools.confirmation.per_tool.web_fetch: unknown tool 'web_fetch' {tools}",
    ]


def test_every_dispatch_gets_a_fresh_instance() -> None:
    entry = ToolRegistry.with_builtins(ToolsSettings()).get("read_file")
    assert entry is not None
    assert entry.factory() is not entry.factory()
