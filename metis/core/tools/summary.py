"""Confirmation summaries: what a user sees before allowing a call.

One line of at most 200 characters, the paths a write tool targets, and for the shell the
command (at most 2,000 characters). File contents never appear: the full input stays in the
assistant message the event points to. A shell without its sandbox says so first:
`Run (unsandboxed): …`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from metis.core.canonical.jsontext import canonical_json
from metis.core.canonical.redaction import redact
from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import PermissionDenied, ToolError
from metis.core.tools.sandbox import Sandbox, display, writes_paths
from metis.core.tools.textutil import count_lines, cut, one_line, visible_controls

INPUT_SUMMARY_CHARS = 200
MCP_PREFIX = "mcp__"  # tools of MCP servers (metis/core/tools/mcp/)
COMMAND_SUMMARY_CHARS = 2000


@dataclass(frozen=True)
class ConfirmationSummary:
    """What `tool.confirmation_requested` shows the user: a one-line summary, the paths a write
    targets, the shell command."""

    input_summary: str
    projected_modifications: list[str] | None
    command_summary: str | None


def _lines(n: int) -> str:
    return f"{n} line" if n == 1 else f"{n} lines"


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


_Summarizer = Callable[[Mapping[str, Any], Mapping[str, str]], str]

_SUMMARIZERS: dict[str, _Summarizer] = {
    "read_file": lambda i, p: f"Read {p.get('path', '?')}",
    "write_file": lambda i, p: (
        f"Write {_size(i.get('content', '')):,} bytes to {p.get('path', '?')}"
    ),
    "patch_file": lambda i, p: (
        f"Patch {p.get('path', '?')} ({_lines(count_lines(i.get('old_text', '')))} → "
        f"{_lines(count_lines(i.get('new_text', '')))})"
    ),
    "list_dir": lambda i, p: f"List {p.get('path', '.')}",
    "grep_files": lambda i, p: f'Search {p.get("path", ".")} for "{i.get("pattern", "")}"',
    "shell": lambda i, p: f"Run: {i.get('command', '')}",
}


def _generic(definition: ToolDefinition) -> _Summarizer:
    def summarize(input: Mapping[str, Any], paths: Mapping[str, str]) -> str:
        title = definition.title or definition.name
        if definition.name.startswith(MCP_PREFIX):  # an MCP tool: its arguments, compact
            return f"{title} {canonical_json(dict(input))}"
        return f"{title}: {', '.join(paths.values())}" if paths else title

    return summarize


def _shown_path(sandbox: Sandbox, value: Any, write: bool) -> str:
    """The workspace-relative form when the path resolves, else the string as given."""
    if not isinstance(value, str):
        return "?"
    try:
        return display(sandbox.resolve(value, write=write).rel)
    except (PermissionDenied, ToolError):
        return display(value)


def summarize(
    definition: ToolDefinition,
    input: Mapping[str, Any],
    sandbox: Sandbox,
    *,
    unsandboxed: bool = False,
) -> ConfirmationSummary:
    """The summary fields of `tool.confirmation_requested` for a validated input."""
    write = writes_paths(definition.side_effects)
    paths = {
        field: _shown_path(sandbox, input[field], write)
        for field in definition.path_fields
        if field in input
    }
    summarizer = _SUMMARIZERS.get(definition.name) or _generic(definition)
    text = summarizer(input, paths)
    if unsandboxed:
        text = f"Run (unsandboxed): {input.get('command', '')}"
    line = redact(one_line(visible_controls(text), INPUT_SUMMARY_CHARS))
    command = input.get("command")
    command_summary = (
        redact(cut(visible_controls(command), COMMAND_SUMMARY_CHARS))
        if definition.side_effects == "execute" and isinstance(command, str)
        else None
    )
    projected = list(paths.values()) if definition.side_effects == "write" else None
    return ConfirmationSummary(line, projected, command_summary)
