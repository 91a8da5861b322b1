"""AAP v3 wire models: tool schemas under `parameters`."""

from typing import Any

from pydantic import Field

from metis.aap.wire import (
    TOOL_NAME,
    TOOL_SCHEMA,
    AgentConfig,
    AgentOption,
    AgentOverride,
    AgentResponse,
    HistoryBody,
    SeedMessage,
    SessionAgent,
    StreamMode,
    TurnMessage,
    Wire,
    one_user_message_or_answers,
)


class ToolSpec(Wire):
    name: str = Field(strict=True, json_schema_extra=TOOL_NAME)
    title: str | None = Field(default=None, strict=True)
    description: str = Field(strict=True)
    parameters: Any = Field(json_schema_extra=TOOL_SCHEMA)


class CreateSessionRequest(Wire):
    agent: AgentConfig
    messages: list[SeedMessage] | None = None
    tools: list[ToolSpec] | None = None


class TurnRequest(Wire):
    agent: AgentOverride | None = None
    stream: StreamMode | None = None
    messages: list[TurnMessage] = Field(json_schema_extra=one_user_message_or_answers)
    tools: list[ToolSpec] | None = None


class AgentInfo(Wire):
    name: str
    title: str | None = None
    version: str
    description: str | None = None
    tools: list[ToolSpec]
    options: list[AgentOption]
    capabilities: dict[str, Any]


class MetaResponse(Wire):
    version: int
    agents: list[AgentInfo]


class SessionInfo(Wire):
    session_id: str
    agent: SessionAgent
    tools: list[ToolSpec]


class SessionList(Wire):
    sessions: list[SessionInfo]
    next: str | None = None


class HistoryResponse(Wire):
    history: HistoryBody


__all__ = [
    "AgentInfo",
    "AgentResponse",
    "CreateSessionRequest",
    "HistoryResponse",
    "MetaResponse",
    "SessionInfo",
    "SessionList",
    "ToolSpec",
    "TurnRequest",
]
