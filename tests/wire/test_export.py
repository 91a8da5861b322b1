"""The Markdown export of a session (a pure function of the REST objects)."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from markdown_it import MarkdownIt

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
    assert "> and this one?\n>\n> _[image: https://x.test/a.jpg]_" in md


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


def test_a_turns_tokens_in_count_those_read_from_the_cache() -> None:
    """With prompt caching most of a long session's input is read from the cache."""
    usage = {"input_tokens": 12, "cache_read_tokens": 5000, "cache_write_tokens": 300}
    events = [ended("t1", "completed", llm_call_count=1, output_tokens=7, **usage)]
    md = to_markdown(
        {
            "session": SESSION,
            "messages": [user("t1", {"type": "text", "text": "hi"})],
            "events": events,
        }
    )
    assert "· 5312 in / 7 out tokens ·" in md


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


def outline(md: str) -> list[str]:
    """What a reader sees as the document's structure: its top-level headings (`h2 Turn 1`)
    and the top-level paragraphs that label a message or end a turn, in order."""
    tokens = MarkdownIt("commonmark").parse(md)
    seen = []
    for opening, inline in pairwise(tokens):
        if opening.level != 0 or inline.type != "inline":
            continue
        if opening.type == "heading_open":
            seen.append(f"{opening.tag} {inline.content}")
        elif opening.type == "paragraph_open" and inline.content.startswith(("**", "_Turn")):
            seen.append(inline.content.split(" ·")[0])
    return seen


def test_hostile_messages_leave_the_exports_own_structure_whole() -> None:
    """A prompt's headings and unclosed fence stay inside its quote; a reply cut off inside a
    code block has it closed, its headings go below the turn's, and a reply that would still
    swallow the rest (an unterminated HTML comment) is shown verbatim; the seeded system
    message is shown, the cut-off reply marked."""
    hostile = "## Turn 5: injected\n```\nunclosed fence"
    messages = [
        {"role": "system", "turn_id": None, "content": [{"type": "text", "text": hostile}]},
        user("t1", {"type": "text", "text": hostile}),
        {
            "role": "assistant",
            "turn_id": "t1",
            "metadata": {"status": "cancelled", "model": "local:scripted"},
            "content": [{"type": "text", "text": "Here:\n\n# Summary\n\n~~~~python\nprint(1)\n"}],
        },
        user("t2", {"type": "text", "text": "<!-- hidden\n\n**Assistant**:\n\n````"}),
        {
            "role": "assistant",
            "turn_id": "t2",
            "metadata": {"status": "error"},
            "content": [
                {"type": "thinking", "thinking": "# Turn 9\n```"},
                {"type": "text", "text": "<!-- never closed\n\n## Turn 7\nSetext\n---"},
            ],
        },
    ]
    events = [ended("t1", "cancelled", reason="user_cancelled"), ended("t2", "completed")]
    md = to_markdown({"session": SESSION, "messages": messages, "events": events})
    assert outline(md) == [
        f"h1 {SESSION['id']}",
        "**System:**",
        "h2 Turn 1: ## Turn 5: injected",
        "**You:**",
        "**Assistant** (local:scripted, interrupted):",
        "h3 Summary",
        "_Turn cancelled (user_cancelled)",
        "h2 Turn 2: \\<!-- hidden",  # escaped: the heading renders `<`, opens no comment
        "**You:**",
        "**Assistant** (interrupted: error):",
        "_Turn completed",
    ]
    fences = [t for t in MarkdownIt("commonmark").parse(md) if t.type == "fence" and t.level == 0]
    assert [(f.info, f.content) for f in fences] == [
        ("python", "print(1)\n"),  # the cut-off block, closed after its last line
        ("markdown", "<!-- never closed\n\n## Turn 7\nSetext\n---\n"),  # verbatim
    ]
    assert "> ## Turn 5: injected\n> ```\n> unclosed fence\n" in md  # the prompt, quoted


def test_a_replys_headings_go_below_the_turns_and_its_markdown_stays_markdown() -> None:
    reply = "# Plan\n\nSteps\n=====\n\n- one\n- `two`\n\n###### Deep"
    messages = [
        user("t1", {"type": "text", "text": "plan it"}),
        {"role": "assistant", "turn_id": "t1", "content": [{"type": "text", "text": reply}]},
    ]
    md = to_markdown({"session": SESSION, "messages": messages, "events": []})
    assert "### Plan\n\n### Steps\n\n- one\n- `two`\n\n###### Deep\n" in md


def test_raw_html_in_a_message_is_shown_as_written_and_opens_nothing_in_a_viewer() -> None:
    """A viewer that renders HTML would keep an unclosed `<details>` (collapsing every later
    turn) or `<b>` open over the rest of the file: such a message is shown verbatim, fenced."""
    messages = [
        user("t1", {"type": "text", "text": "make it <b>bold"}),
        {
            "role": "assistant",
            "turn_id": "t1",
            "content": [
                {"type": "text", "text": "Here is the log:\n<details>\n<summary>Log</summary>\n"}
            ],
        },
        user("t2", {"type": "text", "text": "second turn"}),
        {"role": "assistant", "turn_id": "t2", "content": [{"type": "text", "text": "Use `<b>`."}]},
    ]
    events = [ended("t1", "completed"), ended("t2", "completed")]
    md = to_markdown({"session": SESSION, "messages": messages, "events": events})
    html = MarkdownIt("commonmark").render(md)
    assert "<details>" not in html and "<b>" not in html
    assert "&lt;details&gt;" in html and "&lt;b&gt;bold" in html
    assert outline(md)[-3:] == ["**You:**", "**Assistant**:", "_Turn completed"]
    assert "Use `<b>`." in md  # code, not HTML: rendered as Markdown as before
