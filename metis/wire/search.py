"""How a client shows why a session is in a search's results (`GET /sessions?q=` items'
`match`): the words said, with where they were said."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_SAID_IN = {"user": "in a prompt", "assistant": "in a reply"}


def where_said(match: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(`in a prompt` or `in a reply`, the excerpt) of a result found by words said in its
    conversation; None without a match, or for one in the title (which a listing shows anyway)."""
    if not match or match.get("where") not in _SAID_IN:
        return None
    return _SAID_IN[match["where"]], str(match.get("excerpt", ""))
