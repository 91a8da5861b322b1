"""Benchmark: what fitting a long session into its model's window costs per model call.

A session that outgrew its window is compacted before every model call, on the event loop. This
grows one session turn by turn (a user message, optionally a tool call and its 2 KB result, and
a 1,000-character reply per turn) and times what the runner does with it before each call:
assemble the history, compact it to a 200,000-token window (less 8,192 for the reply), keep the
estimate. The window fills after about half the turns; the figures after that point are what a
full session pays per call, the ones before it what every session pays.

Run: `python scripts/bench_compaction.py [--turns 1500] [--tools]`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metis.core.canonical.content import TextBlock, ToolResultBlock, ToolUseBlock
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message, MessageMetadata
from metis.core.routing.context import prompt_size
from metis.core.turns.context import assemble, compact

BUDGET = 200_000 - 8_192
SYSTEM = "s" * 3_000


def message(role: str, block: object, tool_use_id: str | None = None) -> Message:
    return Message(
        id=new_ulid(),
        session_id="sess_bench",
        turn_id="turn_bench",
        role=role,
        content=[block],
        created_at_us=1,
        metadata=MessageMetadata(tool_use_id=tool_use_id),
    )


def main(turns: int, tools: bool) -> None:
    history: list[Message] = []
    per_call: list[float] = []
    prompt = prompt_size(system_prompt=SYSTEM)
    for i in range(turns):
        history.append(message("user", TextBlock(text=f"turn {i}")))
        if tools:
            call_id = f"tu_{i}"
            history.append(
                message("assistant", ToolUseBlock(id=call_id, name="read_file", input={}))
            )
            result = ToolResultBlock(tool_use_id=call_id, content=[TextBlock(text="r" * 2_000)])
            history.append(message("tool", result, tool_use_id=call_id))
        history.append(message("assistant", TextBlock(text="a" * 1_000)))
        started = time.perf_counter()
        sent, _ = compact(assemble(history), BUDGET, prompt)
        per_call.append(time.perf_counter() - started)
    print(f"{turns} turns{' with a tool call each' if tools else ''}: {len(history)} messages")
    for turn in sorted({10, turns // 4, turns // 2, 3 * turns // 4, turns}):
        print(f"  turn {turn:>5}: {per_call[turn - 1] * 1000:8.2f} ms per call")
    print(f"  the last call sends {len(sent)} of {len(history)} messages")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=1_500)
    parser.add_argument("--tools", action="store_true", help="a tool call and result per turn")
    args = parser.parse_args()
    main(args.turns, args.tools)
