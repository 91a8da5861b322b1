"""`patch_file`: replace one exact, unique occurrence of a text.

An exact unique match (never a fuzzy one) means the model must quote the file as it is; the
refusal texts tell it how to recover. One difference is bridged: a model quoting a CRLF file
usually writes its line breaks as a bare LF, so a quote with LF breaks only that is not found
as it is is looked for with CRLF breaks, and the new text is written with them (also when the
quote matched as it is, in a file whose every break is CRLF). Bytes other than the replaced
span, line endings included, are written back unchanged.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import ToolContext, ToolError, ToolOutput
from metis.core.tools.builtins._common import object_schema, path_schema
from metis.core.tools.builtins.write_file import encode_text
from metis.core.tools.files import binary_file, is_binary, open_regular, replace_file
from metis.core.tools.sandbox import ResolvedPath, Sandbox, display
from metis.core.tools.textutil import count_lines, count_occurrences

DEFINITION = ToolDefinition(
    name="patch_file",
    title="Patch file",
    description=(
        "Edit a text file inside the workspace by replacing one exact occurrence of old_text "
        "with new_text. old_text must match the file exactly (whitespace and indentation "
        "included) and occur exactly once; include surrounding lines to make it unique."
    ),
    input_schema=object_schema(
        {
            "path": path_schema("File path, relative to the workspace root."),
            "old_text": {
                "type": "string",
                "minLength": 1,
                "description": "The exact text to replace; must occur exactly once.",
            },
            "new_text": {"type": "string", "description": "The replacement text."},
        },
        required=("path", "old_text", "new_text"),
    ),
    side_effects="write",
    path_fields=("path",),
)


class PatchFileTool:
    """The builtin `patch_file`: replaces one exact occurrence of `old_text` in a file, atomically."""

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        target = ctx.workspace.resolve(input["path"], write=True)
        old_text: str = input["old_text"]
        new_text: str = input["new_text"]
        if old_text == new_text:
            raise ToolError("old_text and new_text are identical.")
        encode_text(old_text, "old_text")
        encode_text(new_text, "new_text")
        line, crlf = await asyncio.to_thread(
            patch,
            ctx.workspace,
            target,
            old_text,
            new_text,
            ctx.limits.max_write_bytes,
            ctx.cancel_event.is_set,
        )
        path = display(target.rel)
        summary = f"line {line}: -{count_lines(old_text)} +{count_lines(new_text)} lines"
        if crlf:
            summary += "; line endings written as the file's \\r\\n"
        return ToolOutput.text(f"Patched {path} ({summary}).", files_modified=[target.rel])


def patch(
    sandbox: Sandbox,
    target: ResolvedPath,
    old_text: str,
    new_text: str,
    max_bytes: int,
    cancelled: Callable[[], bool],
) -> tuple[int, bool]:
    """Apply the replacement; return the 1-based line where `old_text` started and whether
    `new_text`'s line breaks were written as CRLF."""
    path = display(target.rel)
    fd, info = open_regular(sandbox, target)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        size = max(info.st_size, len(data))
        raise ToolError(f"{path} is {size} bytes; patch_file edits files up to {max_bytes} bytes.")
    if is_binary(data):
        raise binary_file(target.rel, len(data))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{path} is not valid UTF-8 text; patch_file cannot edit it.") from None
    matches = count_occurrences(text, old_text)
    crlf = matches == 0 and "\r\n" in text and _bare_lf(old_text)
    if crlf:
        old_text = old_text.replace("\n", "\r\n")
        matches = count_occurrences(text, old_text)
    # The new text takes CRLF breaks where the quote did, or where the file has only those.
    crlf_written = _bare_lf(new_text) and (crlf or _only_crlf(text))
    if crlf_written:
        new_text = new_text.replace("\n", "\r\n")
    if matches == 0:
        raise ToolError(
            f"old_text was not found in {path}. Read the file again and copy the text "
            "exactly, including whitespace."
        )
    if matches > 1:
        read_as = " (its line endings read as the file's \\r\\n)" if crlf else ""
        raise ToolError(
            f"old_text occurs {matches} times in {path}{read_as}; add surrounding lines so it "
            "matches exactly once."
        )
    start = text.index(old_text)
    result = (text[:start] + new_text + text[start + len(old_text) :]).encode("utf-8")
    if len(result) > max_bytes:
        raise ToolError(f"the patched {path} would be {len(result)} bytes, over {max_bytes}.")
    replace_file(sandbox, target, result, cancelled=cancelled)
    return text.count("\n", 0, start) + 1, crlf_written


def _bare_lf(text: str) -> bool:
    """Whether `text` breaks lines with LF alone: it has LFs and no CR (one holding a CR is
    taken as written)."""
    return "\n" in text and "\r" not in text


def _only_crlf(text: str) -> bool:
    """Whether every line break of `text` is CRLF (and it has one)."""
    breaks = text.count("\n")
    return breaks > 0 and text.count("\r\n") == breaks
