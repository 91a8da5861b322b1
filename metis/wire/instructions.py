"""How a client names the project instruction file a session's turns use (`GET /sessions/{id}`'s
`instructions`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def instructions_label(instructions: Mapping[str, Any]) -> str:
    """`AGENTS.md`, saying so when the file is too long for the model to get whole."""
    cut = " (too long: the model gets its beginning)" if instructions.get("truncated") else ""
    return f"{instructions['file']}{cut}"


def instructions_note(instructions: Mapping[str, Any] | None) -> str:
    """`; instructions: AGENTS.md`, the end of the line a chat opens with; nothing when the
    workspace has no instruction file."""
    return f"; instructions: {instructions_label(instructions)}" if instructions else ""
