"""AAP v1 wire models (seeds 000/002): tool schemas under `inputSchema`, create-and-run."""

from typing import Any

from pydantic import Field

from metis.aap.wire import (
    AT_LEAST_ONE,
    TOOL_NAME,
    TOOL_SCHEMA,
    AgentConfig,
    AgentOption,
    AgentOverride,
    HistoryBody,
    SeedMessage,
    SessionAgent,
    StopReason,
    StreamMode,
    TurnMessage,
    Wire,
    one_user_message_or_answers,
)
from metis.aap.wire import HistoryMessage as HistoryMessage


class ToolSpec(Wire):
    name: str = Field(strict=True, json_schema_extra=TOOL_NAME)
    title: str | None = Field(default=None, strict=True)
    description: str = Field(strict=True)
    input_schema: Any = Field(json_schema_extra=TOOL_SCHEMA)


class CreateSessionRequest(Wire):
    """`PUT /session`: the seed history's last message is the first turn's user message."""

    agent: AgentConfig
    stream: StreamMode | None = None
    messages: list[SeedMessage] = Field(json_schema_extra=AT_LEAST_ONE)
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


class SessionResponse(Wire):
    session_id: str
    agent: SessionAgent
    tools: list[ToolSpec]
    history: HistoryBody


class SessionList(Wire):
    sessions: list[str]
    next_cursor: str | None = None
    next: str | None = None


class CreateRunResponse(Wire):
    session_id: str
    stop_reason: StopReason
    messages: list[HistoryMessage]
