"""Git's ignore rules, as the `grep_files` walk leaves ignored files out.

The rules come from `.gitignore` files (the workspace root's and any directory's below it, a
nested file's patterns relative to its directory) and from `.git/info/exclude`; pathspec's
`GitIgnoreSpec` matches them with git's semantics. Nothing above the workspace root is read:
the walk never leaves the workspace. A file that cannot be read or parsed (a directory or a
link named `.gitignore`, a pattern pathspec refuses, one too big) adds no rules: a search
never fails because of one.

The files are written by whoever wrote the workspace (a cloned repository, the model's shell),
and pathspec turns each pattern into a Python regular expression, which holds the GIL for the
whole of a match: `a*a*a*a*a*b` tested against a 255-character name took 14 s, the daemon's
event loop frozen meanwhile. So a pattern with more wildcards than ordinary ignore files use
is dropped (`_costly`), which keeps the worst match to milliseconds.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metis.core.tools.base import PermissionDenied
from metis.core.tools.files import open_checked
from metis.core.tools.sandbox import Sandbox

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

IGNORE_FILE = ".gitignore"
EXCLUDE_PATH = (".git", "info", "exclude")
# Ignore files are a few kilobytes; every entry of the walk is matched against all of their
# patterns, so a huge one would slow each entry (git itself reads up to 100 MB).
MAX_RULES_BYTES = 256 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Not following a link, as git does not for `.gitignore`; a FIFO opened without blocking.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class IgnoreRules:
    """The rules in force in one directory: one ignore file's patterns (`spec`), relative to the
    directory it lies in (`base`: its workspace-relative path with a trailing slash, "" for the
    root), and the rules of the files above it (`parent`). A deeper file is asked first, as in
    git, where it overrides the ones above; `.git/info/exclude` comes last."""

    spec: GitIgnoreSpec
    base: str
    parent: IgnoreRules | None


def ignored(rules: IgnoreRules | None, rel: str, is_dir: bool) -> bool:
    """Whether the entry at workspace-relative `rel` (below every rule's base) is ignored: the
    deepest file with a pattern matching it decides, and its last matching pattern within it
    (a `!pattern` re-includes). The caller walks down and does not enter an ignored directory:
    git's rule that nothing below one comes back, which a `!` pattern alone would break here."""
    path = rel + "/" if is_dir else rel  # a trailing slash lets `name/` patterns match
    while rules is not None:
        verdict = rules.spec.check_file(path[len(rules.base) :]).include
        if verdict is not None:
            return verdict
        rules = rules.parent
    return False


def with_directory(
    sandbox: Sandbox, dir_fd: int, base: str, rules: IgnoreRules | None
) -> IgnoreRules | None:
    """`rules` with those of the `.gitignore` in the open, checked directory `dir_fd` (workspace
    path `base`, "" or ending in a slash) put first."""
    spec = _read_spec(sandbox, dir_fd, IGNORE_FILE, base + IGNORE_FILE)
    return rules if spec is None else IgnoreRules(spec, base, rules)


def exclude_rules(sandbox: Sandbox, root_fd: int) -> IgnoreRules | None:
    """The rules of `.git/info/exclude` under the open, checked workspace root, if any."""
    fds: list[int] = []
    try:
        fd = root_fd
        for name in EXCLUDE_PATH[:-1]:
            fd = open_checked(sandbox, name, name, _DIR_FLAGS, dir_fd=fd)
            fds.append(fd)
        spec = _read_spec(sandbox, fd, EXCLUDE_PATH[-1], "/".join(EXCLUDE_PATH))
    except (OSError, PermissionDenied):
        return None
    finally:
        for opened in fds:
            os.close(opened)
    return None if spec is None else IgnoreRules(spec, "", None)


def _read_spec(sandbox: Sandbox, dir_fd: int, name: str, shown: str) -> GitIgnoreSpec | None:
    """The patterns of the file `name` in `dir_fd`, opened by name there and checked as every
    file the walk reads (the daemon's own files refused); None when there is none, or it cannot
    be read or parsed."""
    try:
        fd = open_checked(sandbox, name, shown, _FILE_FLAGS, dir_fd=dir_fd)
    except (OSError, PermissionDenied):
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            data = handle.read(MAX_RULES_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_RULES_BYTES:
        return None
    # Names are listed in the file system's encoding, undecodable bytes as surrogates (what
    # `os.scandir` gives); patterns decoded the same way match them byte for byte.
    text = data.decode("utf-8", "surrogateescape").removeprefix("\ufeff")
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    # imported at the first ignore file a search meets: an idle daemon does not hold pathspec's
    # thirty modules in memory
    from pathspec import GitIgnoreSpec

    try:
        spec = GitIgnoreSpec.from_lines([line for line in lines if not _costly(line)])
    except Exception:  # pathspec raises ValueError and re.error; none may fail a search
        return None
    return spec if spec.patterns else None


def _costly(line: str) -> bool:
    """Whether a pattern has enough wildcards for its regular expression to backtrack for
    seconds on a crafted path (measured against 255-character names and 4,000-character paths).
    A `**` component, and the implicit one before a pattern without a slash, can span
    directories; a `*` within a name cannot. At most one spanning wildcard with two `*`, or
    none with three, matched any such path within ~20 ms. Escaped or bracketed stars are counted
    too: a pattern is dropped a little early rather than kept too long."""
    body = line.removeprefix("!").rstrip("/")
    parts = body.split("/")
    spans = stars = 0
    after_any = False
    for i, part in enumerate(parts):
        if part == "**":
            if not after_any and i < len(parts) - 1:  # a trailing `/**` spans nothing more
                spans += 1
            after_any = True
        else:
            stars += part.count("*")
            after_any = False
    if "/" not in body and body != "**":
        spans += 1
    return stars > (3 if spans == 0 else 2) or spans > 1
