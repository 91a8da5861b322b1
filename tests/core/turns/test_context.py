"""Context assembly (orphan repair, skipped rows) and compaction to the model's budget."""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

from metis.core.canonical.content import (
    Base64Source,
    ImageBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message, MessageMetadata
from metis.core.canonical.usage import TokenUsage
from metis.core.routing.context import estimate_input_tokens, message_size, tokens_for
from metis.core.turns.context import (
    OMITTED_RESULT,
    UNAVAILABLE_RESULT,
    assemble,
    compact,
    count_observed,
    overflow_observed,
    scaled_budget,
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


def test_a_stand_in_result_is_the_same_object_at_every_call() -> None:
    # a call waiting for its answer: the next call's context starts with this one's, so the
    # sizes and wire encodings remembered for it are found again
    history = [msg("user", TextBlock(text="go")), call("tu_1")]
    first, second = assemble(history), assemble([*history])
    assert first[-1] is second[-1] and first[-1].content[0].content[0].text == UNAVAILABLE_RESULT
    history = [*history, result("tu_1", "x" * 1000), msg("user", TextBlock(text="next"))]
    blanked, _ = compact(history, 20, NO_PROMPT)
    again, _ = compact([*history], 20, NO_PROMPT)
    assert blanked[2] is again[2] and blanked[2].content[0].content[0].text == OMITTED_RESULT


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


NO_PROMPT = (0, 0)
IMAGE = ImageBlock(source=Base64Source(media_type="image/png", data="aGVsbG8="))


def test_compaction_blanks_old_tool_results_first() -> None:
    history = [
        msg("user", TextBlock(text="go")),
        call("tu_1"),
        result("tu_1", "x" * 1000),
        msg("assistant", TextBlock(text="read it")),
        msg("user", TextBlock(text="now?")),
    ]
    out, estimate = compact(history, 50, NO_PROMPT)
    assert out[2].content[0].content[0].text == OMITTED_RESULT
    assert len(out) == len(history) and history[2].content[0].content[0].text == "x" * 1000
    assert estimate == estimate_input_tokens(history=out) <= 50


def test_compaction_blanks_a_short_result_that_carries_an_image() -> None:
    """A screenshot under a one-word caption costs an image's tokens: blanking it frees them,
    however short its text."""
    pictured = ToolResultBlock(tool_use_id="tu_1", content=[TextBlock(text="shot"), IMAGE])
    history = [
        msg("user", TextBlock(text="go")),
        call("tu_1"),
        msg("tool", pictured, tool_use_id="tu_1"),
        msg("assistant", TextBlock(text="seen")),
        msg("user", TextBlock(text="now?")),
    ]
    out, estimate = compact(history, 200, NO_PROMPT)
    assert out[2].content[0].content == [TextBlock(text=OMITTED_RESULT)]
    assert len(out) == len(history) and estimate == estimate_input_tokens(history=out) <= 200


def test_compaction_drops_old_exchanges_but_keeps_the_newest_user_message() -> None:
    history = []
    for i in range(5):
        history += [
            msg("user", TextBlock(text=f"q{i} " + "y" * 100)),
            msg("assistant", TextBlock(text="a" * 100)),
        ]
    history.append(msg("user", TextBlock(text="latest")))
    out, estimate = compact(history, 60, NO_PROMPT)
    assert out[-1].content[0].text == "latest" and out[0].role == "user"
    assert out == history[-len(out) :] and len(out) % 2 == 1
    assert estimate == estimate_input_tokens(history=out) <= 60


def test_compaction_keeps_the_newest_user_message_even_over_budget() -> None:
    history = [msg("user", TextBlock(text="q " * 100)), msg("assistant", TextBlock(text="a"))]
    history.append(msg("user", TextBlock(text="z" * 1000)))
    out, estimate = compact(history, 10, (400, 1))
    assert out == history[-1:] and estimate == 250 + 100 + 1600


def test_compaction_blanks_the_results_of_the_newest_request_when_they_outgrow_the_budget() -> None:
    """One request whose tool calls read more than the window holds: its results are blanked,
    oldest first, down to the newest one if need be, instead of sending an over-long request."""
    history = [msg("user", TextBlock(text="read the three files"))]
    for i in range(3):
        history += [call(f"tu_{i}"), result(f"tu_{i}", "x" * 8000)]
    out, estimate = compact(history, 5000, NO_PROMPT)
    texts = [m.content[0].content[0].text for m in out if m.role == "tool"]
    assert len(out) == len(history) and out[0] == history[0]
    assert texts == [OMITTED_RESULT, "x" * 8000, "x" * 8000]
    assert estimate == estimate_input_tokens(history=out) <= 5000
    alone, estimate = compact(
        [history[0], call("tu_9"), result("tu_9", "y" * 40000)], 5000, NO_PROMPT
    )
    assert alone[-1].content[0].content[0].text == OMITTED_RESULT and estimate <= 5000


def test_results_the_model_has_not_seen_are_blanked_only_as_far_as_fitting_needs() -> None:
    """Freeing a quarter of the budget at a time would blank the newest result too, which the
    model asked for to answer now: it stays when blanking the older ones makes the call fit."""
    history = [
        msg("user", TextBlock(text="read both")),
        call("tu_1"),
        result("tu_1", "x" * 1300),
        msg("assistant", ToolUseBlock(id="tu_2", name="read_file", input={"path": "b"})),
        result("tu_2", "y" * 3700),
    ]
    out, estimate = compact(history, 1000, NO_PROMPT)
    assert out[2].content[0].content[0].text == OMITTED_RESULT
    assert out[4].content[0].content[0].text == "y" * 3700 and estimate <= 1000


def test_compaction_is_a_no_op_within_budget() -> None:
    history = [msg("user", TextBlock(text="short"))]
    out, estimate = compact(history, 100, (40, 0))
    assert out is history and estimate == 12


def _compact_by_remeasuring(
    messages: list[Message], budget: int, prompt: tuple[int, int]
) -> list[Message]:
    """The rule stated plainly, measuring the context again after every change: free at least
    the overflow rounded up to a quarter of the budget, blanking the oldest tool results first,
    then dropping the oldest exchanges, then blanking the results after the newest request."""

    def size(candidate: Sequence[Message], with_prompt: bool = True) -> tuple[int, int]:
        chars, images = prompt if with_prompt else (0, 0)
        for m in candidate:
            c, i = message_size(m)
            chars, images = chars + c, images + i
        return chars, images

    def fits(candidate: Sequence[Message]) -> bool:
        return tokens_for(size(candidate)) <= budget

    def to_free(candidate: Sequence[Message]) -> int:
        step = max(1, budget // 4)
        return step * math.ceil((tokens_for(size(candidate)) - budget) / step)

    def blankable(m: Message) -> bool:
        block = m.content[0] if m.content else None
        pictured = any(isinstance(inner, ImageBlock) for inner in getattr(block, "content", ()))
        return isinstance(block, ToolResultBlock) and (chars([m]) > len(OMITTED_RESULT) or pictured)

    def blank(candidate: list[Message], i: int) -> bool:
        if not blankable(candidate[i]):
            return False
        block = candidate[i].content[0]
        assert isinstance(block, ToolResultBlock)
        slim = ToolResultBlock(
            tool_use_id=block.tool_use_id, content=[TextBlock(text=OMITTED_RESULT)]
        )
        candidate[i] = candidate[i].model_copy(update={"content": [slim]})
        return True

    def freed(before: tuple[int, int], candidate: Sequence[Message]) -> int:
        now = size(candidate)
        return tokens_for((before[0] - now[0], before[1] - now[1]))

    if fits(messages):
        return messages
    out = list(messages)
    last_user = max((i for i, m in enumerate(out) if m.role == "user"), default=0)
    wanted, before = to_free(messages), size(messages)
    blanked = False
    for i in range(last_user):
        if blank(out, i):
            blanked = True
            if freed(before, out) >= wanted and fits(out):
                return out
    if blanked and fits(out):
        return out  # all of them blanked fits, though it frees less than asked
    wanted, cut = to_free(out), 0
    for cut in range(1, last_user + 1):
        if out[cut].role == "user" and (
            cut == last_user or (tokens_for(size(out[:cut], False)) >= wanted and fits(out[cut:]))
        ):
            break
    out = out[cut:]
    if fits(out):
        return out
    wanted, before = to_free(out), size(out)
    newest = len(out)  # the results after it: the model has not seen them yet
    while newest and out[newest - 1].role == "tool":
        newest -= 1
    for i in range(last_user - cut, len(out)):
        seen_left = any(blankable(m) for m in out[i + 1 : newest])
        if blank(out, i) and fits(out) and (freed(before, out) >= wanted or not seen_left):
            break
    return out


def test_compaction_keeps_the_start_of_the_context_while_the_history_grows_a_little() -> None:
    history: list[Message] = []
    for i in range(40):
        history += [
            msg("user", TextBlock(text=f"q{i}")),
            msg("assistant", TextBlock(text="a" * 400)),
        ]
    starts = []
    for i in range(40, 60):  # each turn adds ~100 tokens to a budget of 4,000
        history += [
            msg("user", TextBlock(text=f"q{i}")),
            msg("assistant", TextBlock(text="a" * 400)),
        ]
        out, estimate = compact(history, 4000, NO_PROMPT)
        assert estimate <= 4000 and out[0].role == "user"
        starts.append(history.index(out[0]))
    assert len(set(starts)) <= 3 and starts == sorted(starts)  # a cut every ~10 turns, not each


def test_compaction_keeps_what_remeasuring_after_every_change_keeps() -> None:
    rng = random.Random(19)
    for _ in range(300):
        history: list[Message] = []
        for turn in range(rng.randint(1, 12)):
            history.append(msg("user", TextBlock(text="u" * rng.randint(1, 300))))
            for step in range(rng.randint(0, 3)):
                tool_id = f"tu_{turn}_{step}"
                done = result(tool_id, "r" * rng.randint(0, 900 if rng.random() < 0.7 else 60))
                if rng.random() < 0.2:  # a screenshot too: blanking it saves an image's tokens
                    block = done.content[0]
                    assert isinstance(block, ToolResultBlock)
                    pictured = block.model_copy(update={"content": [*block.content, IMAGE]})
                    done = done.model_copy(update={"content": [pictured]})
                history += [call(tool_id), done]
            history.append(msg("assistant", TextBlock(text="a" * rng.randint(1, 300))))
        if rng.random() < 0.5:
            history.append(msg("user", TextBlock(text="latest")))
        budget, prompt = rng.randint(1, 6000), (rng.randint(0, 800), 0)
        out, estimate = compact(history, budget, prompt)
        expected = _compact_by_remeasuring(history, budget, prompt)
        assert [(m.id, m.content) for m in out] == [(m.id, m.content) for m in expected]
        assert estimate == estimate_input_tokens(system_prompt="x" * prompt[0], history=out)


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


def test_a_provider_count_past_the_estimate_scales_the_budget_down() -> None:
    scales: dict[str, float] = {}
    count_observed(scales, "m", 30_000, 100_000, TokenUsage(input_tokens=30_000))
    assert scaled_budget(100_000, scales.get("m", 1.0)) == 100_000  # counted as estimated
    cached = TokenUsage(input_tokens=1_000, cache_read_tokens=35_000, cache_write_tokens=4_000)
    count_observed(scales, "m", 30_000, 100_000, cached)
    assert scaled_budget(100_000, scales["m"]) == 75_000  # 40,000 counted for 30,000 estimated
    count_observed(scales, "m", 60_000, 100_000, TokenUsage(input_tokens=60_000))
    assert scaled_budget(100_000, scales["m"]) == 75_000  # the most seen stays
    assert "other" not in scales


def test_a_small_call_or_an_estimated_count_does_not_scale_the_budget() -> None:
    """What a provider adds to every request (its tool-use instructions) would read as a high
    ratio in a small call, and an adapter's own estimate says nothing of the provider's count."""
    scales: dict[str, float] = {}
    count_observed(scales, "m", 2_000, 100_000, TokenUsage(input_tokens=5_000))
    count_observed(scales, "m", 50_000, 100_000, TokenUsage(input_tokens=90_000, estimated=True))
    assert scales == {}


def test_a_refusal_as_too_long_leaves_room_for_more_than_the_window() -> None:
    scales: dict[str, float] = {}
    overflow_observed(scales, "m", 150_000, 200_000)
    assert scaled_budget(150_000, scales["m"]) * 200_000 / 150_000 < 150_000
