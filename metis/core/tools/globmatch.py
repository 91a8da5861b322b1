"""Glob matching of workspace-relative paths, as `grep_files` filters its files.

`fnmatch` alone reads `**/*.py` as "something, a slash, then a .py name", so the files at
the top of the workspace, the ones a model asking for every Python file wants first, did not
match. Here a pattern is matched one path component at a time: `*`, `?` and `[…]` stay within
one name, and a `**` component stands for any number of directories, none included.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

ANY_DIRS = "**"


def glob_matches(rel: str, glob: str) -> bool:
    """Whether the POSIX relative path `rel` matches `glob`, whole or by its last name (so
    `*.py` finds Python files at any depth)."""
    parts = rel.split("/")
    if fnmatchcase(parts[-1], glob):
        return True
    pattern = glob.removeprefix("./").split("/")
    return _components_match(parts, pattern)


def _components_match(parts: list[str], pattern: list[str]) -> bool:
    """The path's components against the pattern's, a `**` taking zero or more of them. The
    set of pattern positions reachable after each component is carried forward, so the cost is
    components × pattern length whatever the pattern (never a regex's backtracking)."""
    states = _skip_any_dirs({0}, pattern)
    for part in parts:
        reached: set[int] = set()
        for i in states:
            if i == len(pattern):
                continue
            if pattern[i] == ANY_DIRS:
                reached.add(i)  # `**` takes this component and may take more
            elif fnmatchcase(part, pattern[i]):
                reached.add(i + 1)
        if not reached:
            return False
        states = _skip_any_dirs(reached, pattern)
    return len(pattern) in states


def _skip_any_dirs(states: set[int], pattern: list[str]) -> set[int]:
    """`states` plus the positions reached by letting each `**` there take no component."""
    out = set(states)
    for i in sorted(states):
        while i < len(pattern) and pattern[i] == ANY_DIRS:
            i += 1
            out.add(i)
    return out
