"""Small text helpers shared by result texts, summaries and the file tools."""

from __future__ import annotations

import re


def count_lines(text: str) -> int:
    """Lines of a text: `"a"` and `"a\\n"` are one line, `""` is none."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def count_occurrences(text: str, sub: str) -> int:
    """Positions where `sub` starts in `text`, overlapping ones included.

    `str.count` skips overlaps (`"aaa".count("aa") == 1`), which would call an ambiguous
    `patch_file` match unique although `old_text` stands at two positions.
    """
    count, start = 0, text.find(sub)
    while start != -1:
        count += 1
        start = text.find(sub, start + 1)
    return count


def cut(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, ending in `…` when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Characters that can rewrite what a terminal shows (carriage return, escape sequences, C1
# controls, bidi overrides): model-written text shown for a confirmation must show them, not
# obey them, or the prompt could display one command while another runs.
_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible_controls(text: str) -> str:
    """`text` with terminal control characters escaped (`\\r`, `\\x1b`); newlines and tabs
    are kept."""
    return _TERMINAL_CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)


def one_line(text: str, limit: int) -> str:
    """Whitespace runs (newlines included) collapsed to one space, then cut to `limit`."""
    return cut(" ".join(text.split()), limit)


def seconds(value: float) -> str:
    """`1` for 1.0, `0.5` for 0.5: timeouts read naturally in result texts."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
