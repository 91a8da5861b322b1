"""The closed event catalog: one payload model per type, nothing else is valid.

Payload models forbid extra fields so a typo in an emitter is caught in tests (strict mode);
stored payloads come back as plain dicts and are never re-validated, so old rows stay readable.
"""

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, PlainSerializer

from metis.core.canonical.money import decimal_str
from metis.core.datamodel import DataModel

DecimalStr = Annotated[
    Decimal,
    BeforeValidator(lambda v: Decimal(v) if isinstance(v, (str, int)) else v),
    PlainSerializer(decimal_str, return_type=str),
]
Actor = Literal["user", "agent", "system", "tool", "worker"]
LlmStopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]
LlmErrorClass = Literal[
    "rate_limit",
    "auth",
    "server_error",
    "network",
    "context_overflow",
    "invalid_request",
    "content_filter",
    "cancelled",
    "other",
]
ToolErrorClass = Literal[
    "not_found",
    "permission_denied",
    "policy_denied",
    "user_denied",
    "confirmation_timeout",
    "timeout",
    "tool_error",
    "internal_error",
    "cancelled",
]
SideEffects = Literal["none", "read", "write", "execute", "network"]


class Payload(DataModel):
    """Base of every event payload: extra fields are refused so an emitter's typo fails in tests,
    and payloads are frozen once emitted."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- session ---------------------------------------------------------------------------------


class SessionCreated(Payload):
    """`session.created`: the first event of a session's stream."""

    workspace_path: str
    active_model: str | None
    routing_policy_version: str
    surface: Literal["metis", "aap"]


class SessionResumed(Payload):
    """`session.resumed`: announced before a session's first turn after a daemon restart;
    `last_seq` is where its stream stood."""

    last_seq: int


class SessionModelChanged(Payload):
    """`session.model_changed`: the sticky model was set or cleared, now or (queued) after the turn
    in flight."""

    previous_active_model: str | None
    active_model: str | None
    queued: bool
    applies_after_turn_id: str | None


class SessionEnded(Payload):
    """`session.ended`: the last event of a session, with its totals."""

    disposition: Literal["completed", "abandoned"]
    turn_count: int
    total_cost_usd: DecimalStr
    duration_seconds: float


class SessionPurged(Payload):
    """`session.purged`, on the system stream: a session's messages and events were deleted."""

    purged_session_id: str
    messages_deleted: int
    events_deleted: int


class SessionInstructionsLoaded(Payload):
    """The project instruction file a turn uses changed (all null: the file went away)."""

    file: str | None
    sha256: str | None
    bytes: int | None
    truncated: bool | None


# --- turn ------------------------------------------------------------------------------------


class TurnTotals(Payload):
    """The **T** block carried by every terminal turn event."""

    llm_call_count: int = 0
    tool_call_count: int = 0
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    total_cost_usd: DecimalStr = Decimal(0)
    wall_time_ms: int = 0


class TurnStarted(Payload):
    """`turn.started`: a turn claimed the session's slot; the content is described by hash and size,
    never copied."""

    trigger: Literal["user_message", "tool_resolution"]
    user_message_id: str | None
    resumes_turn_id: str | None
    model: str
    per_message_override: str | None
    content_sha256: str
    content_bytes: int
    has_images: bool
    estimated_input_tokens: int
    confirmation_policy: Literal["wait", "suspend"]


class TurnCompleted(TurnTotals):
    """`turn.completed`: the model stopped; `pending_tool_use_ids` lists the calls a suspended turn
    waits for."""

    stop_reason: LlmStopReason
    pending_tool_use_ids: list[str] = Field(default_factory=list)


class TurnCancelled(TurnTotals):
    """`turn.cancelled`: the turn was cancelled, and by what."""

    reason: Literal["user_cancel", "client_disconnect", "timeout", "server_shutdown"]


class TurnFailed(TurnTotals):
    """`turn.failed`: the turn ended on an error; `message` is capped at 2,000 characters."""

    reason: Literal["provider_error", "loop_limit", "internal_error", "daemon_restart"]
    error_class: str | None
    message: str = Field(max_length=2000)


# --- routing ---------------------------------------------------------------------------------


class RouteAttempt(Payload):
    """One candidate a routing policy tried and why it was passed over (inside a chain entry)."""

    rule_name: str | None
    candidate_model: str | None
    validation_failure: str | None
    unavailable_scope: str | None


class ChainEntry(Payload):
    """One policy of the routing chain in `route.decided`, in the order consulted, with its verdict."""

    policy: Literal[
        "per_message_override",
        "manual_sticky",
        "rule",
        "pattern",
        "workspace_default",
        "global_default",
        "offline_fallback",
    ]
    verdict: Literal["not_applicable", "rejected", "chose", "deferred"]
    reason: str
    candidate_model: str | None
    rule_name: str | None
    validation_failure: (
        Literal[
            "not_configured",
            "provider_unavailable",
            "no_vision_support",
            "exceeds_context_window",
            "no_tool_support",
        ]
        | None
    )
    unavailable_scope: Literal["provider", "model"] | None
    attempts: list[RouteAttempt] | None


class RouteDecided(Payload):
    """`route.decided`: which model serves the turn and the whole chain that led there (also emitted
    without a turn when no model can serve)."""

    outcome: Literal["chose", "no_candidate", "explicit_choice_rejected"]
    chosen_model: str | None
    winner_index: int
    would_fall_back_to: str | None
    fallbacks: list[str]
    policy_version: str
    policy_source: str
    using_last_known_good: bool
    offline_mode: bool
    estimated_input_tokens: int
    elapsed_ms: float
    chain: list[ChainEntry]


class RoutingPolicyLoaded(Payload):
    """`routing.policy_loaded`, on the system stream: a routing policy version became active."""

    version: str
    previous_version: str | None
    source: str
    path: str | None
    reason: str
    warnings: list[str]


class RoutingPolicyInvalid(Payload):
    """`routing.policy_invalid`, on the system stream: an edited routing.yaml was refused; the last
    known good stays active."""

    policy_path: str
    file_version: str
    errors: list[str]
    using_last_known_good: bool
    active_version: str


class RoutingProviderUnavailable(Payload):
    """`routing.provider_unavailable`, on the system stream: a provider or one of its models is
    taken out of routing."""

    provider: str
    scope: Literal["model_specific", "provider_wide"]
    models_affected: list[str]
    trigger_reason: Literal[
        "consecutive_failures",
        "auth_error",
        "network_burst",
        "multi_model_failures",
        "probation_failure",
        "retry_after",
    ]
    since: str
    message: str | None = None  # why, in words (a refused key names its variable, never the key)


class RoutingProviderRecovered(Payload):
    """`routing.provider_recovered`, on the system stream: a provider or model is back in routing."""

    provider: str
    scope: Literal["model_specific", "provider_wide"]
    models_recovered: list[str]
    downtime_seconds: float
    recovery_reason: Literal["success", "timeout_elapsed", "manual_reset"]


# --- llm calls -------------------------------------------------------------------------------


class _LlmCall(Payload):
    request_id: str
    attempt: int = Field(ge=1)
    message_id: str
    model: str
    provider: str


class _Quartet(Payload):
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0


class LlmCallStarted(_LlmCall):
    """`llm.call_started`: one request (one attempt) to a provider; `failover_from` names the model
    whose failed first call of the turn this one takes over (the turn failed over), else null."""

    estimated_input_tokens: int
    max_output_tokens: int
    failover_from: str | None = None
    # what fitting the model's window left out of this call: the conversation's earliest
    # messages, and tool results sent as a placeholder (metis/core/turns/context.py)
    messages_left_out: int = Field(default=0, ge=0)
    tool_results_omitted: int = Field(default=0, ge=0)


class LlmCallCompleted(_LlmCall, _Quartet):
    """`llm.call_completed`: the provider's answer with its usage, cost and latency."""

    stop_reason: LlmStopReason
    cost_usd: DecimalStr
    pricing_version: str
    latency_ms: int
    first_token_ms: int | None
    tool_use_count: int
    thinking_block_count: int
    usage_estimated: bool


class LlmCallFailed(_LlmCall, _Quartet):
    """`llm.call_failed`: an attempt that failed, classified, whether it will be retried and, if
    so, in how many seconds (the provider's `retry-after`, else the back-off)."""

    error_class: LlmErrorClass
    message: str
    provider_status: int | None
    retryable: bool
    will_retry: bool
    retry_in_s: float | None = None
    latency_ms: int
    cost_usd: DecimalStr = Decimal(0)
    pricing_version: str
    # the usage of an attempt cut short after its first token is partly estimated (the output
    # streamed so far, and an OpenAI prompt whose usage chunk never came)
    usage_estimated: bool = False


# --- tools -----------------------------------------------------------------------------------


class InputError(Payload):
    """One validation problem of a tool call's input (JSON path and message)."""

    path: str
    message: str


class ToolInputInvalid(Payload):
    """`tool.input_invalid`: a tool call whose input failed its schema; the model gets the errors as
    the result."""

    tool_use_id: str
    tool_name: str
    errors: list[InputError] = Field(max_length=20)
    result_message_id: str


class ToolConfirmationRequested(Payload):
    """`tool.confirmation_requested`: a tool call waits for the user's allow or deny."""

    confirmation_request_id: str
    tool_use_id: str
    tool_name: str
    side_effects: SideEffects
    policy: Literal["wait", "suspend"]
    input_summary: str = Field(max_length=200)
    projected_modifications: list[str] | None
    command_summary: str | None = Field(max_length=2000)
    message_id: str
    allowed_scopes: list[Literal["once", "session"]]
    expires_at: str | None


class ToolConfirmationResolved(Payload):
    """`tool.confirmation_resolved`: the answer to a confirmation request (or its timeout)."""

    confirmation_request_id: str
    tool_use_id: str
    decision: Literal["allow", "deny", "timeout"]
    scope: Literal["once", "session"] | None
    remembered: bool
    reason: str | None


class ToolCalled(Payload):
    """`tool.called`: a tool starts running; its input is described by hash and size, never copied."""

    tool_use_id: str
    tool_name: str
    side_effects: SideEffects
    origin: Literal["builtin", "application"]
    input_sha256: str
    input_bytes: int
    timeout_seconds: float | None


class ToolCompleted(Payload):
    """`tool.completed`: a tool finished, possibly with an error result the model sees."""

    tool_use_id: str
    is_error: bool
    output_bytes: int
    truncated: bool
    duration_ms: int
    files_modified: list[str] | None
    exit_code: int | None
    result_message_id: str


class ToolFailed(Payload):
    """`tool.failed`: a tool call that could not produce a result (denied, timed out, crashed)."""

    tool_use_id: str
    tool_name: str
    error_class: ToolErrorClass
    message: str
    duration_ms: int
    result_message_id: str


# --- bus -------------------------------------------------------------------------------------


class BusGapDetected(Payload):
    """`bus.gap_detected`: a range of a stream's seq numbers that will never be stored (found at
    start-up or lost by the writer)."""

    missing_from_seq: int
    missing_to_seq: int
    detected_by: Literal["startup_scan", "writer"]


# --- streaming-only (never persisted) ---------------------------------------------------------


class MessageStart(Payload):
    """`message.start` (streaming only): an assistant message begins."""

    message_id: str
    role: Literal["assistant"]
    model: str


class TextDelta(Payload):
    """`text.delta` (streaming only): a piece of a text block."""

    message_id: str
    content_block_index: int
    text: str


class ThinkingDelta(Payload):
    """`thinking.delta` (streaming only): a piece of a thinking block; the signature comes with the
    last."""

    message_id: str
    content_block_index: int
    text: str
    signature: str | None


class ToolUseStart(Payload):
    """`tool.use_start` (streaming only): the model begins a tool call."""

    message_id: str
    content_block_index: int
    tool_use_id: str
    tool_name: str


class ToolUseInputDelta(Payload):
    """`tool.use_input_delta` (streaming only): a piece of a tool call's input JSON."""

    message_id: str
    content_block_index: int
    tool_use_id: str
    partial_json: str


class ToolUseEnd(Payload):
    """`tool.use_end` (streaming only): a tool call's input is complete and parsed; `dropped`:
    the output limit cut its arguments off, so it is left out of the message and never runs."""

    message_id: str
    content_block_index: int
    tool_use_id: str
    final_input: dict[str, Any]
    dropped: bool = False


class MessageComplete(Payload):
    """`message.complete` (streaming only): the assistant message as stored, with its usage."""

    message_id: str
    stop_reason: Literal[
        "end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal", "cancelled", "error"
    ]
    final_content: list[dict[str, Any]]
    usage: dict[str, Any]
    latency_ms: int


PERSISTED: dict[str, type[Payload]] = {
    "session.created": SessionCreated,
    "session.resumed": SessionResumed,
    "session.model_changed": SessionModelChanged,
    "session.ended": SessionEnded,
    "session.purged": SessionPurged,
    "session.instructions_loaded": SessionInstructionsLoaded,
    "turn.started": TurnStarted,
    "turn.completed": TurnCompleted,
    "turn.cancelled": TurnCancelled,
    "turn.failed": TurnFailed,
    "route.decided": RouteDecided,
    "routing.policy_loaded": RoutingPolicyLoaded,
    "routing.policy_invalid": RoutingPolicyInvalid,
    "routing.provider_unavailable": RoutingProviderUnavailable,
    "routing.provider_recovered": RoutingProviderRecovered,
    "llm.call_started": LlmCallStarted,
    "llm.call_completed": LlmCallCompleted,
    "llm.call_failed": LlmCallFailed,
    "tool.input_invalid": ToolInputInvalid,
    "tool.confirmation_requested": ToolConfirmationRequested,
    "tool.confirmation_resolved": ToolConfirmationResolved,
    "tool.called": ToolCalled,
    "tool.completed": ToolCompleted,
    "tool.failed": ToolFailed,
    "bus.gap_detected": BusGapDetected,
}

STREAMING: dict[str, type[Payload]] = {
    "message.start": MessageStart,
    "text.delta": TextDelta,
    "thinking.delta": ThinkingDelta,
    "tool.use_start": ToolUseStart,
    "tool.use_input_delta": ToolUseInputDelta,
    "tool.use_end": ToolUseEnd,
    "message.complete": MessageComplete,
}

TURN_TERMINAL = frozenset({"turn.completed", "turn.cancelled", "turn.failed"})
SYSTEM_STREAM = "system"
_PRIVATE_TYPES = frozenset({"turn.started", "llm.call_started"})


def sensitivity_of(event_type: str) -> str:
    """Derived at serialization, never stored."""
    if event_type in _PRIVATE_TYPES or event_type.startswith("tool."):
        return "private"
    return "pseudonymous"


def is_catalog_type(event_type: str) -> bool:
    """Whether a type is in the closed catalog, persisted or streaming-only; anything else is never
    valid."""
    return event_type in PERSISTED or event_type in STREAMING
