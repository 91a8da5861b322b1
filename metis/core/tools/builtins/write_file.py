"""`write_file`: create or replace a text file atomically."""

from __future__ import annotations

import asyncio
from typing import Any

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import ToolContext, ToolError, ToolOutput
from metis.core.tools.builtins._common import object_schema, path_schema
from metis.core.tools.files import replace_file
from metis.core.tools.sandbox import display

DEFINITION = ToolDefinition(
    name="write_file",
    title="Write file",
    description=(
        "Create a text file inside the workspace, or replace its whole content. Missing "
        "parent directories are created. To change part of an existing file prefer "
        "patch_file."
    ),
    input_schema=object_schema(
        {
            "path": path_schema("File path, relative to the workspace root."),
            "content": {"type": "string", "description": "The complete new file content."},
        },
        required=("path", "content"),
    ),
    side_effects="write",
    path_fields=("path",),
)


def encode_text(text: str, what: str) -> bytes:
    """UTF-8 bytes of model-supplied text; a lone surrogate is the model's error, not ours."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError(
            f"{what} is not valid Unicode text (it contains a lone surrogate)."
        ) from None


class WriteFileTool:
    """The builtin `write_file`: creates or replaces a whole file atomically, within
    `max_write_bytes`."""

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        path: str = input["path"]
        if path.endswith("/"):  # resolved, `notes/` would become a file called `notes`
            shown = display(path)
            raise ToolError(
                f'{shown} ends with "/", so it names a directory; write_file needs the path of '
                f"a file (e.g. {shown}file.txt)."
            )
        target = ctx.workspace.resolve(path, write=True)
        data = encode_text(input["content"], "content")
        limit = ctx.limits.max_write_bytes
        if len(data) > limit:
            raise ToolError(
                f"content is {len(data)} bytes; write_file accepts at most {limit} bytes."
            )
        created = await asyncio.to_thread(
            replace_file, ctx.workspace, target, data, cancelled=ctx.cancel_event.is_set
        )
        how = "created" if created else "replaced"
        return ToolOutput.text(
            f"Wrote {len(data)} bytes to {display(target.rel)} ({how}).",
            files_modified=[target.rel],
        )
