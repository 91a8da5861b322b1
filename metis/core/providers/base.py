"""Adapter-facing types: the request, the result, canonical stream events, tool ids and hooks.

Everything the agent loop exchanges with an adapter lives here, so that the TurnRunner depends on
one small vocabulary and never on an SDK.
"""

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import ConfigDict

from metis.core.cancel_event import CancelEvent
from metis.core.canonical.content import ContentBlock
from metis.core.canonical.messages import Message
from metis.core.canonical.tools import ToolDefinition
from metis.core.canonical.usage import TokenUsage
from metis.core.datamodel import DataModel
from metis.core.models.types import Capabilities

if TYPE_CHECKING:
    from metis.core.providers.errors import ProviderError

StopReason = Literal[
    "end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal", "cancelled", "error"
]
AdapterKindName = Literal["anthropic", "openai", "scripted"]


# ---------------------------------------------------------------------------------------------
# Tool ids
# ---------------------------------------------------------------------------------------------


class ToolIdMap:
    """Session-scoped memory of canonical `tu_` ids and the provider ids they were minted for.

    Only used for logs and correlation: outgoing wire ids are *derived* from the canonical id, so
    the map never has to survive a restart or a provider swap.
    """

    __slots__ = ("_by_canonical", "_by_provider")

    def __init__(self) -> None:
        self._by_canonical: dict[str, str | None] = {}
        self._by_provider: dict[str, str] = {}

    def record(self, canonical_id: str, provider_id: str | None) -> None:
        self._by_canonical[canonical_id] = provider_id
        if provider_id:
            self._by_provider[provider_id] = canonical_id

    def provider_id(self, canonical_id: str) -> str | None:
        return self._by_canonical.get(canonical_id)

    def canonical_id(self, provider_id: str) -> str | None:
        return self._by_provider.get(provider_id)

    def __contains__(self, canonical_id: object) -> bool:
        return canonical_id in self._by_canonical

    def __len__(self) -> int:
        return len(self._by_canonical)


# ---------------------------------------------------------------------------------------------
# Attempt hooks
# ---------------------------------------------------------------------------------------------


class AttemptHooks(Protocol):
    """Callbacks the retry loop awaits so the TurnRunner can emit one started/failed pair per attempt.

    `attempt_failed` is awaited for every attempt that ends in a `ProviderError` (retried or raised,
    `cancelled` before the first token included). An attempt whose stream completes with
    `message.complete` (any stop reason, `cancelled`/`error` included) does not call it: the caller
    sees the terminal event itself.
    """

    async def attempt_started(self, attempt: int) -> None:
        """Awaited before each attempt is sent (the runner emits `llm.call_started`)."""

    async def attempt_failed(self, attempt: int, error: "ProviderError", will_retry: bool) -> None:
        """Awaited for each attempt that ended in a `ProviderError`, with whether the driver will
        retry it."""


class NoHooks:
    """Default hooks: utility calls (compaction summaries, benchmarks) need no per-attempt events."""

    async def attempt_started(self, attempt: int) -> None:
        return None

    async def attempt_failed(self, attempt: int, error: "ProviderError", will_retry: bool) -> None:
        return None


NO_HOOKS = NoHooks()


# ---------------------------------------------------------------------------------------------
# Request and result
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMRequest:
    """One logical LLM call; retries of it share `request_id`.

    A dataclass rather than a pydantic model because it carries live objects (an `asyncio.Event`,
    the session's `ToolIdMap`, hooks) that must be passed by reference, never copied or validated.
    """

    request_id: str
    message_id: str
    model: str
    wire_model: str
    capabilities: Capabilities
    system: str = ""
    system_volatile: str | None = None
    messages: Sequence[Message] = ()
    tools: Sequence[ToolDefinition] = ()
    max_output_tokens: int = 8192
    temperature: float | None = None
    stop_sequences: Sequence[str] | None = None
    thinking_budget_tokens: int | None = None
    tool_ids: ToolIdMap = field(default_factory=ToolIdMap)
    hooks: AttemptHooks = NO_HOOKS
    cancel: CancelEvent = field(default_factory=CancelEvent)

    @property
    def thinking_enabled(self) -> bool:
        """Thinking is requested only when a budget is set and the model supports it."""
        return bool(self.thinking_budget_tokens) and self.capabilities.supports_thinking


class LLMResult(DataModel):
    """What `complete()` returns: the same facts as `message.complete`, without the stream."""

    model_config = ConfigDict(frozen=True)

    final_content: list[ContentBlock]
    stop_reason: StopReason
    usage: TokenUsage
    latency_ms: int
    first_token_ms: int | None
    attempts: int
    provider_stop_reason: str | None = None


# ---------------------------------------------------------------------------------------------
# Canonical stream events
# ---------------------------------------------------------------------------------------------


class _Event(DataModel):
    model_config = ConfigDict(frozen=True)

    def payload(self) -> dict[str, Any]:
        """The event's wire payload: every field but the discriminator."""
        return self.model_dump(mode="json", exclude={"type"})


@dataclass(kw_only=True)
class _FlatEvent:
    """An event whose fields are plain JSON values: its payload is a copy of its fields.

    These are the per-delta events. A plain dataclass rather than a pydantic model: what builds
    one (an adapter's translator) already holds well-typed values, and validating them cost more
    than the rest of a delta's trip to the bus (1.5 µs against 0.6 µs to build the dataclass and
    its payload). Read-only by convention, like the bus's `TransientEvent`; the tag is a class
    attribute, so it is not copied into every instance or payload.
    """

    type: ClassVar[str]

    def payload(self) -> dict[str, Any]:
        """The event's wire payload: its fields (the tag is the class's, not among them)."""
        return dict(self.__dict__)


@dataclass(kw_only=True)
class MessageStart(_FlatEvent):
    """The canonical stream event opening an assistant message (`message.start`)."""

    type: ClassVar[Literal["message.start"]] = "message.start"
    message_id: str
    role: Literal["assistant"] = "assistant"
    model: str


@dataclass(kw_only=True)
class TextDelta(_FlatEvent):
    """A piece of a text block (`text.delta`)."""

    type: ClassVar[Literal["text.delta"]] = "text.delta"
    message_id: str
    content_block_index: int
    text: str


@dataclass(kw_only=True)
class ThinkingDelta(_FlatEvent):
    """A piece of a thinking block (`thinking.delta`); the signature comes with the last piece."""

    type: ClassVar[Literal["thinking.delta"]] = "thinking.delta"
    message_id: str
    content_block_index: int
    text: str
    signature: str | None = None


@dataclass(kw_only=True)
class ToolUseStart(_FlatEvent):
    """The start of a tool call (`tool.use_start`), under the id metis minted."""

    type: ClassVar[Literal["tool.use_start"]] = "tool.use_start"
    message_id: str
    content_block_index: int
    tool_use_id: str
    tool_name: str


@dataclass(kw_only=True)
class ToolUseInputDelta(_FlatEvent):
    """A piece of a tool call's input JSON (`tool.use_input_delta`)."""

    type: ClassVar[Literal["tool.use_input_delta"]] = "tool.use_input_delta"
    message_id: str
    content_block_index: int
    tool_use_id: str
    partial_json: str


class ToolUseEnd(_Event):
    """A tool call whose input is complete and parsed (`tool.use_end`); `dropped`: the output
    limit cut its arguments off, so it is not part of the message and never runs."""

    type: Literal["tool.use_end"] = "tool.use_end"
    message_id: str
    content_block_index: int
    tool_use_id: str
    final_input: dict[str, Any]
    dropped: bool = False


class MessageComplete(_Event):
    """Last event of every stream that yielded `message.start`; `final_content` is authoritative.

    `usage` holds tokens only; the core prices it (`compute_cost`) into the event `Usage`.
    """

    type: Literal["message.complete"] = "message.complete"
    message_id: str
    stop_reason: StopReason
    final_content: list[ContentBlock]
    usage: TokenUsage
    latency_ms: int
    first_token_ms: int | None = None
    attempts: int = 1
    provider_stop_reason: str | None = None


StreamEvent = (
    MessageStart
    | TextDelta
    | ThinkingDelta
    | ToolUseStart
    | ToolUseInputDelta
    | ToolUseEnd
    | MessageComplete
)
"""What an adapter's stream yields; never validated (adapters build each from typed values)."""


# ---------------------------------------------------------------------------------------------
# The adapter protocol
# ---------------------------------------------------------------------------------------------


class ProviderAdapter(Protocol):
    """What the agent loop needs from a provider: a streamed call, the same call unstreamed, and
    closing its client."""

    @property
    def kind(self) -> AdapterKindName:
        """Which wire the adapter speaks (each adapter class fixes it as a class attribute)."""
        ...

    def stream(self, req: LLMRequest) -> AsyncIterator[StreamEvent]:
        """Canonical events of one logical call; retries happen before anything is yielded."""
        ...

    async def complete(self, req: LLMRequest) -> LLMResult:
        """The same call in the wire's non-streaming mode (utility calls)."""
        ...

    async def aclose(self) -> None:
        """Close the adapter's HTTP client (daemon shutdown)."""
