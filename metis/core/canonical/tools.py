"""Tool specifications: what a model is offered (built-in, MCP and application tools alike)."""

from typing import Any, Literal

from pydantic import ConfigDict

from metis.core.datamodel import DataModel

SideEffects = Literal["none", "read", "write", "execute", "network"]
ToolOrigin = Literal["builtin", "application"]


class ToolDefinition(DataModel):
    """What the model is offered for one tool and what the dispatcher needs to run it safely: side
    effects, origin, the input fields that are paths, the timeout."""

    model_config = ConfigDict(frozen=True)

    name: str
    title: str | None = None
    description: str = ""
    input_schema: dict[str, Any]
    side_effects: SideEffects = "none"
    origin: ToolOrigin = "builtin"
    path_fields: tuple[str, ...] = ()
    timeout_seconds: float | None = None
