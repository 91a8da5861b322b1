"""AAP wire models shared by v3 and v1 (camelCase on the wire, seeds 001/002).

Request models ignore unknown fields (they are neither rejected nor stored) and treat `null`
like an absent optional field. Content stays loosely typed here (`str | list[object]`): block
checks produce `invalid_content` in `mapping.py`, not a shape error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

StreamMode = Literal["delta", "message", "none"]
StopReason = Literal["end_turn", "tool_use", "max_tokens", "refusal", "error"]


class Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, alias_generator=to_camel)


# ---- requests ------------------------------------------------------------------------------


class ServerToolRef(Wire):
    name: str = Field(strict=True)
    trust: bool | None = Field(default=None, strict=True)


class AgentConfig(Wire):
    """`agent` of a create request: the name is required."""

    name: str = Field(strict=True)
    tools: list[ServerToolRef] | None = None
    options: dict[str, Any] | None = None


class AgentOverride(Wire):
    """`agent` of a turn request: the name may be repeated but never changed."""

    name: str | None = Field(default=None, strict=True)
    tools: list[ServerToolRef] | None = None
    options: dict[str, Any] | None = None


Content = str | list[Any]


class SystemMessage(Wire):
    role: Literal["system"]
    content: str = Field(strict=True)


class UserMessage(Wire):
    role: Literal["user"]
    content: Content


class AssistantMessage(Wire):
    role: Literal["assistant"]
    content: Content


class ToolMessage(Wire):
    role: Literal["tool"]
    tool_call_id: str = Field(strict=True)
    content: Content


class ToolPermissionMessage(Wire):
    role: Literal["tool_permission"]
    tool_call_id: str = Field(strict=True)
    granted: bool = Field(strict=True)
    reason: str | None = Field(default=None, strict=True)


SeedMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]
TurnMessage = Annotated[
    UserMessage | ToolMessage | ToolPermissionMessage, Field(discriminator="role")
]


# ---- responses (documented in /openapi.json; handlers render the same keys) -----------------


class ServerToolSetting(Wire):
    name: str
    trust: bool


class SessionAgent(Wire):
    name: str
    tools: list[ServerToolSetting]
    options: dict[str, str]


class AgentOption(Wire):
    name: str
    title: str | None = None
    description: str | None = None
    type: Literal["text", "select", "secret"]
    options: list[str] | None = None
    default: str


class CreatedResponse(Wire):
    session_id: str


class HistoryMessage(Wire):
    role: Literal["system", "user", "assistant", "tool"]
    tool_call_id: str | None = None
    content: Content
    # An assistant reply cut short (its turn cancelled, its provider failed mid-stream): what
    # the model had said by then. Absent on every complete message.
    interrupted: Literal[True] | None = None


class AgentResponse(Wire):
    """The `stream: "none"` body."""

    stop_reason: StopReason
    messages: list[HistoryMessage]


class HistoryBody(Wire):
    compacted: list[HistoryMessage] | None = None
    full: list[HistoryMessage] | None = None
