"""Small text helpers shared by result texts, summaries and the file tools."""

from __future__ import annotations

import codecs
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


def decode_utf8(data: bytes, *, final: bool = True) -> tuple[str, list[int]]:
    """Decode like `errors="replace"` and also report where each U+FFFD was inserted.

    With `final=False` an incomplete sequence at the very end is dropped instead of replaced,
    for data cut at an arbitrary byte. The positions let a caller count only the invalid
    sequences that survive a later character cut. Slices are memoryviews, so a text full of
    invalid bytes still decodes in linear time.
    """
    view = memoryview(data)
    parts: list[str] = []
    replaced: list[int] = []
    size = 0
    pos = 0
    while pos < len(view):
        try:
            text, _ = codecs.utf_8_decode(view[pos:], "strict", True)
        except UnicodeDecodeError as exc:
            good, _ = codecs.utf_8_decode(view[pos : pos + exc.start], "strict", True)
            parts.append(good)
            size += len(good)
            if not final and exc.reason == "unexpected end of data":
                break
            parts.append("\ufffd")
            replaced.append(size)
            size += 1
            pos += exc.end
            continue
        parts.append(text)
        break
    return "".join(parts), replaced
