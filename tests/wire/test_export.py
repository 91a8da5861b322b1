"""The Markdown export of a session (a pure function of the REST objects)."""

from __future__ import annotations

from typing import Any

from metis.wire.export import to_markdown

SESSION = {
    "id": "sess_01M8F0Y1GRTGTNQW1QF6KMN09B",
    "workspace_path": "/w",
    "active_model": "local:scripted",
    "created_at": "2026-11-27T17:00:00Z",
    "turn_count": 2,
    "cost_so_far_usd": "0",
}


def user(turn: str, *content: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "turn_id": turn, "content": list(content)}


def ended(turn: str, kind: str, **payload: Any) -> dict[str, Any]:
    return {"type": f"turn.{kind}", "turn_id": turn, "payload": payload}


def test_images_sent_are_shown_and_a_turn_without_text_has_a_plain_heading() -> None:
    png = {"type": "base64", "media_type": "image/png", "data": "A" * 4096}
    messages = [
        user("t1", {"type": "image", "source": png}),
        user(
            "t2",
            {"type": "text", "text": "and this one?"},
            {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
        ),
    ]
    md = to_markdown({"session": SESSION, "messages": messages, "events": []})
    assert "## Turn 1\n" in md and "## Turn 1:" not in md
    assert "_[image: image/png, 3.0 KiB]_" in md
    assert "## Turn 2: and this one?" in md
    assert "and this one?\n\n_[image: https://x.test/a.jpg]_" in md


def test_a_turn_ended_without_a_message_says_only_its_reason() -> None:
    messages = [
        user("t1", {"type": "text", "text": "hi"}),
        user("t2", {"type": "text", "text": "x"}),
    ]
    events = [
        ended("t1", "cancelled", reason="server_shutdown", message=""),
        ended("t2", "failed", reason="provider_error", message="rate limited"),
    ]
    md = to_markdown({"session": SESSION, "messages": messages, "events": events})
    assert "_Turn cancelled (server_shutdown) ·" in md
    assert "_Turn failed (provider_error: rate limited) ·" in md


def test_a_long_first_line_is_cut_at_a_word_in_the_heading() -> None:
    prompt = "tell me about the sea " * 8
    messages = [user("t1", {"type": "text", "text": prompt})]
    md = to_markdown({"session": SESSION, "messages": messages, "events": []})
    [heading] = [line for line in md.splitlines() if line.startswith("## Turn 1")]
    title = heading.removeprefix("## Turn 1: ")
    assert title.endswith("sea tell me…") and len(title) <= 80  # no word cut, no trailing space


def test_a_tool_call_without_arguments_is_named_without_trailing_space() -> None:
    call = {"type": "tool_use", "id": "tu_1", "name": "clock__now", "input": {}}
    listing = {"type": "tool_use", "id": "tu_2", "name": "list_dir", "input": {}}
    messages = [
        user("t1", {"type": "text", "text": "look around"}),
        {"role": "assistant", "turn_id": "t1", "content": [call, listing]},
    ]
    md = to_markdown({"session": SESSION, "messages": messages, "events": []})
    assert "Tool call `clock__now`\n" in md
    assert "Tool call `list_dir` (the workspace root)\n" in md  # its path's default, said
