"""The `@alias` message prefix: a one-message model override (routing.md §3).

One function for every surface that accepts the prefix, so `@sonnet fix this` means the same
thing everywhere, the escape rules are identical, and an unusable reference is refused before
anything is stored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from metis.core.canonical import TextBlock
from metis.core.errors import InvalidContent
from metis.core.registry import ModelRegistry

_PREFIX_RE = re.compile(r"@(\S+)(.*)", re.DOTALL)
_ESCAPED_RE = re.compile(r"\\+@")
ESCAPE_HINT = "start the message with \\@ to send a literal @"


@dataclass(frozen=True)
class OverrideResolution:
    """The content to store and send, and the canonical id overriding routing (or None)."""

    content: list[Any]
    override: str | None


def _require(registry: ModelRegistry, ref: str) -> str:
    return registry.require_configured(ref, source="per_message_override", hint=ESCAPE_HINT)


def resolve_override(
    content: list[Any], registry: ModelRegistry, *, field: str | None = None
) -> OverrideResolution:
    """Strip an `@alias` prefix from the first text block and resolve the turn's override.

    `field` is the request's `per_message_override` (id or alias); it wins over the prefix.
    Raises `ModelNotConfigured` for an unknown or unconfigured reference (field, or prefix
    without field) and `InvalidContent` for an override with nothing left to send.
    """
    override = _require(registry, field) if field is not None else None
    if not content or not isinstance(content[0], TextBlock):
        return OverrideResolution(list(content), override)
    first, rest = content[0], list(content[1:])
    text = first.text
    if _ESCAPED_RE.match(text):
        return OverrideResolution([TextBlock(text=text[1:]), *rest], override)
    match = _PREFIX_RE.match(text)
    if match is None:
        return OverrideResolution(list(content), override)
    token, body = match.group(1), match.group(2).lstrip()
    if field is not None:
        if registry.resolve(token) is None:
            return OverrideResolution(list(content), override)  # plain text, no effect
    else:
        override = _require(registry, token)
    if body:
        return OverrideResolution([TextBlock(text=body), *rest], override)
    if not rest:
        raise InvalidContent([{"index": 0, "msg": "override without a message"}])
    return OverrideResolution(rest, override)


__all__ = ["ESCAPE_HINT", "OverrideResolution", "resolve_override"]
