"""Text as a person reads and searches it: the text blocks of a message, and the caseless form
in which a search compares words.

A person types what they remember in whatever case and form: `strasse` for `Straße`, `café`
as one letter for a prompt pasted with `e` and a combining accent. Unicode's caseless matching
(compatibility-normalised, then case-folded) makes those the same text, so the stored side and
the searched words both go through `caseless`.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable

from metis.core.canonical.content import ContentBlock, TextBlock


def caseless(text: str) -> str:
    """`text` in the form searches compare: NFKC, then Unicode case folding."""
    return unicodedata.normalize("NFKC", text).casefold()


def blocks_text(blocks: Iterable[ContentBlock]) -> str:
    """The text blocks of a message's content, joined by newlines (images, tool calls and
    their results, and thinking are not text a person wrote or was answered with)."""
    return "\n".join(block.text for block in blocks if isinstance(block, TextBlock))


def stored_text(content_json: str) -> str | None:
    """`blocks_text` of a message's content as stored (JSON); None when it cannot be decoded.

    Lenient on purpose: it reads rows written by any earlier release, and a row it cannot
    read must not stop a listing or a migration.
    """
    try:
        blocks = json.loads(content_json)
    except (ValueError, TypeError, RecursionError):  # not JSON, not text, nested too deep
        return None
    if not isinstance(blocks, list):
        return None
    return "\n".join(
        b["text"]
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )
