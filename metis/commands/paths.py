"""Paths as a person reads them where room is short: a status bar, a listing's line."""

from __future__ import annotations

from pathlib import Path

from metis.commands.columns import columns, cut_start


def short_path(path: str, limit: int, home: str | None = None) -> str:
    """`path` in at most `limit` terminal columns: the home directory as ~, then whole
    directories elided from the middle (`~/code/…/tui/widgets`), then the last
    name's end."""
    home = str(Path.home()) if home is None else home.rstrip("/")
    if home and (path == home or path.startswith(home + "/")):
        path = "~" + path[len(home) :]
    if columns(path) <= limit:
        return path
    parts = path.split("/")
    head, tail = parts[0], parts[1:]
    if head == "" and tail:  # an absolute path: keep its first directory
        head, tail = "/" + tail[0], tail[1:]
    kept: list[str] = []
    while tail and columns(head) + len("/…/") + columns("/".join([tail[-1], *kept])) <= limit:
        kept.insert(0, tail.pop())
    if kept and tail:
        return f"{head}/…/{'/'.join(kept)}"
    return cut_start(parts[-1], limit) if limit > 1 else "…"
