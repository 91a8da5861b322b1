"""The texts a model receives for each outcome and the result cap.

Every text is built here so that the dispatcher, the executor and the AAP resolution path
cannot drift apart; only denials start with `Tool call denied`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from metis.core.canonical.content import TextBlock, ToolResultBlock, text_of
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message, MessageMetadata
from metis.core.canonical.redaction import redact
from metis.core.tools.base import PermissionDenied, ResultBlock, ToolError, ToolOutput
from metis.core.tools.schema import InputError
from metis.core.tools.textutil import seconds

ErrorClass = Literal[
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

CANCELLED = "Tool call cancelled"
INTERRUPTED = "Tool call interrupted: metis stopped before the tool finished"
DENIED = "Tool call denied"


# ---------------------------------------------------------------------------------------------
# Result texts
# ---------------------------------------------------------------------------------------------


def not_found_text(name: str, available: Iterable[str]) -> str:
    """The result for a call to a tool the session was not offered, listing what it may call."""
    names = ", ".join(available) or "none"
    return f'Unknown tool "{name}". Available tools: {names}.'


def input_invalid_text(name: str, errors: Sequence[InputError]) -> str:
    """The result for an input that failed the tool's schema, one line per error."""
    lines = [f"Invalid input for {name}:"]
    lines.extend(f"- {e.path}: {e.message}" for e in errors)
    return "\n".join(lines)


def policy_denied_text(name: str) -> str:
    """The result for a tool the local confirmation policy denies outright."""
    return f'Tool "{name}" is disabled by the local tool policy.'


def not_enabled_denied_text(name: str) -> str:
    """A granted AAP call whose tool was disabled meanwhile (`policy_denied`)."""
    return f"{DENIED}: tool {name} is not enabled"


def user_denied_text(reason: str | None = None) -> str:
    """The result for a call the user denied, with their reason if they gave one."""
    return f"{DENIED}: {reason}" if reason else DENIED


def confirmation_timeout_text(timeout_seconds: float) -> str:
    """The result for a confirmation nobody answered in time."""
    return (
        f"No answer to the confirmation request within {seconds(timeout_seconds)} s; "
        "the tool was not run."
    )


def timeout_text(timeout_seconds: float, partial_output: str | None = None) -> str:
    """The result for a call stopped at its timeout, with whatever output it had produced."""
    head = f"Timed out after {seconds(timeout_seconds)} s."
    return f"{head}\n{partial_output}" if partial_output else head


def mcp_timeout_note(server: str, tool: str, settings: Sequence[str]) -> str:
    """What follows `Timed out after N s.` for an MCP tool: which server's tool it was and the
    config.yaml settings that allow it longer (any of `settings`), so that a person knows what
    to change; a builtin's timeout says nothing more."""
    return (
        f'The call to tool "{tool}" of MCP server "{server}" was cancelled at its limit; raise '
        f"{' or '.join(settings)} in config.yaml to allow it longer."
    )


def cancelled_text(partial_output: str | None = None) -> str:
    """The result for a cancelled call, with whatever output it had produced."""
    return f"{CANCELLED}\n{partial_output}" if partial_output else CANCELLED


def internal_error_text(name: str, tool_use_id: str) -> str:
    """The result for a tool that crashed; details stay in the daemon log, the tool use id finds
    them."""
    return f'Tool "{name}" failed with an internal error (see daemon log, {tool_use_id}).'


# ---------------------------------------------------------------------------------------------
# Outcomes and the cap
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolOutcome:
    """What the dispatcher turns into the stored `tool_result` and the terminal event.

    `error_class is None` → `tool.completed` (with `is_error` possibly true); otherwise
    `tool.failed{error_class}` with `message`.
    """

    error_class: ErrorClass | None
    content: tuple[ResultBlock, ...]
    is_error: bool
    files_modified: tuple[str, ...] | None = None
    exit_code: int | None = None
    truncated: bool = False
    output_bytes: int = 0
    duration_ms: int = 0

    @property
    def text(self) -> str:
        return text_of(list(self.content))

    @property
    def message(self) -> str:
        """The redacted text for `tool.failed.message`."""
        return redact(self.text)


@dataclass(frozen=True)
class CappedContent:
    """Result blocks after the cap, whether they were cut, and the byte size before cutting
    (`tool.completed.output_bytes`)."""

    content: tuple[ResultBlock, ...]
    truncated: bool
    output_bytes: int


_UNCAPPED = 1 << 62


def _marker(shown: int, total: int) -> str:
    return f"\n[output truncated: {shown} of {total} bytes shown]"


def cap_content(content: Sequence[ResultBlock], max_bytes: int) -> CappedContent:
    """Keep the head of the result's text within `max_bytes` (UTF-8), marker included.

    The text of all text blocks counts together; the first block that does not fit is cut on
    a character boundary and the marker appended to it; later text blocks are dropped. Image
    blocks are not text and pass unchanged.
    """
    sizes = [len(b.text.encode("utf-8")) if isinstance(b, TextBlock) else 0 for b in content]
    total = sum(sizes)
    if total <= max_bytes:
        return CappedContent(tuple(content), False, total)
    budget = max(0, max_bytes - len(_marker(max_bytes, total).encode("utf-8")))
    out: list[ResultBlock] = []
    shown = 0
    cut_done = False
    for block, size in zip(content, sizes, strict=True):
        if not isinstance(block, TextBlock):
            out.append(block)
            continue
        if cut_done:
            continue
        if shown + size <= budget:
            out.append(block)
            shown += size
            continue
        head = block.text.encode("utf-8")[: budget - shown].decode("utf-8", "ignore")
        shown += len(head.encode("utf-8"))
        out.append(TextBlock(text=head + _marker(shown, total)))
        cut_done = True
    return CappedContent(tuple(out), True, total)


def tool_result_message(
    session_id: str, turn_id: str | None, tool_use_id: str, outcome: ToolOutcome, stamp: int
) -> Message:
    """The `tool` message that stores a tool use's result: the one builder for the dispatcher,
    the resolution path (application results and denials) and start-up recovery."""
    return Message(
        id=new_ulid(),
        session_id=session_id,
        turn_id=turn_id,
        role="tool",
        content=[
            ToolResultBlock(
                tool_use_id=tool_use_id, content=list(outcome.content), is_error=outcome.is_error
            )
        ],
        created_at_us=stamp,
        metadata=MessageMetadata(tool_use_id=tool_use_id),
    )


def failed(
    error_class: ErrorClass, text: str, *, duration_ms: int = 0, max_bytes: int | None = None
) -> ToolOutcome:
    """A `tool.failed` outcome whose result text is `text` (`is_error: true`)."""
    blocks: list[ResultBlock] = [TextBlock(text=text)]
    capped = cap_content(blocks, max_bytes if max_bytes is not None else _UNCAPPED)
    return ToolOutcome(
        error_class=error_class,
        content=capped.content,
        is_error=True,
        truncated=capped.truncated,
        output_bytes=capped.output_bytes,
        duration_ms=duration_ms,
    )


def completed(output: ToolOutput, *, duration_ms: int, max_bytes: int) -> ToolOutcome:
    """A `tool.completed` outcome from what the tool returned, capped at the result limit."""
    capped = cap_content(output.content, max_bytes)
    return ToolOutcome(
        error_class=None,
        content=capped.content,
        is_error=output.is_error,
        files_modified=tuple(output.files_modified) if output.files_modified is not None else None,
        exit_code=output.exit_code,
        truncated=capped.truncated or output.truncated,
        output_bytes=capped.output_bytes,
        duration_ms=duration_ms,
    )


def expected_failure(
    exc: BaseException, *, duration_ms: int = 0, max_bytes: int | None = None
) -> ToolOutcome | None:
    """The outcome of an expected failure (`ToolError`, a sandbox refusal), else None."""
    if isinstance(exc, ToolError):
        return failed("tool_error", exc.message, duration_ms=duration_ms, max_bytes=max_bytes)
    if isinstance(exc, PermissionDenied):
        return failed(
            "permission_denied", exc.message, duration_ms=duration_ms, max_bytes=max_bytes
        )
    return None
