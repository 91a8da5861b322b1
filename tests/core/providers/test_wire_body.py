"""Request bodies built with the encoded history carried over equal bodies built from scratch."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import pytest

from metis.core.canonical.content import TextBlock, ThinkingBlock, ToolUseBlock
from metis.core.canonical.ids import new_tool_use_id
from metis.core.canonical.messages import Message
from metis.core.providers import anthropic as anthropic_wire
from metis.core.providers import openai as openai_wire
from metis.core.providers.wire_body import HistoryEncoder, ToolsEncoder, json_body
from tests.core.providers.provider_kit import (
    READ_FILE,
    caps,
    msg,
    png,
    request,
    tool_msg,
    user,
)


def _random_history(seed: int, length: int) -> list[Message]:
    """Histories a session can really hold, odd ones included: cancelled calls without results,
    stray results, empty and thinking-only replies, two user or two assistant messages in a row,
    images and lone surrogates in text."""
    rng = random.Random(seed)
    history: list[Message] = []
    open_calls: list[str] = []
    while len(history) < length:
        kind = rng.choice(["user", "user", "reply", "calls", "results", "odd"])
        if kind == "user":
            extra = [png()] if rng.random() < 0.2 else []
            history.append(user(f"question {len(history)} \u00e9\ud800", *extra))
        elif kind == "reply":
            blocks: list[Any] = [TextBlock(text=f"answer {len(history)}")]
            if rng.random() < 0.3:
                blocks.insert(0, ThinkingBlock(thinking="hmm", signature="sig"))
            history.append(msg("assistant", *blocks, provider="anthropic"))
        elif kind == "calls":
            open_calls = [new_tool_use_id() for _ in range(rng.randint(1, 3))]
            calls = [ToolUseBlock(id=i, name="read_file", input={"path": i}) for i in open_calls]
            history.append(msg("assistant", TextBlock(text="let me look"), *calls))
        elif kind == "results" and open_calls:
            call = open_calls.pop(rng.randrange(len(open_calls)))
            history.append(tool_msg(call, "contents", is_error=rng.random() < 0.3))
        else:
            history.append(
                rng.choice(
                    [
                        msg("assistant"),
                        msg("assistant", ThinkingBlock(thinking="only", signature="s")),
                        msg("assistant", TextBlock(text="again")),
                        tool_msg("tu_stray", "no call"),
                        msg("user", TextBlock(text="")),
                    ]
                )
            )
    return history


def _anthropic_body(messages: Sequence[Message], encoder: HistoryEncoder, **kw: Any) -> bytes:
    req = request("anthropic", *messages, tools=[READ_FILE], system="sys", **kw)
    return anthropic_wire.build_body(req, "anthropic", encoder, stream=True)


def _openai_body(messages: Sequence[Message], encoder: HistoryEncoder, **kw: Any) -> bytes:
    req = request("openai", *messages, tools=[READ_FILE], system="sys", **kw)
    return openai_wire.build_body(req, {}, encoder, stream=True)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("build", [_anthropic_body, _openai_body], ids=["anthropic", "openai"])
def test_a_growing_history_gets_the_same_body_as_a_fresh_encoder_would_build(
    seed: int, build: Any
) -> None:
    history = _random_history(seed, 60)
    kept = HistoryEncoder()
    for end in range(1, len(history) + 1):
        options = {"capabilities": caps(supports_prompt_caching=True, supports_images=end % 7 > 0)}
        if end % 11 == 0:
            options["thinking_budget_tokens"] = 2048
            options["capabilities"] = caps(supports_thinking=True, supports_prompt_caching=True)
        assert build(history[:end], kept, **options) == build(
            history[:end], HistoryEncoder(), **options
        )


@pytest.mark.parametrize("seed", range(6))
def test_the_spliced_messages_are_exactly_the_mapping_of_the_whole_history(seed: int) -> None:
    history = _random_history(seed, 40)
    kept = HistoryEncoder()
    for end in range(1, len(history) + 1):
        body = json.loads(_anthropic_body(history[:end], kept))
        whole = anthropic_wire.history_messages(
            history[:end],
            supports_images=caps().supports_images,
            thinking=False,
            provider_name="anthropic",
        )
        assert body["messages"] == json.loads(json.dumps(whole))


def test_each_message_is_mapped_a_bounded_number_of_times_over_a_long_session() -> None:
    history = _random_history(3, 200)
    mapped = 0

    def mapper(part: Sequence[Message]) -> list[dict[str, Any]]:
        nonlocal mapped
        mapped += len(part)
        return openai_wire.history_messages(part, supports_images=True)

    encoder = HistoryEncoder()
    for end in range(1, len(history) + 1):
        encoder.split(history[:end], True, mapper)
    assert mapped < 10 * len(history)  # from scratch it is ~len²/2 = 20,000


def test_a_session_growing_by_turns_reuses_all_but_its_last_turn() -> None:
    history: list[Message] = []
    encoder = HistoryEncoder()
    for turn in range(30):
        history += [user(f"q{turn}"), msg("assistant", TextBlock(text=f"a{turn}"))]
        done, rest = encoder.split(
            history, True, lambda part: openai_wire.history_messages(part, supports_images=True)
        )
        assert len(done) == 2 * turn + 1 and len(rest) == 1


def test_fields_follow_the_encoded_messages_in_one_object() -> None:
    assert json.loads(json_body({"model": "m"}, [b'{"role":"user"}'])) == {
        "messages": [{"role": "user"}],
        "model": "m",
    }
    assert json.loads(json_body({}, [])) == {"messages": []}
    assert json.loads(json_body({}, [b"1", b"[2]", b'{"r":3}'])) == {"messages": [1, [2], {"r": 3}]}
    assert json.loads(json_body({"a": 1, "b": [2]}, [b"1", b"2"])) == {
        "messages": [1, 2],
        "a": 1,
        "b": [2],
    }


def test_encoded_fields_are_spliced_after_the_others() -> None:
    assert json.loads(json_body({"a": 1}, [b"1"], {"tools": b'[{"n":2}]'})) == {
        "messages": [1],
        "a": 1,
        "tools": [{"n": 2}],
    }
    assert json.loads(json_body({}, [], {"tools": b"[]"})) == {"messages": [], "tools": []}


@pytest.mark.parametrize("wire", [anthropic_wire, openai_wire], ids=["anthropic", "openai"])
def test_tools_encoded_once_give_the_bodies_tools_encoded_at_every_call_give(wire: Any) -> None:
    kept = ToolsEncoder()
    second = READ_FILE.model_copy(update={"name": "other_tool"})
    named: Any = "anthropic" if wire is anthropic_wire else {}
    for offered, caching in [
        ([READ_FILE], True),
        ([READ_FILE], False),
        ([READ_FILE, second], True),
    ]:
        req = request(
            "fake", user("q"), tools=offered, capabilities=caps(supports_prompt_caching=caching)
        )
        fresh = json.loads(wire.build_body(req, named, HistoryEncoder(), stream=True))
        for _ in range(2):  # the second call reuses what the first encoded
            body = wire.build_body(req, named, HistoryEncoder(), stream=True, tools_encoder=kept)
            assert json.loads(body) == fresh


def test_a_lone_surrogate_in_stored_text_is_sent_escaped() -> None:
    body = _openai_body([user("broken \ud800 text")], HistoryEncoder())
    assert b"\\ud800" in body and body.isascii()


def test_tool_results_keep_their_place_when_the_history_grows_past_their_call() -> None:
    call = ToolUseBlock(id=new_tool_use_id(), name="read_file", input={"path": "a"})
    history = [user("go"), msg("assistant", call)]
    encoder = HistoryEncoder()
    first = json.loads(_anthropic_body(history, encoder))["messages"]
    assert first[-1]["content"][0]["is_error"]  # no result yet: the "not completed" stand-in
    history.append(tool_msg(call.id, "the real result"))
    history.append(user("and then?"))
    grown = json.loads(_anthropic_body(history, encoder))["messages"]
    assert [m["role"] for m in grown] == ["user", "assistant", "user"]
    result, text = grown[-1]["content"]
    assert result["content"] == [{"type": "text", "text": "the real result"}]
    assert "is_error" not in result and text["text"] == "and then?"
