"""`grep_files`: regex search over workspace files.

The walk (directory listing, symlink and size checks) runs in a worker thread; matching runs
in a child process (`_grep_search.py`) because `re` holds the GIL during a match, so only a
process can be stopped when a pathological pattern runs past the read timeout.

The child opens each file by path tens of milliseconds after the walk checked it, while the
model's shell may swap a directory on that path for a link (to METIS_HOME, say). So the walk
hands over each file's device and inode as checked, and the child reads a file only if what it
opened is that very file, at the same real path (`_grep_search.py`).

What git ignores (`.gitignore` files, `.git/info/exclude`; `gitignore.py`) the walk leaves
out, as a user of ripgrep-like search expects, unless the model asks for ignored files too; a
directory or file it names in `path` is searched all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import (
    PermissionDenied,
    ToolCancelled,
    ToolContext,
    ToolError,
    ToolOutput,
)
from metis.core.tools.builtins._common import object_schema, path_schema
from metis.core.tools.files import (
    BINARY_SNIFF_BYTES,
    binary_file,
    is_binary,
    open_checked,
    open_regular,
)
from metis.core.tools.gitignore import IgnoreRules, exclude_rules, ignored, with_directory
from metis.core.tools.globmatch import glob_matches
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
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# The target is opened only to be checked and stat'ed: Linux's O_PATH neither reads nor blocks.
_LOOK_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_NONBLOCK | os.O_CLOEXEC

CheckedFile = tuple[str, str, int, int]
"""A file to search: workspace-relative path, real path, and the device and inode it had when
checked (the matcher reads only that very file)."""

DEFINITION = ToolDefinition(
    name="grep_files",
    title="Search files",
    description=(
        "Search the text files under a workspace directory (or one file) for a Python "
        "regular expression. Prints path:line: text per match, sorted by path and line. "
        "Dependency, cache and build directories (.git, node_modules, .venv, dist, …), "
        "binary files and files over 2 MiB are skipped, and so is what .gitignore files (and "
        ".git/info/exclude) ignore, unless include_ignored is true; a directory or file given "
        "as path is searched even if ignored."
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
                "description": (
                    "Only files whose path (from the workspace root) or name matches: * and ? "
                    "within one name, ** for any number of directories, e.g. *.py, "
                    "src/**/*.ts."
                ),
            },
            "ignore_case": {"type": "boolean", "default": False},
            "include_ignored": {
                "type": "boolean",
                "default": False,
                "description": "Also search files that .gitignore rules leave out.",
            },
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
        left_out = LeftOut()
        files = await asyncio.to_thread(
            collect_files,
            ctx.workspace,
            target,
            input.get("glob"),
            ctx.cancel_event.is_set,
            include_ignored=input.get("include_ignored", False),
            left_out=left_out,
        )
        max_results = input.get("max_results", 100)
        text = await search_files(files, pattern, ignore_case, max_results, ctx, left_out)
        return ToolOutput.text(text)


@dataclass
class LeftOut:
    """What the walk left out by git's ignore rules: files (those the glob selects) and
    directories, not entered, so what they hold is not counted."""

    files: int = 0
    dirs: int = 0

    def no_matches(self) -> str:
        """The answer when nothing matched: it says when ignored files might have, so that a
        model does not take "No matches." for the whole workspace."""
        if not self.files and not self.dirs:
            return "No matches."
        counts = []
        if self.files:
            counts.append(f"{self.files} file{'' if self.files == 1 else 's'}")
        if self.dirs:
            counts.append(f"{self.dirs} director{'y' if self.dirs == 1 else 'ies'}")
        return (
            f"No matches ({' and '.join(counts)} ignored by .gitignore; "
            "include_ignored=true searches them)."
        )


async def search_files(
    files: list[CheckedFile],
    pattern: str,
    ignore_case: bool,
    max_results: int,
    ctx: ToolContext,
    left_out: LeftOut | None = None,
) -> str:
    """The result text of a search of `files` (from `collect_files`) in the matcher process;
    `left_out`, what ignore rules kept from the search, is named when nothing matched."""
    no_matches = left_out.no_matches() if left_out else "No matches."
    if not files:
        return no_matches
    request = {
        "pattern": pattern,
        "ignore_case": ignore_case,
        "max_results": max_results,
        "max_file_bytes": MAX_FILE_BYTES,
        "files": files,
    }
    reply = await _search_in_child(request, ctx)
    text = _format(reply["matches"], reply["stopped"], no_matches)
    return text + _changed_note(reply["changed"])


# The most names of files changed mid-search the result lists.
_CHANGED_NAMES = 5


def _changed_note(changed: list[str]) -> str:
    """A line naming the files that were not searched because they changed between the walk
    and the read (a write replacing one, in the same batch of calls): without it, "No matches."
    would claim a file that holds the pattern does not."""
    if not changed:
        return ""
    names = ", ".join(display(rel) for rel in changed[:_CHANGED_NAMES])
    more = f" and {len(changed) - _CHANGED_NAMES} more" if len(changed) > _CHANGED_NAMES else ""
    count = f"{len(changed)} file{'s' if len(changed) > 1 else ''}"
    return f"\n({count} changed during the search and not searched: {names}{more})"


def _format(matches: list[list[Any]], stopped: bool, no_matches: str) -> str:
    if not matches:
        return no_matches
    files = len({m[0] for m in matches})
    header = f"{len(matches)} matches in {files} files"
    if stopped:
        header += " (stopped at max_results)"
    lines = [header]
    lines.extend(f"{display(rel, 1000)}:{number}: {text}" for rel, number, text in matches)
    return "\n".join(lines)


def collect_files(
    sandbox: Sandbox,
    target: ResolvedPath,
    glob: str | None,
    cancelled: Callable[[], bool],
    *,
    include_ignored: bool = False,
    left_out: LeftOut | None = None,
) -> list[CheckedFile]:
    """Candidate files, sorted by relative path. `target` itself is opened and checked by what
    the kernel opened, and refused as `resolve` would refuse it. Below a directory, what git's
    ignore rules ignore is left out (counted in `left_out`) unless `include_ignored`; `target`
    itself is searched whatever they say."""
    info = _checked_stat(sandbox, target)
    if stat.S_ISREG(info.st_mode):
        _check_searchable(sandbox, target, info)
        found = [_checked(target.rel, target.real, info)]
    elif stat.S_ISDIR(info.st_mode):
        walk = _Walk(sandbox, cancelled, glob, left_out or LeftOut())
        if include_ignored:
            walk.run(target.real, None, honour=False)
        else:
            walk.run(target.real, _rules_above(sandbox, target), honour=True)
        found = walk.found
    else:
        raise ToolError(f"{display(target.rel)} is not a regular file or directory.")
    if glob:
        found = [file for file in found if glob_matches(file[0], glob)]
    return sorted(found)


def _rules_above(sandbox: Sandbox, target: ResolvedPath) -> IgnoreRules | None:
    """The ignore rules in force in the directory `target` from the files above it (its own is
    read by the walk): `.git/info/exclude` and each `.gitignore` from the workspace root down.
    Should they ignore `target` or a directory on its way, none: the model named a directory a
    search from the root would not enter, and gets it searched with the rules found inside it
    only (those above, by git's rule, would leave out everything below it)."""
    rules: IgnoreRules | None = None
    base = ""
    try:
        fd = open_checked(sandbox, sandbox.root, ".", _DIR_FLAGS)
    except (OSError, PermissionDenied):
        return None
    try:
        rules = exclude_rules(sandbox, fd)
        for name in [] if target.rel == "." else target.rel.split("/"):
            rules = with_directory(sandbox, fd, base, rules)
            if ignored(rules, base + name, is_dir=True):
                return None
            base += name + "/"
            parent, fd = fd, -1
            try:  # by name in the directory checked: nothing on the way can be swapped
                fd = open_checked(sandbox, name, base, _DIR_FLAGS, dir_fd=parent)
            finally:
                os.close(parent)
    except (OSError, PermissionDenied):
        return rules  # gone meanwhile: the walk of `target` finds nothing to search
    finally:
        if fd >= 0:
            os.close(fd)
    return rules


def _check_searchable(sandbox: Sandbox, target: ResolvedPath, info: os.stat_result) -> None:
    """Refuse, saying why, a file the model named that the matcher would skip (too big,
    binary): skipped quietly, it would be reported as holding no match."""
    if info.st_size > MAX_FILE_BYTES:
        raise ToolError(
            f"{display(target.rel)} is {info.st_size} bytes; grep_files searches files up to "
            f"{MAX_FILE_BYTES} bytes. Search it with the shell's grep, or read it in parts "
            "with read_file."
        )
    fd, _ = open_regular(sandbox, target)
    with os.fdopen(fd, "rb") as handle:
        if is_binary(handle.read(BINARY_SNIFF_BYTES)):
            raise binary_file(target.rel, info.st_size)


def _checked_stat(sandbox: Sandbox, target: ResolvedPath) -> os.stat_result:
    """The stat of what `target` names now (`_opened_stat`); a missing one said as such."""
    try:
        return _opened_stat(sandbox, target.real, target.rel)
    except FileNotFoundError:
        raise ToolError(f"Path not found: {display(target.rel)}{_glob_hint(target.rel)}") from None


_GLOB_CHARS = frozenset("*?[")


def _glob_hint(rel: str) -> str:
    """For a missing path that is a glob (`src/*.py`): how to ask for it, since a model often
    puts the pattern in `path` and would otherwise only hear that no such file exists."""
    parts = rel.split("/")
    first = next((i for i, part in enumerate(parts) if _GLOB_CHARS & set(part)), None)
    if first is None:
        return ""
    directory = "/".join(parts[:first]) or "."
    pattern = "/".join(parts[first:])
    return (
        " (path names one directory or file; to pick files by a pattern, give "
        f'path="{display(directory)}" and glob="{display(pattern)}")'
    )


def _opened_stat(sandbox: Sandbox, real: str, shown: str) -> os.stat_result:
    """The stat of the file `real` names now, opened and checked by what the kernel opened (a
    stat by path could follow a directory swapped for a link meanwhile and record another
    file's identity as the one checked)."""
    fd = open_checked(sandbox, real, shown, _LOOK_FLAGS)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def _checked(rel: str, real: str, info: os.stat_result) -> CheckedFile:
    """A file for the matcher, with the identity it had when checked."""
    return (rel, real, info.st_dev, info.st_ino)


class _Walk:
    """A walk for regular files under a directory (`run`), with what it found and, when it
    honours git's ignore rules, what they left out."""

    def __init__(
        self, sandbox: Sandbox, cancelled: Callable[[], bool], glob: str | None, left_out: LeftOut
    ) -> None:
        self.sandbox = sandbox
        self.cancelled = cancelled
        self.glob = glob
        self.left_out = left_out
        self.found: list[CheckedFile] = []

    def run(self, top: str, rules: IgnoreRules | None, *, honour: bool) -> None:
        """Each directory is opened without following a link and checked by what the kernel
        opened (one swapped for a link since it was listed is skipped); its entries are looked
        at through that fd. Directory symlinks are never followed, and a file symlink counts
        only when its target is a regular file inside the workspace. With `honour`, each
        directory's `.gitignore` is read once, through that fd, when it is opened, and its rules
        (`rules` those of the directories above `top`) go down with its subdirectories."""
        sandbox = self.sandbox
        pending: list[tuple[str, IgnoreRules | None]] = [(top, rules)]
        seen = 0
        while pending:
            directory, rules = pending.pop()
            try:
                fd = open_checked(sandbox, directory, directory, _DIR_FLAGS)
            except (OSError, PermissionDenied):
                continue
            try:
                base = ""
                if honour:
                    rel = sandbox.relative(directory)
                    base = "" if rel == "." else rel + "/"
                    rules = with_directory(sandbox, fd, base, rules)
                with os.scandir(fd) as scan:
                    for entry in scan:
                        seen += 1
                        if seen % _CANCEL_CHECK_ENTRIES == 0 and self.cancelled():
                            raise ToolCancelled()
                        path = os.path.join(directory, entry.name)
                        if honour and self._ignored(entry, path, base + entry.name, rules):
                            continue
                        candidate = _candidate(sandbox, entry, path, pending, rules)
                        if candidate is not None:
                            self.found.append(_checked(sandbox.relative(path), *candidate))
            finally:
                os.close(fd)

    def _ignored(
        self, entry: os.DirEntry[str], path: str, rel: str, rules: IgnoreRules | None
    ) -> bool:
        """Whether git's rules ignore `entry` (at `path`, workspace path `rel`), counting it if
        so. A directory the walk skips anyway (SKIP_DIRS, METIS_HOME) is not counted: asking for
        ignored files would not search it either."""
        if rules is None:
            return False
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            return False  # left to `_candidate`, which skips what it cannot look at
        if is_dir and entry.name in SKIP_DIRS:
            return False
        if not ignored(rules, rel, is_dir):
            return False
        if is_dir:
            if not self.sandbox.in_metis_home(path):
                self.left_out.dirs += 1
        elif not self.glob or glob_matches(rel, self.glob):
            self.left_out.files += 1
        return True


def _candidate(
    sandbox: Sandbox,
    entry: os.DirEntry[str],
    path: str,
    pending: list[tuple[str, IgnoreRules | None]],
    rules: IgnoreRules | None,
) -> tuple[str, os.stat_result] | None:
    """The real path to search for `entry` (at `path`) and its stat, queueing subdirectories
    with the ignore `rules` in force where they lie; None to skip it."""
    try:
        if entry.is_symlink():
            real = bounded_realpath(path)
            if not is_within(sandbox.root, real):
                return None
            info = _opened_stat(sandbox, real, path)  # the file's identity as checked
        elif entry.is_dir(follow_symlinks=False):
            if entry.name not in SKIP_DIRS and not sandbox.in_metis_home(path):
                pending.append((path, rules))
            return None
        else:
            real = path
            info = entry.stat(follow_symlinks=False)
    except (OSError, UnresolvablePath, PermissionDenied):
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
        return None
    if sandbox.in_metis_home(real, info):  # a hard link to its files included
        return None
    return real, info


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
