"""Core events of one turn → AAP stream events and stop reasons.

The renderer reads the session hub's ordered channel, so deltas, completed messages and tool
outcomes arrive exactly in emission order. `tool_call`s come from `message.complete` (only
stored calls are announced); `tool_result`s read the stored `tool` message named by the
outcome event's `result_message_id`. Client (application) calls never get a `tool_result`.
"""

from __future__ import annotations

from typing import Any, Literal

from metis.aap.mapping import render_content
from metis.core.application import History
from metis.core.canonical.content import (
    CONTENT_LIST_ADAPTER,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    interrupted_form,
)
from metis.core.events.envelope import AnyEvent

Mode = Literal["delta", "message"]
TERMINAL = frozenset({"turn.completed", "turn.failed", "turn.cancelled"})
TOOL_OUTCOMES = frozenset({"tool.completed", "tool.failed", "tool.input_invalid"})
_COMPLETED_STOP = {
    "end_turn": "end_turn",
    "stop_sequence": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "refusal": "refusal",
}


def stop_reason_of(event_type: str, payload: dict[str, Any]) -> str:
    """The AAP stopReason of a turn's terminal event; anything unlisted is `error`."""
    if event_type == "turn.completed":
        return _COMPLETED_STOP.get(payload.get("stop_reason", ""), "error")
    if event_type == "turn.failed" and payload.get("error_class") == "context_overflow":
        return "max_tokens"
    return "error"


class Renderer:
    def __init__(
        self,
        history: History,
        mode: Mode,
        client_tool_names: frozenset[str],
        answered_application_ids: frozenset[str],
    ) -> None:
        self.history = history
        self.mode = mode
        self.client_tool_names = client_tool_names
        self.application_ids: set[str] = set(answered_application_ids)

    async def render(self, event: AnyEvent) -> list[tuple[str, dict[str, Any]]]:
        kind, payload = event.type, event.payload
        if kind == "text.delta":
            if self.mode == "delta" and payload["text"]:
                return [("text_delta", {"delta": payload["text"]})]
            return []
        if kind == "thinking.delta":
            if self.mode == "delta" and payload["text"]:
                return [("thinking_delta", {"delta": payload["text"]})]
            return []
        if kind == "message.complete":
            return self._complete(payload)
        if kind in TOOL_OUTCOMES:
            return await self._tool_result(payload)
        if kind in TERMINAL:
            return [("turn_stop", {"stopReason": stop_reason_of(kind, payload)})]
        return []

    def _complete(self, payload: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        blocks = CONTENT_LIST_ADAPTER.validate_python(payload["final_content"])
        interrupted = payload["stop_reason"] in ("cancelled", "error")
        if interrupted:
            blocks = interrupted_form(blocks)  # what is stored for an interrupted call
        out: list[tuple[str, dict[str, Any]]] = []
        for block in blocks:
            if isinstance(block, ToolUseBlock):
                if block.name in self.client_tool_names:
                    self.application_ids.add(block.id)
                out.append(
                    (
                        "tool_call",
                        {"toolCallId": block.id, "name": block.name, "input": block.input},
                    )
                )
            elif self.mode == "message" and isinstance(block, ThinkingBlock):
                out.append(("thinking", {"thinking": block.thinking}))
            elif self.mode == "message" and isinstance(block, TextBlock) and block.text:
                out.append(("text", {"text": block.text}))
        return out

    async def _tool_result(self, payload: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        tool_use_id = payload["tool_use_id"]
        if tool_use_id in self.application_ids:
            return []
        message = await self.history.message(payload["result_message_id"])
        block = message.content[0] if message is not None and message.content else None
        if not isinstance(block, ToolResultBlock):
            return []
        return [
            (
                "tool_result",
                {"toolCallId": tool_use_id, "content": render_content(block.content, None)},
            )
        ]
