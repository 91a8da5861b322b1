"""How a tool call reads for a person: a one-line summary, the diff of a file edit, the shell's
command and output, how its confirmation was settled. Shared by the terminal app, `metis chat`,
`metis run` and the Markdown export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_DIFF_SOURCE_BYTES = 1_000_000


def summary(name: str, tool_input: dict[str, Any] | None) -> str:
    """`shell: ls -la`, `write_file: notes.txt`, … (the most telling argument)."""
    data = tool_input or {}
    for key in ("command", "path", "pattern"):
        value = data.get(key)
        if isinstance(value, str) and value:
            return value if len(value) <= 120 else value[:119] + "…"
    if name == "list_dir":  # its path left out: the workspace's root, its default
        return "(the workspace root)"
    if not data:
        return ""
    text = json.dumps(data, ensure_ascii=False)
    return text if len(text) <= 120 else text[:119] + "…"


def _current_text(workspace: str | None, path: str) -> str | None:
    """The file as it is now in the workspace (None when absent, unreadable, binary, large)."""
    if not workspace:
        return None
    target = Path(workspace, path)
    try:
        if target.stat().st_size > MAX_DIFF_SOURCE_BYTES:
            return None
        return target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def file_diff(name: str, tool_input: dict[str, Any] | None, workspace: str | None) -> str | None:
    """A unified diff for `write_file` (against the file now, if any) and `patch_file` (its old
    text against its new text); None for other tools."""
    data = tool_input or {}
    path = str(data.get("path") or "")
    if name == "write_file":
        before = _current_text(workspace, path) or ""
        after = str(data.get("content") or "")
    elif name == "patch_file":
        before = str(data.get("old_text") or "")
        after = str(data.get("new_text") or "")
    else:
        return None
    import difflib  # here, not at import: every `metis` command (serve too) loads this module

    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return text or f"(no change to {path})\n"


def split_exit_code(output: str) -> tuple[int | None, str]:
    """The shell's result reads `exit_code: N` on its first line, then the output."""
    first, _, rest = output.partition("\n")
    if first.startswith("exit_code: "):
        try:
            return int(first.removeprefix("exit_code: ").strip()), rest
        except ValueError:
            pass
    return None, output


def truncate_lines(text: str, limit: int) -> tuple[str, int]:
    """The first `limit` lines, and how many lines were left out."""
    lines = text.splitlines()
    if len(lines) <= limit:
        return text.rstrip("\n"), 0
    return "\n".join(lines[:limit]), len(lines) - limit


def already_settled(request: dict[str, Any], details: dict[str, Any]) -> str:
    """`write_file was already allowed once`: an answer to a confirmation settled before it
    (answered elsewhere, timed out, withdrawn with its turn), from the 409's details."""
    resolution = details.get("resolution")
    if resolution == "allow":
        how = "allowed" + (" for this session" if details.get("scope") == "session" else " once")
    else:
        how = {
            "deny": "denied",
            "timeout": "timed out",
            "withdrawn": "withdrawn: its turn ended",
        }.get(str(resolution), f"settled ({resolution})")
    return f"{request.get('tool_name', 'the tool')} was already {how}"
