"""`grep_files`: regex search over workspace files.

The walk (directory listing, symlink and size checks) runs in a worker thread; matching runs
in a child process (`_grep_search.py`) because `re` holds the GIL during a match, so only a
process can be stopped when a pathological pattern runs past the read timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import ToolCancelled, ToolContext, ToolError, ToolOutput
from metis.core.tools.builtins._common import object_schema, path_schema
from metis.core.tools.sandbox import (
    ResolvedPath,
    Sandbox,
    UnresolvablePath,
    bounded_realpath,
    display,
    is_within,
)

SKIP_DIRS = frozenset(
    {
        ".git",
        "node_modules",
        ".venv",
        "venv",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        "dist",
        "build",
        ".cache",
        ".next",
    }
)
MAX_FILE_BYTES = 2 * 1024 * 1024
_WORKER = str(Path(__file__).with_name("_grep_search.py"))
_CANCEL_CHECK_ENTRIES = 256

DEFINITION = ToolDefinition(
    name="grep_files",
    title="Search files",
    description=(
        "Search the text files under a workspace directory (or one file) for a Python "
        "regular expression. Prints path:line: text per match, sorted by path and line. "
        "Dependency, cache and build directories (.git, node_modules, .venv, dist, …), "
        "binary files and files over 2 MiB are skipped."
    ),
    input_schema=object_schema(
        {
            "pattern": {
                "type": "string",
                "minLength": 1,
                "maxLength": 1000,
                "description": "Python regular expression, searched within each line.",
            },
            "path": path_schema(
                "Directory or file to search, relative to the workspace root.", default="."
            ),
            "glob": {
                "type": "string",
                "maxLength": 256,
                "description": "Only files whose relative path or name matches, e.g. *.py.",
            },
            "ignore_case": {"type": "boolean", "default": False},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 500, "default": 100},
        },
        required=("pattern",),
    ),
    side_effects="read",
    path_fields=("path",),
)


class GrepFilesTool:
    """The builtin `grep_files`: the regular expression is compiled off the loop and the search runs
    in a child process, so a catastrophic pattern can be stopped."""

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        pattern: str = input["pattern"]
        ignore_case: bool = input.get("ignore_case", False)
        try:  # off the loop: compiling a crafted pattern can take seconds (pure Python)
            await asyncio.to_thread(re.compile, pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            raise ToolError(f"Invalid regular expression: {exc}") from None
        target = ctx.workspace.resolve(input.get("path", "."))
        files = await asyncio.to_thread(
            collect_files, ctx.workspace, target, input.get("glob"), ctx.cancel_event.is_set
        )
        if not files:
            return ToolOutput.text("No matches.")
        request = {
            "pattern": pattern,
            "ignore_case": ignore_case,
            "max_results": input.get("max_results", 100),
            "max_file_bytes": MAX_FILE_BYTES,
            "files": files,
        }
        reply = await _search_in_child(request, ctx)
        return ToolOutput.text(_format(reply["matches"], reply["stopped"]))


def _format(matches: list[list[Any]], stopped: bool) -> str:
    if not matches:
        return "No matches."
    files = len({m[0] for m in matches})
    header = f"{len(matches)} matches in {files} files"
    if stopped:
        header += " (stopped at max_results)"
    lines = [header]
    lines.extend(f"{display(rel, 1000)}:{number}: {text}" for rel, number, text in matches)
    return "\n".join(lines)


def collect_files(
    sandbox: Sandbox, target: ResolvedPath, glob: str | None, cancelled: Callable[[], bool]
) -> list[tuple[str, str]]:
    """Candidate files as (workspace-relative path, real path), sorted by relative path."""
    try:
        info = os.stat(target.real)
    except FileNotFoundError:
        raise ToolError(f"Path not found: {display(target.rel)}") from None
    if stat.S_ISREG(info.st_mode):
        found = [(target.rel, target.real)] if info.st_size <= MAX_FILE_BYTES else []
    elif stat.S_ISDIR(info.st_mode):
        found = _walk(sandbox, target.real, cancelled)
    else:
        raise ToolError(f"{display(target.rel)} is not a regular file or directory.")
    if glob:
        found = [
            (rel, real)
            for rel, real in found
            if fnmatch.fnmatchcase(rel, glob) or fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], glob)
        ]
    return sorted(found)


def _walk(sandbox: Sandbox, top: str, cancelled: Callable[[], bool]) -> list[tuple[str, str]]:
    """Regular files under `top`; directory symlinks are never followed, and a file symlink
    counts only when its target is a regular file inside the workspace."""
    found: list[tuple[str, str]] = []
    pending = [top]
    seen = 0
    while pending:
        directory = pending.pop()
        try:
            scan = os.scandir(directory)
        except OSError:
            continue
        with scan:
            for entry in scan:
                seen += 1
                if seen % _CANCEL_CHECK_ENTRIES == 0 and cancelled():
                    raise ToolCancelled()
                real = _candidate(sandbox, entry, pending)
                if real is not None:
                    found.append((sandbox.relative(entry.path), real))
    return found


def _candidate(sandbox: Sandbox, entry: os.DirEntry[str], pending: list[str]) -> str | None:
    """The real path to search for `entry`, queueing subdirectories; None to skip it."""
    try:
        if entry.is_symlink():
            real = bounded_realpath(entry.path)
            if not is_within(sandbox.root, real) or sandbox.in_metis_home(real):
                return None
            info = os.stat(real)
        elif entry.is_dir(follow_symlinks=False):
            if entry.name not in SKIP_DIRS and not sandbox.in_metis_home(entry.path):
                pending.append(entry.path)
            return None
        else:
            real = entry.path
            info = entry.stat(follow_symlinks=False)
            if info.st_nlink > 1 and sandbox.in_metis_home(real):  # a hard link to its files
                return None
    except (OSError, UnresolvablePath):
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
        return None
    return real


async def _search_in_child(request: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Run the matcher process; kill it as soon as the call is cancelled or abandoned."""
    payload = json.dumps(request).encode("ascii")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        _WORKER,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={},
    )
    talk = asyncio.ensure_future(proc.communicate(payload))
    stop = asyncio.ensure_future(ctx.cancel_event.wait())
    try:
        await asyncio.wait({talk, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not talk.done():
            raise ToolCancelled()
        out, err = talk.result()
    finally:
        stop.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            talk.cancel()
            await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"grep worker exited with {proc.returncode}: {err.decode()[-500:]}")
    reply: dict[str, Any] = json.loads(out)
    return reply
