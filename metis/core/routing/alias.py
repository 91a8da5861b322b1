"""The `@alias` message prefix: a one-message model override.

One function for every surface that accepts the prefix, so `@sonnet fix this` means the same
thing everywhere, the escape rules are identical, and an unusable reference is refused before
anything is stored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from metis.core.canonical.content import TextBlock
from metis.core.errors import InvalidContent
from metis.core.models.registry import ModelRegistry

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
    The content is checked before any reference is resolved: an override with nothing left to send raises `InvalidContent` even when the reference
    is unknown; an unknown or unconfigured reference (field, or prefix without field) then
    raises `ModelNotConfigured`.
    """
    sent, token = _strip_prefix(content, registry, field_set=field is not None)
    reference = field if field is not None else token
    override = _require(registry, reference) if reference is not None else None
    return OverrideResolution(sent, override)


def _strip_prefix(
    content: list[Any], registry: ModelRegistry, *, field_set: bool
) -> tuple[list[Any], str | None]:
    """(content to send, prefix token or None). With the field set, only a prefix that
    resolves is an override (and is removed); any other stays plain text."""
    if not content or not isinstance(content[0], TextBlock):
        return list(content), None
    first, rest = content[0], list(content[1:])
    text = first.text
    if _ESCAPED_RE.match(text):
        return [TextBlock(text=text[1:]), *rest], None
    match = _PREFIX_RE.match(text)
    if match is None:
        return list(content), None
    token, body = match.group(1), match.group(2).lstrip()
    if field_set and registry.resolve(token) is None:
        return list(content), None
    if body:
        return [TextBlock(text=body), *rest], token
    if not rest:
        raise InvalidContent([{"index": 0, "msg": "override without a message"}])
    return rest, token


__all__ = ["ESCAPE_HINT", "OverrideResolution", "resolve_override"]
