"""Context assembly (orphan repair, skipped rows) and compaction to the model's budget."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from metis.core.canonical.content import TextBlock, ToolResultBlock, ToolUseBlock
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message, MessageMetadata
from metis.core.turns.context import (
    OMITTED_RESULT,
    UNAVAILABLE_RESULT,
    assemble,
    compact,
    workspace_facts,
)


def msg(role: str, *blocks: object, **meta: object) -> Message:
    return Message(
        id=new_ulid(),
        session_id="s",
        turn_id="t",
        role=role,
        content=list(blocks),
        created_at_us=1,
        metadata=MessageMetadata(**meta),
    )


def call(tool_id: str) -> Message:
    return msg("assistant", ToolUseBlock(id=tool_id, name="read_file", input={"path": "a"}))


def result(tool_id: str, text: str = "ok") -> Message:
    return msg(
        "tool",
        ToolResultBlock(tool_use_id=tool_id, content=[TextBlock(text=text)]),
        tool_use_id=tool_id,
    )


def test_a_tool_use_without_a_stored_result_gets_a_synthetic_error_result() -> None:
    history = [msg("user", TextBlock(text="go")), call("tu_1"), msg("user", TextBlock(text="next"))]
    out = assemble(history)
    assert [m.role for m in out] == ["user", "assistant", "tool", "user"]
    synthetic = out[2].content[0]
    assert synthetic.is_error and synthetic.content[0].text == UNAVAILABLE_RESULT


def test_empty_rows_and_results_without_calls_are_skipped() -> None:
    history = [msg("user", TextBlock(text="go")), msg("assistant", status="error"), result("tu_x")]
    assert [m.role for m in assemble(history)] == ["user"]


def test_results_follow_their_calls_and_interrupted_calls_are_not_reopened() -> None:
    history = [
        msg("user", TextBlock(text="go")),
        call("tu_1"),
        result("tu_1"),
        msg("assistant", TextBlock(text="done")),
    ]
    assert [m.role for m in assemble(history)] == ["user", "assistant", "tool", "assistant"]


def chars(messages: Sequence[Message]) -> int:
    total = 0
    for m in messages:
        for b in m.content:
            if isinstance(b, TextBlock):
                total += len(b.text)
            elif isinstance(b, ToolResultBlock):
                total += sum(len(c.text) for c in b.content if isinstance(c, TextBlock))
    return total


def test_compaction_blanks_old_tool_results_first() -> None:
    history = [
        msg("user", TextBlock(text="go")),
        call("tu_1"),
        result("tu_1", "x" * 1000),
        msg("assistant", TextBlock(text="read it")),
        msg("user", TextBlock(text="now?")),
    ]
    out = compact(history, budget_tokens=200, estimate=chars)
    assert out[2].content[0].content[0].text == OMITTED_RESULT
    assert len(out) == len(history) and history[2].content[0].content[0].text == "x" * 1000


def test_compaction_drops_old_exchanges_but_keeps_the_newest_user_message() -> None:
    history = []
    for i in range(5):
        history += [
            msg("user", TextBlock(text=f"q{i} " + "y" * 100)),
            msg("assistant", TextBlock(text="a" * 100)),
        ]
    history.append(msg("user", TextBlock(text="latest")))
    out = compact(history, budget_tokens=250, estimate=chars)
    assert out[-1].content[0].text == "latest" and out[0].role == "user"
    assert chars(out) <= 250 or len(out) == 1


def test_compaction_is_a_no_op_within_budget() -> None:
    history = [msg("user", TextBlock(text="short"))]
    assert compact(history, budget_tokens=100, estimate=chars) is history


def test_workspace_facts_list_the_root(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    (root / "src").mkdir()
    (root / "a.py").write_text("")
    facts = workspace_facts(str(root))
    assert "a.py, src/" in facts and str(root) in facts


def test_workspace_facts_follow_every_change_of_the_root(tmp_path: Path) -> None:
    """The listing is reused between calls, yet an entry added, removed or renamed shows at
    the next call, even one made right after the listing (a listing of a directory changed
    less than a second before is not reused)."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.py").write_text("")
    settled = time.time_ns() - 5_000_000_000
    os.utime(root, ns=(settled, settled))  # listed long after its last change: reusable
    assert "Top-level entries: a.py" in workspace_facts(str(root))
    (root / "b.py").write_text("")
    assert "a.py, b.py" in workspace_facts(str(root))
    (root / "a.py").rename(root / "c.py")  # in the same tick as the listing just made
    assert "b.py, c.py" in workspace_facts(str(root))
    for i in range(60):
        (root / f"f{i:02}").write_text("")
    facts = workspace_facts(str(root))
    assert "and 22 more" in facts and "b.py, c.py, f00" in facts
    (root / ".git").mkdir()
    assert "git repository" in workspace_facts(str(root))


def test_assembling_a_grown_history_equals_assembling_it_afresh() -> None:
    history = [
        msg("user", TextBlock(text="go")),
        call("tu_1"),
        msg("user", TextBlock(text="interrupting")),  # tu_1 gets a synthetic result
        call("tu_2"),
    ]
    first = assemble(history)
    assert [m.role for m in first] == ["user", "assistant", "tool", "user", "assistant", "tool"]
    history += [result("tu_2"), msg("assistant", TextBlock(text="done"))]
    grown = assemble(history)
    roles = ["user", "assistant", "tool", "user", "assistant", "tool", "assistant"]
    assert [m.role for m in grown] == roles
    assert grown[5] is history[4]  # the stored result, not the synthetic one of the first call
    assert assemble(list(history)) == grown
    assert first[:5] == grown[:5]
