"""The AAP SSE relay delivers a reply the provider wrote in one socket write, whole.

The stream's queue bound (`aap.stream_queue_limit`) is set below the reply's delta count, so
before the turn waited for its readers this burst cancelled the turn as a disconnected client.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.testing import FakeProviderServer, FakeReply
from tests.aap.conftest import fake_models, roots


@pytest.mark.parametrize("deltas", [5_000, 50_000])
async def test_a_single_write_reply_is_relayed_as_every_text_delta(
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    client_for: Callable[..., Any],
    workspace: Path,
    deltas: int,
) -> None:
    aap_settings = {**roots(workspace)["aap"], "stream_queue_limit": 1000}
    daemon = await start_daemon(models=fake_models(fake), aap=aap_settings)
    aap = await client_for(daemon)
    text = "".join(f"{i % 10}" for i in range(deltas))
    fake.enqueue("anthropic", FakeReply.say(text, chunk_chars=1, single_write=True))
    sid = await aap.create()
    reply = await aap.say(sid, "burst", "delta")
    assert reply.stop == "end_turn"
    received = [d["delta"] for d in reply.data("text_delta")]
    assert len(received) == deltas and "".join(received) == text
