"""AAP wire models shared by v3 and v1 (camelCase on the wire, seeds 001/002).

Request models ignore unknown fields (they are neither rejected nor stored) and treat `null`
like an absent optional field. Content stays loosely typed here (`str | list[object]`): block
checks produce `invalid_content` in `mapping.py`, not a shape error. Its JSON Schema (in
`/openapi.json`) is the one those checks enforce, per role.
"""

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from metis.aap.agents import HISTORY_TYPES
from metis.core.canonical.content import IMAGE_MEDIA_TYPES, TOOL_NAME_RE
from metis.core.datamodel import DataModel
from metis.http.openapi import BASE64_PATTERN, from_setting

StreamMode = Literal["delta", "message", "none"]
StopReason = Literal["end_turn", "tool_use", "max_tokens", "refusal", "error"]


class Wire(DataModel):
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

# ---- content as `mapping.parse_content` accepts it (documentation of the checks it runs) -----

TOOL_NAME: JsonDict = {"pattern": TOOL_NAME_RE.pattern.replace("\\Z", "$")}
_IMAGE_TYPES = "|".join(sorted(t.removeprefix("image/") for t in IMAGE_MEDIA_TYPES))
_TEXT: dict[str, Any] = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_IMAGE: dict[str, Any] = {
    "type": "object",
    "required": ["type", "url"],
    "properties": {
        "type": {"const": "image"},
        "url": {
            "type": "string",
            "pattern": f"^data:image/({_IMAGE_TYPES});base64,{BASE64_PATTERN[1:]}",
            # aap.max_image_bytes as the URI's length (its longest prefix + the base64 text)
            **from_setting(maxLength="image_uri_chars"),
        },
    },
}
_THINKING: dict[str, Any] = {
    "type": "object",
    "required": ["type", "thinking"],
    "properties": {"type": {"const": "thinking"}, "thinking": {"type": "string"}},
}
_TOOL_USE: dict[str, Any] = {
    "type": "object",
    "required": ["type", "toolCallId", "name", "input"],
    "properties": {
        "type": {"const": "tool_use"},
        "toolCallId": {"type": "string", "minLength": 1},
        "name": {"type": "string", **TOOL_NAME},
        "input": {"type": "object"},
    },
}
# A client tool as `config.check_client_tools` accepts it (TOOL_NAME; unique names, none a
# server tool's, are checked there too: `invalid_tools`).
TOOL_SCHEMA: JsonDict = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"const": "object"}},
    "description": "a JSON Schema of an object",
}
# a v1 seed ends with the user message
AT_LEAST_ONE: JsonDict = {"minItems": 1}


def one_user_message_or_answers(schema: JsonDict) -> None:
    """A turn's `messages` as `turns.check_shape` judges them with the body: exactly one user
    message, or tool answers only. Said in the schema, a request the document calls valid is
    not refused for its shape (which calls the answers must cover is the session's state)."""
    items: Any = schema.pop("items")
    mapping: dict[str, str] = items["discriminator"]["mapping"]  # role → its message's $ref
    answers: dict[str, Any] = {role: mapping[role] for role in ("tool", "tool_permission")}
    schema.pop("type", None)
    schema.pop("minItems", None)
    schema["anyOf"] = [
        {
            "type": "array",
            "items": {"$ref": mapping["user"]},
            "minItems": 1,
            "maxItems": 1,
            "description": "a new user message",
        },
        {
            "type": "array",
            "items": {
                "oneOf": [{"$ref": ref} for ref in answers.values()],
                "discriminator": {"propertyName": "role", "mapping": answers},
            },
            "minItems": 1,
            "description": "the answers to the pending tool calls, each answered once",
        },
    ]


_NON_EMPTY_TEXT = {
    **_TEXT,
    "properties": {**_TEXT["properties"], "text": {"type": "string", "minLength": 1}},
}


def _content(blocks: list[dict[str, Any]], *, non_empty: bool) -> WithJsonSchema:
    """A message's content: a string (one text block) or a list of `blocks`; a user's (and a
    tool result's list) must not be empty."""
    listed: dict[str, Any] = {"type": "array", "items": {"oneOf": blocks}}
    text: dict[str, Any] = {"type": "string"}
    if non_empty:
        listed["minItems"] = 1
    return WithJsonSchema({"anyOf": [text, listed]})


UserContent = Annotated[
    Content,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": {"oneOf": [_NON_EMPTY_TEXT, _IMAGE]}},
            ]
        }
    ),
]
AssistantContent = Annotated[Content, _content([_TEXT, _THINKING, _TOOL_USE], non_empty=False)]
ToolContent = Annotated[Content, _content([_TEXT, _IMAGE], non_empty=True)]
HistoryContent = Annotated[
    Content, _content([_TEXT, _THINKING, _TOOL_USE, _IMAGE], non_empty=False)
]


class SystemMessage(Wire):
    role: Literal["system"]
    content: str = Field(strict=True)


class UserMessage(Wire):
    role: Literal["user"]
    content: UserContent


class AssistantMessage(Wire):
    role: Literal["assistant"]
    content: AssistantContent


class ToolMessage(Wire):
    role: Literal["tool"]
    tool_call_id: str = Field(strict=True)
    content: ToolContent


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


# ---- query strings (documented in /openapi.json; handlers read `request.query`) -------------


class SessionsQuery(DataModel):
    after: str | None = Field(default=None, description="the `next` cursor of the previous page")


class HistoryQuery(DataModel):
    type: Literal[HISTORY_TYPES] = Field(  # type: ignore[valid-type]
        description="which history; an agent may declare only one (history_type_not_supported)"
    )


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
    content: HistoryContent
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
