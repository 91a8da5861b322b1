"""`read_file`: a text file, or a window of its lines.

Lines are streamed with a bounded read per line, so neither a huge file nor a huge single line
is ever held in memory; the total line count is still reported so the model knows where it is.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import IO, Any

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import (
    DEFAULT_MAX_RESULT_BYTES,
    NOTE_ROOM_BYTES,
    ToolCancelled,
    ToolContext,
    ToolError,
    ToolOutput,
)
from metis.core.tools.builtins._common import object_schema, path_schema
from metis.core.tools.files import BINARY_SNIFF_BYTES, binary_file, is_binary, open_regular
from metis.core.tools.sandbox import ResolvedPath, Sandbox, display

DEFAULT_LIMIT = 2000
MAX_LIMIT = 5000
LINE_MAX_CHARS = 2000
# Enough bytes for LINE_MAX_CHARS + 1 characters of any UTF-8 text, so a line that fills this
# read is known to be longer than the cut.
_LINE_READ_BYTES = 4 * (LINE_MAX_CHARS + 1)
_SKIP_BYTES = 64 * 1024
_COUNT_BYTES = 1024 * 1024
_CANCEL_CHECK_LINES = 1000
_REPLACEMENT = "\ufffd"
_ENCODED_REPLACEMENT = _REPLACEMENT.encode()

DEFINITION = ToolDefinition(
    name="read_file",
    title="Read file",
    description=(
        "Read a UTF-8 text file inside the workspace. Returns the lines verbatim (no line "
        "numbers). Use offset (1-based first line) and limit (line count, default 2000) to "
        "read a large file in parts; a partial read ends with a note telling the next offset."
    ),
    input_schema=object_schema(
        {
            "path": path_schema("File path, relative to the workspace root."),
            "offset": {
                "type": "integer",
                "minimum": 1,
                "description": "First line to return, 1-based (default 1).",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "description": f"Number of lines to return (default {DEFAULT_LIMIT}).",
            },
        },
        required=("path",),
    ),
    side_effects="read",
    path_fields=("path",),
)


class ReadFileTool:
    """The builtin `read_file`: a text file, or a window of its lines with a note saying where it
    sits in the file."""

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        target = ctx.workspace.resolve(input["path"])
        offset = input.get("offset", 1)
        limit = input.get("limit", DEFAULT_LIMIT)
        text = await asyncio.to_thread(
            read_lines,
            ctx.workspace,
            target,
            offset,
            limit,
            ctx.cancel_event.is_set,
            ctx.limits.max_result_bytes,
        )
        return ToolOutput.text(text)


def read_lines(
    sandbox: Sandbox,
    target: ResolvedPath,
    offset: int,
    limit: int,
    cancelled: Callable[[], bool],
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
) -> str:
    """The result text for lines `offset .. offset+limit-1` of `target`, fewer when they would
    not fit the result cap: the cap would cut the text mid-line and the note with it, leaving
    the model no line number to continue from."""
    fd, info = open_regular(sandbox, target)
    with os.fdopen(fd, "rb") as handle:
        head = handle.read(BINARY_SNIFF_BYTES)
        if not head:
            return "[empty file]"
        if is_binary(head):
            raise binary_file(target.rel, info.st_size)
        handle.seek(0)
        budget = max(1, max_result_bytes - NOTE_ROOM_BYTES)
        shown, invalid, total = _window(handle, offset, offset + limit - 1, budget, cancelled)
    path = display(target.rel)
    if offset > total:
        raise ToolError(f"offset {offset} is past the end of {path} ({total} lines).")
    last = offset + len(shown) - 1
    notes: list[str] = []
    if invalid:
        notes.append(f"[{invalid} invalid UTF-8 sequences replaced]")
    if last < total:
        why = (
            f"; the next line would pass the {max_result_bytes}-byte result limit"
            if last < offset + limit - 1
            else ""
        )
        notes.append(f"[lines {offset}-{last} of {total}{why}; use offset={last + 1} to continue]")
    text = "".join(shown)
    if notes:
        if text and not text.endswith("\n"):
            text += "\n"
        text += "\n".join(notes)
    return text


def _window(
    handle: IO[bytes], first: int, last: int, budget: int, cancelled: Callable[[], bool]
) -> tuple[list[str], int, int]:
    """Render lines first..last, stopping before the first line past `budget` bytes (the first
    line is always shown); return them, the invalid-sequence count and the line total."""
    shown: list[str] = []
    used = 0
    invalid = 0
    number = 0
    unchecked = 0  # bytes read since cancel was last checked
    while True:
        chunk = handle.readline(_LINE_READ_BYTES)
        if not chunk:
            return shown, invalid, number
        number += 1
        unchecked += len(chunk)
        if number % _CANCEL_CHECK_LINES == 0 or unchecked >= _COUNT_BYTES:
            unchecked = 0
            if cancelled():
                raise ToolCancelled()
        long_line = len(chunk) == _LINE_READ_BYTES and not chunk.endswith(b"\n")
        ended = chunk.endswith(b"\n")
        if long_line:
            ended = _skip_rest_of_line(handle, cancelled)
        if number >= first:
            text, bad = _render(chunk, ended, long_line)
            used += len(text.encode("utf-8"))
            if shown and used > budget:
                return shown, invalid, number + _count_remaining(handle, cancelled)
            shown.append(text)
            invalid += bad
        if number == last:
            return shown, invalid, number + _count_remaining(handle, cancelled)


def _render(chunk: bytes, ended: bool, long_line: bool) -> tuple[str, int]:
    """One line verbatim, its ending kept; cut after LINE_MAX_CHARS characters."""
    body = chunk[:-1] if chunk.endswith(b"\n") else chunk
    ending = "\n" if ended else ""
    if body.endswith(b"\r") and not long_line:
        body, ending = body[:-1], "\r\n"
    text, bad = _decode(body)
    if len(text) > LINE_MAX_CHARS:
        return text[:LINE_MAX_CHARS] + "[… line truncated]" + ending, bad
    return text + ending, bad


def _decode(body: bytes) -> tuple[str, int]:
    """`body` decoded with `errors="replace"`, and the invalid sequences replaced within the
    characters shown (the first LINE_MAX_CHARS).

    The codec replaces in C; a Python loop that stepped from one decode error to the next cost
    about a microsecond per invalid byte, a minute for a large file of them. A U+FFFD the file
    itself holds is no invalid sequence, so the bytes are split at each encoded U+FFFD and only
    the U+FFFDs inside the pieces are counted: a piece decodes alone as it does in place,
    because U+FFFD's lead byte can never continue a sequence.

    A long line's read may end inside a sequence, but never within the characters shown:
    `_LINE_READ_BYTES` holds more than LINE_MAX_CHARS characters, valid or replaced, and a
    character depends on at most the 3 bytes after its start.
    """
    pieces = [piece.decode("utf-8", "replace") for piece in body.split(_ENCODED_REPLACEMENT)]
    bad = 0
    room = LINE_MAX_CHARS
    for piece in pieces:
        if room <= 0:
            break
        bad += piece.count(_REPLACEMENT, 0, room)
        room -= len(piece) + 1
    return _REPLACEMENT.join(pieces), bad


def _skip_rest_of_line(handle: IO[bytes], cancelled: Callable[[], bool]) -> bool:
    """Discard the rest of an over-long line; True when it ended with a newline. A line can be
    as long as the file (a sparse file of a terabyte), so cancel is checked at every step: a
    call that timed out must not keep its thread reading for minutes."""
    while True:
        more = handle.readline(_SKIP_BYTES)
        if not more:
            return False
        if more.endswith(b"\n"):
            return True
        if cancelled():
            raise ToolCancelled()


def _count_remaining(handle: IO[bytes], cancelled: Callable[[], bool]) -> int:
    """Lines after the current position (which is at the start of a line)."""
    count = 0
    last = b""
    while block := handle.read(_COUNT_BYTES):
        if cancelled():
            raise ToolCancelled()
        count += block.count(b"\n")
        last = block[-1:]
    return count + (1 if last and last != b"\n" else 0)
