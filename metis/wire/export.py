"""A session as a file: Markdown to read (a heading per turn, tool calls as fenced blocks,
costs) or JSON to process (the canonical messages and the persisted events, as the REST API
returns them). `data` is `{"session", "messages", "events"}` in the REST API's shapes: the
session as `GET /sessions/{id}` shows it (without its attach token), every message, every
persisted event."""

from __future__ import annotations

import json
from typing import Any

from metis.wire import tooldisplay
from metis.wire.counts import counted
from metis.wire.messages import text_of, tool_result_text

TURN_END = ("turn.completed", "turn.cancelled", "turn.failed")
FORMATS = {"md": "text/markdown", "json": "application/json"}
"""Export formats and their media types."""


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
            f"{p.get('input_tokens', 0)} in / {p.get('output_tokens', 0)} out tokens · "
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
        if role == "user":
            out.append("**You:**\n")
            out.append(_user_content(m) + "\n")
        elif role == "assistant":
            model = (m.get("metadata") or {}).get("model")
            out.append(f"**Assistant**{f' ({model})' if model else ''}:\n")
            for block in m.get("content") or []:
                kind = block.get("type")
                if kind == "text" and block.get("text", "").strip():
                    out.append(block["text"].strip() + "\n")
                elif kind == "thinking" and block.get("thinking", "").strip():
                    quoted = "\n".join("> " + line for line in block["thinking"].splitlines())
                    out.append(f"> _thinking_\n{quoted}\n")
                elif kind == "tool_use":
                    out.append(_tool_block(block, results.get(block["id"]), durations))
    close_turn(current_turn)
    return "\n".join(out)


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
    that does, marked with an ellipsis."""
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip() + "…"
