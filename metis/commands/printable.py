"""A value made safe to print on one terminal line.

Its own module, apart from `paths`: the daemon's start-up banner needs it, and `paths` brings
the terminal column measure (`rich`'s tables), which a daemon serving no terminal should not
keep in memory."""

from __future__ import annotations

from metis.core.tools.textutil import visible_controls


def printable(value: object) -> str:
    """A path (or a stored value) as one line should print it: a path may hold any character
    but `/` and NUL, an escape sequence would rewrite the user's screen, and a newline or a tab
    would split a line or a field (written `\\n`, `\\t`, as control characters are)."""
    return visible_controls(str(value)).replace("\n", "\\n").replace("\t", "\\t")
