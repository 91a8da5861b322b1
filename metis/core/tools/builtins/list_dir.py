"""`list_dir`: the entries of one directory. Symlinks are shown, not followed."""

from __future__ import annotations

import asyncio
import errno
import os
from typing import Any

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import ToolContext, ToolError, ToolOutput
from metis.core.tools.builtins._common import object_schema, path_schema
from metis.core.tools.files import open_checked
from metis.core.tools.sandbox import ResolvedPath, Sandbox, display

MAX_ENTRIES = 1000

DEFINITION = ToolDefinition(
    name="list_dir",
    title="List directory",
    description=(
        "List one directory inside the workspace, sorted by name. Directories end with '/', "
        "symbolic links with '@'."
    ),
    input_schema=object_schema(
        {"path": path_schema("Directory path, relative to the workspace root.", default=".")}
    ),
    side_effects="read",
    path_fields=("path",),
)


class ListDirTool:
    """The builtin `list_dir`: one directory's entries, listed in a worker thread."""

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        target = ctx.workspace.resolve(input.get("path", "."))
        return ToolOutput.text(await asyncio.to_thread(list_entries, ctx.workspace, target))


def list_entries(sandbox: Sandbox, target: ResolvedPath) -> str:
    """A directory's entries sorted by name (directories end in `/`, symlinks in `@`), capped at
    `MAX_ENTRIES`; the directory is opened without following a symlink, and checked by what
    the kernel opened (a directory above it may have been swapped for a link)."""
    path = display(target.rel)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = open_checked(sandbox, target.real, target.rel, flags)
    except FileNotFoundError:
        raise ToolError(f"Directory not found: {path}") from None
    except PermissionError:
        raise ToolError(f"Permission denied: {path}") from None
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            raise ToolError(f"{path} is not a directory.") from None
        raise
    try:
        with os.scandir(fd) as entries:
            # Sorted by the bare name: a suffix must not move `a/` behind `a-b` and `a.txt`.
            names = [_entry_name(e) for e in sorted(entries, key=lambda e: e.name)]
    finally:
        os.close(fd)
    if not names:
        return "[empty directory]"
    lines = [display(name) for name in names[:MAX_ENTRIES]]
    if len(names) > MAX_ENTRIES:
        lines.append(
            f"[{len(names) - MAX_ENTRIES} more entries not shown: list_dir shows the first "
            f"{MAX_ENTRIES} by name; the shell's ls lists them all]"
        )
    return "\n".join(lines)


def _entry_name(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return entry.name + "@"
    if entry.is_dir(follow_symlinks=False):
        return entry.name + "/"
    return entry.name
