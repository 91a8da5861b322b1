"""Confirmation summaries never carry file contents."""

from __future__ import annotations

from pathlib import Path

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.registry import ToolRegistry
from metis.core.tools.sandbox import Sandbox
from metis.core.tools.settings import ToolsSettings
from metis.core.tools.summary import summarize

REGISTRY = ToolRegistry.with_builtins(ToolsSettings())


def summary_of(workspace: Path, name: str, input: dict[str, object]) -> tuple[object, ...]:
    entry = REGISTRY.get(name)
    assert entry is not None
    result = summarize(entry.definition, input, Sandbox(workspace))
    return result.input_summary, result.projected_modifications, result.command_summary


def test_write_and_patch(workspace: Path) -> None:
    content = "SECRET-CONTENT " + "x" * 1189
    assert summary_of(workspace, "write_file", {"path": "src/app.py", "content": content}) == (
        "Write 1,204 bytes to src/app.py",
        ["src/app.py"],
        None,
    )
    patch = {
        "path": str(workspace / "src/app.py"),
        "old_text": "a\nb\nc",
        "new_text": "1\n2\n3\n4\n5\n",
    }
    assert summary_of(workspace, "patch_file", patch) == (
        "Patch src/app.py (3 lines → 5 lines)",
        ["src/app.py"],
        None,
    )


def test_shell(workspace: Path) -> None:
    assert summary_of(workspace, "shell", {"command": "pytest -q"}) == (
        "Run: pytest -q",
        None,
        "pytest -q",
    )
    long = "echo start\n" + "x" * 3000
    line, projected, command = summary_of(workspace, "shell", {"command": long})
    assert projected is None
    assert isinstance(line, str) and isinstance(command, str)
    assert len(line) == 200 and "\n" not in line and line.startswith("Run: echo start x")
    assert len(command) == 2000 and command.startswith("echo start\n") and command.endswith("…")
    line, _, command = summary_of(workspace, "shell", {"command": "curl -H sk-ant-abcdefghijklmn"})
    assert line == "Run: curl -H [redacted]" and command == "curl -H [redacted]"


def test_terminal_controls_in_a_command_are_shown_not_obeyed(workspace: Path) -> None:
    """A carriage return or escape sequence in a model's command could redraw a confirmation
    prompt to show another command; the summaries carry them escaped."""
    spoof = "touch /tmp/x #\r\x1b[2K\x1b[1Aconfirm> ls\u202e"
    line, _, command = summary_of(workspace, "shell", {"command": spoof})
    assert isinstance(line, str) and isinstance(command, str)
    for text in (line, command):
        assert not any(ch in text for ch in "\r\x1b\u202e")
    assert command == "touch /tmp/x #\\r\\x1b[2K\\x1b[1Aconfirm> ls\\u202e"


def test_read_tools_and_outside_paths(workspace: Path) -> None:
    assert summary_of(workspace, "read_file", {"path": "a/../b.txt"}) == ("Read b.txt", None, None)
    assert summary_of(workspace, "list_dir", {"path": "."})[0] == "List ."
    assert summary_of(workspace, "grep_files", {"pattern": "TODO", "path": "src"})[0] == (
        'Search src for "TODO"'
    )
    assert summary_of(workspace, "read_file", {"path": "../etc"})[0] == "Read ../etc"


def test_other_tools_get_a_generic_line(workspace: Path) -> None:
    definition = ToolDefinition(
        name="deploy",
        title="Deploy",
        input_schema={
            "type": "object",
            "properties": {"target": {"type": "string"}},
            "additionalProperties": False,
        },
        side_effects="write",
        path_fields=("target",),
    )
    result = summarize(definition, {"target": "out/site"}, Sandbox(workspace))
    assert (result.input_summary, result.projected_modifications) == (
        "Deploy: out/site",
        ["out/site"],
    )


def test_an_unsandboxed_shell_says_so(workspace: Path) -> None:
    entry = REGISTRY.get("shell")
    assert entry is not None
    result = summarize(entry.definition, {"command": "make"}, Sandbox(workspace), unsandboxed=True)
    assert result.input_summary == "Run (unsandboxed): make"
    assert result.command_summary == "make"
