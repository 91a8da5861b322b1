"""The bus trusts payloads of the providers' stream models (`emit_transient(typed=True)`).

That is only sound while each model's `payload()` is exactly what the streaming catalog would
produce from it; these tests pin the two together so neither can drift alone.
"""

from __future__ import annotations

import pytest

from metis.core.events.catalog import STREAMING
from metis.core.providers.base import (
    MessageStart,
    TextDelta,
    ThinkingDelta,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
    _Event,
    _FlatEvent,
)

SAMPLES: list[_FlatEvent | _Event] = [
    MessageStart(message_id="m1", model="anthropic:x"),
    TextDelta(message_id="m1", content_block_index=0, text="hé"),
    ThinkingDelta(message_id="m1", content_block_index=1, text="", signature="sig"),
    ThinkingDelta(message_id="m1", content_block_index=1, text="hmm"),
    ToolUseStart(message_id="m1", content_block_index=2, tool_use_id="tu_1", tool_name="read_file"),
    ToolUseInputDelta(
        message_id="m1", content_block_index=2, tool_use_id="tu_1", partial_json='{"pa'
    ),
    ToolUseEnd(
        message_id="m1", content_block_index=2, tool_use_id="tu_1", final_input={"path": "a"}
    ),
]


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.type)
def test_typed_stream_payload_equals_what_the_catalog_would_emit(
    event: _FlatEvent | _Event,
) -> None:
    payload = event.payload()
    catalog_model = STREAMING[event.type]  # type: ignore[attr-defined]
    assert catalog_model.model_validate(payload).model_dump(mode="json") == payload


def test_every_streamed_type_but_message_complete_has_a_typed_sample() -> None:
    sampled = {e.type for e in SAMPLES}  # type: ignore[attr-defined]
    assert sampled == set(STREAMING) - {"message.complete"}
