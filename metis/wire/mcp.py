"""How a client says what an MCP reload did (`POST /mcp/reload`'s `applied`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def reload_outcome(applied: Mapping[str, Sequence[str]]) -> str:
    """`config.yaml applied: added git; removed old`, or that nothing changed: the servers'
    states alone do not tell an unchanged file from a change still starting."""
    said = [
        f"{what} {', '.join(applied[what])}"
        for what in ("added", "changed", "removed")
        if applied.get(what)
    ]
    return f"config.yaml applied: {'; '.join(said)}" if said else "config.yaml applied: no changes"
