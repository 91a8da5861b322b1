"""An MCP server's tools as registry entries: names, schemas, validation, calls and results.

A tool is offered as `mcp__<server>__<tool>` with the server's own JSON Schema. Input is
validated against that schema (JSON Schema, the dialect it declares, 2020-12 by default)
before the confirmation step, like a builtin's; the server then receives exactly what the
model sent. Results map to canonical result blocks: text as text, images as images (within
the image limits), embedded text resources as text, anything else as a short note.

Validation runs on the event loop, on a schema the server wrote and input the model wrote, so
it must stay cheap whatever either holds: `jsonschema_rs` matches `pattern`s with a regex engine
that cannot backtrack without bound (a `(a+)+$` takes microseconds, not minutes), and a schema
is self-contained: a `$ref` to another document is never fetched, its tool is skipped.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jsonschema_rs
import mcp_types

from metis.core.canonical.content import (
    IMAGE_MEDIA_TYPES,
    MAX_IMAGE_BYTES,
    Base64Source,
    ImageBlock,
    TextBlock,
)
from metis.core.canonical.redaction import redact
from metis.core.canonical.tools import SideEffects, ToolDefinition
from metis.core.tools.base import (
    ResultBlock,
    ToolCancelled,
    ToolContext,
    ToolError,
    ToolOutput,
    ToolTimedOut,
)
from metis.core.tools.registry import RegisteredTool
from metis.core.tools.results import mcp_timeout_note
from metis.core.tools.schema import MAX_ERRORS, InputError, InputValidation
from metis.core.tools.summary import MCP_PREFIX

if TYPE_CHECKING:
    from metis.core.tools.mcp.server import McpServer

MAX_NAME = 64
_UNSAFE = re.compile(r"[^a-z0-9_]")


def tool_name(server_key: str, tool: str) -> str:
    """`mcp__<server>__<tool>`: lower case, other characters `_`; a long name is cut and
    given a hash of the original, so names stay unique and within 64 characters."""
    name = f"{MCP_PREFIX}{server_key}__{_UNSAFE.sub('_', tool.lower())}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(tool.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


def side_effects_of(tool: mcp_types.Tool) -> SideEffects:
    """From the server's hints (untrusted: they only pick the default timeout class and the
    label, never the confirmation mode, which the config decides)."""
    hints = tool.annotations
    if hints is not None and hints.read_only_hint:
        return "read"
    if hints is not None and hints.open_world_hint:
        return "network"
    return "execute"


def offered_schema(raw: dict[str, Any] | None) -> dict[str, Any]:
    """The server's input schema as offered: an object schema (`properties` always present)."""
    schema = dict(raw or {})
    schema.setdefault("type", "object")
    if not isinstance(schema.get("properties"), dict):
        schema["properties"] = {}
    return schema


class UnusableSchema(Exception):
    """A tool's input schema metis cannot check input against: not valid JSON Schema, or not
    self-contained."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _not_fetched(uri: str) -> Any:
    raise LookupError(f"{uri} is not fetched: a tool's schema must be self-contained")


def compile_validator(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    """Raises `UnusableSchema` for a schema that is not valid JSON Schema or refers to another
    document (which is never retrieved)."""
    try:
        return jsonschema_rs.validator_for(schema, retriever=_not_fetched)
    except ValueError as exc:  # jsonschema_rs.ValidationError: the first line says what
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnusableSchema(first if len(first) <= 300 else first[:299] + "…") from None


def _path(parts: Any) -> str:
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*\Z", str(part)):
            out += f".{part}"
        else:
            out += f"[{json.dumps(str(part), ensure_ascii=False)}]"
    return out


def validate_with(validator: jsonschema_rs.Validator, value: Any) -> InputValidation:
    if not isinstance(value, dict):
        return InputValidation((InputError("$", "expected object"),), None)
    errors = sorted(validator.iter_errors(value), key=lambda e: (list(e.instance_path), e.message))
    if not errors:
        return InputValidation((), value)
    found = [InputError(_path(e.instance_path), _message(e.message)) for e in errors[:MAX_ERRORS]]
    return InputValidation(tuple(found), None)


def _message(text: str) -> str:
    return text if len(text) <= 300 else text[:299] + "…"


@dataclass(frozen=True)
class McpRegisteredTool(RegisteredTool):
    """A registry entry whose input is checked against the server's own schema."""

    validator: jsonschema_rs.Validator | None = field(default=None, compare=False)

    def validate(self, input: Any) -> InputValidation:
        """Validate against the server's own schema, in the dialect it declares; no defaults are
        filled in, the server receives what the model sent."""
        assert self.validator is not None
        return validate_with(self.validator, input)


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


def _image(data: str, mime: str | None, what: str) -> ResultBlock:
    media = (mime or "").lower()
    if media not in IMAGE_MEDIA_TYPES:
        return TextBlock(text=f"[{what}: {mime or 'unknown type'}, not shown]")
    try:
        size = len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return TextBlock(text=f"[{what}: invalid base64 data, not shown]")
    if size > MAX_IMAGE_BYTES:
        return TextBlock(text=f"[{what}: {size:,} bytes, over the {MAX_IMAGE_BYTES:,}-byte limit]")
    return ImageBlock(source=Base64Source(media_type=media, data=data))


def result_blocks(result: mcp_types.CallToolResult) -> list[ResultBlock]:
    """CallToolResult content → canonical text and image blocks."""
    blocks: list[ResultBlock] = []
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            blocks.append(TextBlock(text=item.text))
        elif isinstance(item, mcp_types.ImageContent):
            blocks.append(_image(item.data, item.mime_type, "image"))
        elif isinstance(item, mcp_types.AudioContent):
            blocks.append(TextBlock(text=f"[audio: {item.mime_type}, not shown]"))
        elif isinstance(item, mcp_types.EmbeddedResource):
            resource = item.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                blocks.append(TextBlock(text=f"[resource {resource.uri}]\n{resource.text}"))
            elif (resource.mime_type or "").startswith("image/"):
                blocks.append(_image(resource.blob, resource.mime_type, f"resource {resource.uri}"))
            else:
                blocks.append(
                    TextBlock(
                        text=f"[resource {resource.uri}: {resource.mime_type or 'binary'}, not shown]"
                    )
                )
        elif isinstance(item, mcp_types.ResourceLink):
            label = item.title or item.name
            blocks.append(TextBlock(text=f"[resource link: {label} {item.uri}]"))
        else:
            blocks.append(TextBlock(text=f"[{getattr(item, 'type', 'content')}: not shown]"))
    if not blocks and result.structured_content is not None:
        blocks.append(TextBlock(text=json.dumps(result.structured_content, ensure_ascii=False)))
    return blocks or [TextBlock(text="(no output)")]


# ---------------------------------------------------------------------------------------------
# The tool
# ---------------------------------------------------------------------------------------------


class McpTool:
    """One call of one MCP tool (a fresh instance per dispatch, like every tool)."""

    def __init__(self, server: McpServer, remote_name: str) -> None:
        self.server = server
        self.remote_name = remote_name

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Call the tool on its server; a turn cancel or timeout cancels the request (the SDK tells
        the server) and the call ends as cancelled, or at its timeout as timed out, saying what
        raises the limit. A failure's text is scrubbed of the secrets
        the server was given (`redact`) before it becomes the tool result: a server that echoes
        its connection string or token when it fails would otherwise hand it to the provider
        and the stored conversation, where only the event was scrubbed."""
        call = asyncio.ensure_future(self.server.call(self.remote_name, input, ctx.remaining()))
        cancelled = asyncio.ensure_future(ctx.cancel_event.wait())
        try:
            await asyncio.wait({call, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if not call.done():
            # a turn cancel or the timeout: the SDK sends notifications/cancelled for the request
            call.cancel()
            await asyncio.wait({call})
            if ctx.remaining() <= 0:  # the timeout: its text says what raises the limit
                raise ToolTimedOut(self._timeout_note())
            raise ToolCancelled()
        try:
            result = call.result()
        except ToolError as exc:  # McpUnavailable / ToolError: the same kind, scrubbed
            raise type(exc)(redact(exc.message)) from None
        blocks = result_blocks(result)
        if result.is_error:
            text = "\n".join(b.text for b in blocks if isinstance(b, TextBlock))
            raise ToolError(redact(text) or f'MCP tool "{self.remote_name}" reported an error')
        return ToolOutput(content=blocks)

    def _timeout_note(self) -> str:
        """Appended to the timeout's `Timed out after N s.`: which server's tool timed out and
        which setting gives it longer (`tools.timeouts` does not apply to MCP tools)."""
        keys = self.server.settings.timeout_keys(self.server.name, self.remote_name)
        return mcp_timeout_note(self.server.name, self.remote_name, keys)


MAX_DESCRIPTION_CHARS = 8_000
"""The most of a tool's description offered to the model. It is sent with every model call of
every session: a server's 200 KB description would cost ~50,000 input tokens a call, and leave a
small model no room. The long descriptions of common servers are a few thousand characters."""


def description_of(tool: mcp_types.Tool) -> str:
    """The tool's description as offered and listed: cut at `MAX_DESCRIPTION_CHARS`."""
    text = tool.description or ""
    return text if len(text) <= MAX_DESCRIPTION_CHARS else text[:MAX_DESCRIPTION_CHARS] + "…"


def registered(
    server: McpServer,
    tool: mcp_types.Tool,
    *,
    name: str,
    validator: jsonschema_rs.Validator,
    mode: Any,
    timeout_seconds: float,
) -> McpRegisteredTool:
    """The registry entry of one MCP tool: offered under `name` with the server's schema, validated
    by `validator`, called through a fresh `McpTool` each time."""
    title = tool.title or (tool.annotations.title if tool.annotations else None)
    definition = ToolDefinition(
        name=name,
        title=f"{server.name}: {title or tool.name}",
        description=description_of(tool)
        + f"\n\n(Tool {tool.name!r} of the MCP server {server.name!r}.)",
        input_schema=offered_schema(tool.input_schema),
        side_effects=side_effects_of(tool),
        timeout_seconds=timeout_seconds,
    )
    factory: Callable[[], McpTool] = lambda: McpTool(server, tool.name)  # noqa: E731
    return McpRegisteredTool(definition, factory, None, mode, validator)


__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "McpRegisteredTool",
    "McpTool",
    "UnusableSchema",
    "compile_validator",
    "description_of",
    "offered_schema",
    "registered",
    "result_blocks",
    "tool_name",
]
