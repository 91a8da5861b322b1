"""How a client names the project instruction file a session's turns use (`GET /sessions/{id}`'s
`instructions`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def instructions_label(instructions: Mapping[str, Any]) -> str:
    """`AGENTS.md`, saying so when the file is too long for the model to get whole."""
    cut = " (too long: the model gets its beginning)" if instructions.get("truncated") else ""
    return f"{instructions['file']}{cut}"
