"""Text measured as a terminal lays it out: in columns, where a CJK character or most emoji
take two and a combining mark none. A line cut or padded by characters instead overflows its
row (and wraps) or falls short of it; Rich's cell widths (the terminal app's) are the
measure."""

from __future__ import annotations

from rich.cells import cell_len, chop_cells


def columns(text: str) -> int:
    """How many terminal columns `text` takes."""
    return cell_len(text)


def cut(line: str, width: int) -> str:
    """`line` in at most `width` columns: a longer one ends in "…" where it was cut, never in
    half a wide character."""
    if cell_len(line) <= width:
        return line
    if width < 1:
        return ""
    return (chop_cells(line, width - 1)[0] if width > 1 else "") + "…"


def cut_start(text: str, width: int) -> str:
    """`text` in at most `width` columns, keeping its end (a file name's): "…" then as much
    of the end as fits."""
    if cell_len(text) <= width:
        return text
    if width < 1:
        return ""
    room, start = width - 1, len(text)
    while start and cell_len(text[start - 1]) <= room:
        start -= 1
        room -= cell_len(text[start])
    return "…" + text[start:]


def pad(text: str, width: int) -> str:
    """`text` with spaces after it to fill `width` columns (`str.ljust` counts characters)."""
    return text + " " * max(width - cell_len(text), 0)
