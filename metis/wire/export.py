"""A session as a file: Markdown to read (a heading per turn, tool calls as fenced blocks,
costs) or JSON to process (the canonical messages and the persisted events, as the REST API
returns them). `data` is `{"session", "messages", "events"}` in the REST API's shapes: the
session as `GET /sessions/{id}` shows it (without its attach token), every message, every
persisted event.

The Markdown's own structure (the title, a level-2 heading per turn, the bold labels, the
turn footers) must survive whatever the messages hold, since a person reads the file rendered.
So no message text reaches the top level unconfined: what a person or a client wrote (user
prompts, system messages, thinking) is quoted, and a heading or an unclosed code fence in it
stays inside its quote; the assistant's Markdown renders as such, with its headings demoted
below the turn's and a code fence it left open (a reply cut off mid-block) closed after it.
"""

from __future__ import annotations

import functools
import json
import re
from typing import TYPE_CHECKING, Any

from metis.wire import tooldisplay
from metis.wire.counts import counted, tokens_in
from metis.wire.messages import text_of, tool_result_text

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

TURN_END = ("turn.completed", "turn.cancelled", "turn.failed")
FORMATS = {"md": "text/markdown", "json": "application/json"}
"""Export formats and their media types."""

_PROBE = "metis-export-probe"
"""A paragraph put after a reply's text to see whether the text leaves a block open."""
_OWN_HEADING_LEVELS = 2
"""The export's headings: level 1 (the title) and 2 (a turn); a reply's go below them."""


@functools.cache
def _blocks() -> MarkdownIt:
    """A parser of a reply's block structure only (its inline Markdown is not needed: ~40%
    faster), made at the first export: the daemon does not import markdown-it at start-up."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").disable(["inline", "text_join"])


@functools.cache
def _full() -> MarkdownIt:
    """A whole CommonMark parser, inline rules included (to find inline HTML)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark")


def render(data: dict[str, Any], fmt: str) -> str:
    """The document in `fmt` (a key of FORMATS)."""
    return to_json(data) if fmt == "json" else to_markdown(data)


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


def _fence(text: str, info: str = "") -> str:
    """A fenced block whose fence is longer than any backtick run inside."""
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text.rstrip(chr(10))}\n{fence}\n"


def to_markdown(data: dict[str, Any]) -> str:
    session = data["session"]
    messages = data["messages"]
    events = data["events"]
    ends = {e["turn_id"]: e for e in events if e["type"] in TURN_END}
    durations = {
        e["payload"]["tool_use_id"]: e["payload"].get("duration_ms")
        for e in events
        if e["type"] in ("tool.completed", "tool.failed")
    }
    results: dict[str, dict[str, Any]] = {}
    for m in messages:
        for block in m.get("content") or []:
            if block.get("type") == "tool_result":
                results[block["tool_use_id"]] = block
    title = session.get("title") or session["id"]
    out = [
        f"# {title}\n",
        f"- session: `{session['id']}`",
        f"- workspace: `{session['workspace_path']}`",
        f"- model: {session.get('active_model') or 'routing decides'}",
        f"- created: {session.get('created_at')}"
        + (f", ended: {session['ended_at']}" if session.get("ended_at") else ""),
        f"- turns: {session.get('turn_count')}, cost: ${session.get('cost_so_far_usd')}\n",
    ]
    turn_no = 0
    current_turn: str | None = None

    def close_turn(turn_id: str | None) -> None:
        end = ends.get(turn_id or "")
        if end is None:
            return
        p = end["payload"]
        outcome = end["type"].removeprefix("turn.")
        why = ": ".join(str(part) for part in (p.get("reason"), p.get("message")) if part)
        extra = f" ({why})" if outcome != "completed" and why else ""
        out.append(
            f"_Turn {outcome}{extra} · {counted(p.get('llm_call_count') or 0, 'model call')} · "
            f"{tokens_in(p)} in / {p.get('output_tokens', 0)} out tokens · "
            f"${p.get('total_cost_usd', '0')} · {(p.get('wall_time_ms') or 0) / 1000:.1f} s_\n"
        )

    for m in messages:
        role = m["role"]
        if role == "user" and m.get("turn_id") != current_turn:
            close_turn(current_turn)
            current_turn = m.get("turn_id")
            turn_no += 1
            first = text_of(m).strip().splitlines()[0] if text_of(m).strip() else ""
            out.append(f"## Turn {turn_no}" + (f": {_heading(first)}" if first else "") + "\n")
        if role in ("user", "system"):
            out.append("**You:**\n" if role == "user" else "**System:**\n")
            out.append(_quote(_user_content(m)) + "\n")
        elif role == "assistant":
            out.append(_assistant_label(m.get("metadata") or {}))
            for block in m.get("content") or []:
                kind = block.get("type")
                if kind == "text" and block.get("text", "").strip():
                    out.append(_confined(block["text"].strip()) + "\n")
                elif kind == "thinking" and block.get("thinking", "").strip():
                    out.append(_quote("_thinking_\n" + block["thinking"]) + "\n")
                elif kind == "tool_use":
                    out.append(_tool_block(block, results.get(block["id"]), durations))
    close_turn(current_turn)
    return "\n".join(out)


def _assistant_label(metadata: dict[str, Any]) -> str:
    """The reply's label: its model, and whether it was cut off (a cancelled or failed turn
    keeps what had streamed; the turn's footer says why)."""
    said = [metadata["model"]] if metadata.get("model") else []
    status = metadata.get("status", "complete")
    if status != "complete":
        said.append("interrupted" if status == "cancelled" else f"interrupted: {status}")
    return "**Assistant**" + (f" ({', '.join(said)})" if said else "") + ":\n"


def _quote(text: str) -> str:
    """`text` as a block quote: whatever Markdown it holds (headings, an unclosed fence) ends
    with the quote and cannot pass for the export's own structure. Raw HTML would not end with
    it (a viewer that renders HTML keeps an unclosed `<details>` or `<b>` open over the rest of
    the file): text holding any is quoted verbatim, fenced."""
    if _has_raw_html(text):
        text = _fence(text, "markdown").rstrip("\n")
    return "\n".join(f"> {line}".rstrip() for line in text.splitlines())


def _has_raw_html(text: str) -> bool:
    """Whether `text`, read as Markdown, holds raw HTML (a block or an inline tag)."""
    if "<" not in text:
        return False
    for token in _full().parse(text):
        if token.type == "html_block" or any(
            child.type == "html_inline" for child in token.children or ()
        ):
            return True
    return False


def _confined(text: str) -> str:
    """The assistant's Markdown, rendered as Markdown but kept within its reply: its headings
    demoted below the export's, a code fence it leaves open closed. Text that would still take
    in what follows (an unterminated HTML block such as `<!--`, any raw HTML: a viewer that
    renders it keeps an unclosed tag open over the rest of the file) is shown verbatim, fenced."""
    if _has_raw_html(text):
        return _fence(text, "markdown").rstrip("\n")
    lines = re.sub(r"\r\n?", "\n", text).split("\n")
    tokens = _blocks().parse("\n".join([*lines, "", _PROBE]))
    for at in reversed(range(len(tokens))):
        if tokens[at].type == "heading_open" and tokens[at].level == 0:
            _demote(lines, tokens[at], tokens[at + 1].content)
    left_open = _left_open(tokens)
    if left_open is None:
        return "\n".join(lines)
    if left_open.type == "fence":
        return "\n".join([*lines, left_open.markup])  # the same run closes it
    return _fence(text, "markdown").rstrip("\n")


def _demote(lines: list[str], heading: Token, content: str) -> None:
    """Rewrite a top-level heading of a reply (ATX or setext) as an ATX heading two levels
    lower (at most level 6), in place: a reply's "# Summary" reads under its turn's heading."""
    assert heading.map is not None
    level = min(6, int(heading.tag[1:]) + _OWN_HEADING_LEVELS)
    start, end = heading.map
    lines[start:end] = [f"{'#' * level} {' '.join(content.splitlines())}".rstrip()]


def _left_open(tokens: list[Token]) -> Token | None:
    """The top-level block that took in the probe paragraph (None if the probe stands alone)."""
    probe = tokens[-3:]
    if [t.type for t in probe] == ["paragraph_open", "inline", "paragraph_close"] and (
        probe[0].level == 0 and probe[1].content == _PROBE
    ):
        return None
    return next(t for t in reversed(tokens) if t.level == 0)


def _user_content(message: dict[str, Any]) -> str:
    """What was sent: its text, and a line for each image (the bytes stay in the JSON export)."""
    parts: list[str] = []
    for block in message.get("content") or []:
        kind = block.get("type")
        if kind == "text" and block.get("text", "").strip():
            parts.append(block["text"].strip())
        elif kind == "image":
            source = block.get("source") or {}
            if source.get("type") == "url":
                parts.append(f"_[image: {source.get('url')}]_")
            else:
                size = len(source.get("data") or "") * 3 // 4
                parts.append(f"_[image: {source.get('media_type')}, {size / 1024:.1f} KiB]_")
    return "\n\n".join(parts)


def _tool_block(
    block: dict[str, Any], result: dict[str, Any] | None, durations: dict[str, Any]
) -> str:
    name = block.get("name", "")
    tool_input = block.get("input") or {}
    said = tooldisplay.summary(name, tool_input)
    parts = [f"Tool call `{name}`{f' {said}' if said else ''}\n"]
    diff = tooldisplay.file_diff(name, tool_input, None) if name == "patch_file" else None
    if diff is not None:
        parts.append(_fence(diff, "diff"))
    else:
        parts.append(_fence(json.dumps(tool_input, ensure_ascii=False, indent=2), "json"))
    if result is not None:
        status = "error" if result.get("is_error") else "ok"
        took = durations.get(block["id"])
        parts.append(f"Result ({status}{f', {took} ms' if took is not None else ''}):\n")
        parts.append(_fence(tool_result_text(result) or "(no output)", "text"))
    return "\n".join(parts)


def _heading(line: str, limit: int = 80) -> str:
    """A prompt's first line as a turn's heading: whole when it fits, else cut at the last word
    that does, marked with an ellipsis; a `<` in it escaped, so that no tag it holds opens in
    a viewer that renders HTML."""
    if len(line) > limit:
        cut = line[: limit - 1]
        line = (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip() + "…"
    return line.replace("<", "\\<")
