"""A table for a terminal: the app's notes and the commands' listings align and wrap alike."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence


def table_lines(rows: Sequence[tuple[str, ...]], width: int | None) -> list[str]:
    """Rows in aligned columns, two spaces apart, for `width` columns (None: as wide as they
    are, for a pipe). A row too wide has its last cell wrapped within its column or, with
    little room there, on lines of its own below, indented (left to the terminal, it wrapped
    back to the left edge, where it read as a row of its own)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    start = sum(w + 2 for w in widths[:-1])  # where the last column starts
    lines = []
    for row in rows:
        head = "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=False))
        if width is None or start + len(row[-1]) <= width:
            lines.append(f"{head}  {row[-1]}".rstrip())
        elif width - start >= 24:
            first, *rest = textwrap.wrap(row[-1], width - start) or [""]
            lines.append(f"{head}  {first}")
            lines.extend(" " * start + part for part in rest)
        else:
            lines.append(head.rstrip())
            lines.extend("    " + part for part in textwrap.wrap(row[-1], max(16, width - 4)))
    return lines
