"""Dispatcher concurrency and ordering through the real daemon.

A real daemon on loopback with a real SQLite file and a temp workspace; the model is the fake
provider server reached through the real Anthropic/OpenAI SDKs, scripted to reply with several
tool calls at once. Timing evidence comes from the tools themselves: each shell call prints
`date +%s.%N` before and after its sleep, so its execution interval is known on the same wall
clock the bus stamps events with. Assertions compare those instants causally (an interval
inside a held slot, an event before or after an execution) rather than against fixed durations.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Callable
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply, FakeToolCall
from tests.api import Api
from tests.e2e.test_provider_turns import AUTO_TOOLS, models_yaml, session_on, types_of

TERMINAL_TOOL = ("tool.input_invalid", "tool.completed", "tool.failed")
DECLARED_CLASS = {
    "read_file": "read",
    "write_file": "write",
    "patch_file": "write",
    "list_dir": "read",
    "grep_files": "read",
    "shell": "execute",
}


@pytest.fixture
def make_env(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> Callable[..., Any]:
    """Start a daemon with every class on `auto` plus extra `tools:` keys; return its Api."""

    async def make(**tools: int) -> Api:
        extra = "".join(f"  {key}: {value}\n" for key, value in tools.items())
        d = await start_daemon(config=AUTO_TOOLS + extra, models=models_yaml(fake))
        return api_of(d)

    return make


# -- helpers -------------------------------------------------------------------------------------


def batch(*calls: tuple[str, dict[str, Any]], **kw: Any) -> FakeReply:
    """One model reply holding several tool calls, in this order."""
    return FakeReply(tool_calls=[FakeToolCall(name=n, input=i) for n, i in calls], **kw)


def timed_sleep(seconds: float) -> tuple[str, dict[str, Any]]:
    return ("shell", {"command": f"date +%s.%N; sleep {seconds}; date +%s.%N"})


def ts(event: dict[str, Any]) -> float:
    """An event's wall-clock timestamp as unix seconds (µs precision)."""
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def by_seq(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(events, key=lambda e: e["seq"])


def of_type(events: list[dict[str, Any]], *types: str) -> list[dict[str, Any]]:
    return [e for e in by_seq(events) if e["type"] in types]


def one_per_tool_use(events: list[dict[str, Any]], event_type: str) -> dict[str, dict[str, Any]]:
    found = of_type(events, event_type)
    ids = [e["payload"]["tool_use_id"] for e in found]
    assert len(ids) == len(set(ids)), f"{event_type} twice for one tool use: {ids}"
    return {e["payload"]["tool_use_id"]: e for e in found}


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals open at one instant (an end before a start on ties)."""
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in points:
        running += step
        peak = max(peak, running)
    return peak


def shell_interval(text: str) -> tuple[float, float]:
    """(start, end) printed by a `timed_sleep` command; the result starts with `exit_code: 0`."""
    lines = text.splitlines()
    assert lines[0] == "exit_code: 0", text
    return float(lines[1]), float(lines[2])


async def all_messages(api: Api, sid: str) -> list[dict[str, Any]]:
    body = await api.messages(sid, limit=200)
    assert body["has_more_before"] is False
    return body["messages"]


async def tool_uses_and_results(
    api: Api, sid: str
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every tool_use block of the session (in order) and the stored result of each.

    Asserts the one-result-per-use rule through REST: each tool use ends with exactly one stored `tool` message,
    and every `tool` message answers a tool use of the session.
    """
    messages = await all_messages(api, sid)
    uses = [
        b
        for m in messages
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    results: dict[str, list[dict[str, Any]]] = {}
    for m in messages:
        if m["role"] == "tool":
            assert len(m["content"]) == 1 and m["content"][0]["type"] == "tool_result"
            block = m["content"][0]
            assert m["metadata"]["tool_use_id"] == block["tool_use_id"]
            results.setdefault(block["tool_use_id"], []).append(block)
    use_ids = [u["id"] for u in uses]
    assert len(use_ids) == len(set(use_ids))
    assert set(results) == set(use_ids), "a tool use without a result, or a stray result"
    assert all(len(r) == 1 for r in results.values()), {k: len(v) for k, v in results.items()}
    return uses, {k: v[0] for k, v in results.items()}


def stored_result_order(messages: list[dict[str, Any]]) -> list[str]:
    return [m["metadata"]["tool_use_id"] for m in messages if m["role"] == "tool"]


def results_sent_to_model(fake: FakeProviderServer, api_name: str, index: int) -> list[str]:
    """Canonical tool_use ids of the results in request `index`, in the order they were sent."""
    body = fake.requests_for(api_name)[index].body
    if api_name == "anthropic":
        last = body["messages"][-1]
        assert last["role"] == "user"
        return [b["tool_use_id"] for b in last["content"] if b["type"] == "tool_result"]
    ids: list[str] = []
    for message in reversed(body["messages"]):
        if message["role"] != "tool":
            break
        ids.insert(0, "tu_" + message["tool_call_id"].removeprefix("call_"))
    return ids


# -- six sleeping tools, a limit of 4 -------------------------------------------------------------


@pytest.mark.parametrize("api_name", ["anthropic", "openai"])
async def test_six_sleeping_tools_respect_the_session_limit_and_publish_in_tool_use_order(
    make_env: Callable[..., Any], fake: FakeProviderServer, workspace: Path, api_name: str
) -> None:
    api = await make_env(max_concurrent_per_session=4)
    sid = await session_on(api, workspace, api_name)
    # Tool 1 frees the first slot (→ tool 4), tool 4 the next (→ tool 5); tool 0 ends last, so
    # the finish order differs from tool_use order while publication must not.
    sleeps = [0.6, 0.2, 0.4, 0.4, 0.1, 0.1]
    fake.enqueue(api_name, batch(*(timed_sleep(s) for s in sleeps)), FakeReply.say("slept"))
    accepted, terminal = await api.run_turn(sid, "sleep six times")
    assert terminal["type"] == "turn.completed", terminal
    assert terminal["payload"]["tool_call_count"] == 6

    events = await api.turn_events(sid, accepted["turn_id"])
    uses, results = await tool_uses_and_results(api, sid)
    order = [u["id"] for u in uses]
    assert len(order) == 6

    called = one_per_tool_use(events, "tool.called")
    completed = one_per_tool_use(events, "tool.completed")
    assert set(called) == set(completed) == set(order)
    assert not of_type(events, "tool.failed", "tool.input_invalid")
    assert [called[i]["payload"]["side_effects"] for i in order] == ["execute"] * 6

    spans = [shell_interval(results[i]["content"][0]["text"]) for i in order]
    starts = [s for s, _ in spans]
    ends = [e for _, e in spans]
    called_at = [ts(called[i]) for i in order]

    # never more than 4 executing at once, but really concurrent (6 serial sleeps would be 1)
    peak = max_overlap(spans)
    assert 2 <= peak <= 4, (peak, spans)

    # slots are taken FIFO in tool_use order: `tool.called` (emitted at the slot) in that order
    assert [e["payload"]["tool_use_id"] for e in of_type(events, "tool.called")] == order
    # (compared where the slot is taken: a shell's own start also holds its spawn, which a loaded
    # machine can delay past the next hand-off)
    assert called_at[4] < called_at[5], (
        "the first freed slot must go to the earlier queued tool use"
    )

    # `tool.called` only once the slot is held: it precedes the tool's own execution, and at that
    # instant fewer than 4 earlier calls are provably still holding a slot (still sleeping).
    for i in range(6):
        assert called_at[i] <= starts[i], (i, called_at[i], starts[i])
        holding = [j for j in range(6) if j != i and called_at[j] <= called_at[i] < ends[j]]
        assert len(holding) <= 3, (i, holding)
    # the queued two waited for a slot: each was announced after some earlier call had finished
    assert called_at[4] >= min(ends[:4])
    assert called_at[5] >= sorted(ends[:5])[1]
    # so `duration_ms` excludes the queueing: shorter than the time since the batch began
    for i in (4, 5):
        assert completed[order[i]]["payload"]["duration_ms"] < (ends[i] - called_at[0]) * 1000

    # execution finished out of order...
    finish_order = [order[i] for i in sorted(range(6), key=lambda k: ends[k])]
    assert finish_order != order
    # ...yet terminal events, stored results and what the model received are in tool_use order
    terminals = of_type(events, *TERMINAL_TOOL)
    assert [e["payload"]["tool_use_id"] for e in terminals] == order
    assert stored_result_order(await all_messages(api, sid)) == order
    assert [e["payload"]["result_message_id"] for e in terminals] == sorted(
        e["payload"]["result_message_id"] for e in terminals
    )
    assert results_sent_to_model(fake, api_name, 1) == order


# -- writes to one resolved path serialize ------------------------------------------------------


async def test_writes_to_one_path_run_one_after_another_in_tool_use_order(
    make_env: Callable[..., Any], fake: FakeProviderServer, workspace: Path
) -> None:
    api = await make_env(max_concurrent_per_session=4)
    sid = await session_on(api, workspace, "anthropic")
    big = "x" * (1 << 20) + "\nMARK-1\n"  # a write that takes measurable time
    # Three spellings of one resolved path; each patch only applies to the previous write's
    # output, so it succeeds only if it ran after that write had finished.
    fake.enqueue(
        "anthropic",
        batch(
            ("write_file", {"path": "out.txt", "content": big}),
            ("patch_file", {"path": "./out.txt", "old_text": "MARK-1", "new_text": "MARK-2"}),
            (
                "patch_file",
                {"path": str(workspace / "out.txt"), "old_text": "MARK-2", "new_text": "MARK-3"},
            ),
            chunk_chars=1 << 22,
        ),
        FakeReply.say("written"),
    )
    accepted, terminal = await api.run_turn(sid, "write then patch twice")
    assert terminal["type"] == "turn.completed", terminal

    events = await api.turn_events(sid, accepted["turn_id"])
    uses, results = await tool_uses_and_results(api, sid)
    order = [u["id"] for u in uses]
    texts = [results[i]["content"][0]["text"] for i in order]
    assert [results[i]["is_error"] for i in order] == [False] * 3, texts
    assert texts[0] == f"Wrote {len(big)} bytes to out.txt (created)."
    assert texts[1].startswith("Patched out.txt") and texts[2].startswith("Patched out.txt")
    assert (workspace / "out.txt").read_text() == "x" * (1 << 20) + "\nMARK-3\n"

    called = one_per_tool_use(events, "tool.called")
    completed = one_per_tool_use(events, "tool.completed")
    assert [e["payload"]["tool_use_id"] for e in of_type(events, "tool.called")] == order
    # no overlap: each write is announced (path lock taken) only after the previous one's
    # execution, which began at its own `tool.called` and lasted its `duration_ms`, was over
    for earlier, later in pairwise(order):
        ran_until = ts(called[earlier]) + completed[earlier]["payload"]["duration_ms"] / 1000
        assert ts(called[later]) >= ran_until, (earlier, later)
    terminals = of_type(events, *TERMINAL_TOOL)
    assert [e["payload"]["tool_use_id"] for e in terminals] == order
    assert results_sent_to_model(fake, "anthropic", 1) == order


# -- the daemon-wide limit ----------------------------------------------------------------------


async def test_global_limit_bounds_tools_across_sessions(
    make_env: Callable[..., Any], fake: FakeProviderServer, workspace: Path
) -> None:
    api = await make_env(max_concurrent_per_session=4, max_concurrent_global=2)
    sids = [await session_on(api, workspace, name) for name in ("anthropic", "openai")]
    for name in ("anthropic", "openai"):
        fake.enqueue(name, batch(*(timed_sleep(0.3) for _ in range(3))), FakeReply.say("ok"))
    turns = []
    for sid in sids:
        status, accepted = await api.submit(sid, "sleep three times")
        assert status == 202, accepted
        turns.append(accepted["turn_id"])
    for sid, turn_id in zip(sids, turns, strict=True):
        terminal = await api.wait_turn(sid, turn_id)
        assert terminal["type"] == "turn.completed", terminal

    spans: list[tuple[float, float]] = []
    called_at: list[float] = []
    for sid, turn_id in zip(sids, turns, strict=True):
        events = await api.turn_events(sid, turn_id)
        uses, results = await tool_uses_and_results(api, sid)
        called = one_per_tool_use(events, "tool.called")
        assert len(one_per_tool_use(events, "tool.completed")) == 3
        for use in uses:
            spans.append(shell_interval(results[use["id"]]["content"][0]["text"]))
            called_at.append(ts(called[use["id"]]))
    # each session alone may run 3, both together 6; the daemon-wide limit is 2
    assert max_overlap(spans) == 2, spans
    for i in range(len(spans)):
        assert called_at[i] <= spans[i][0]
        holding = [
            j for j in range(len(spans)) if j != i and called_at[j] <= called_at[i] < spans[j][1]
        ]
        assert len(holding) <= 1, (i, holding)


# -- `tool.called.side_effects`, one stored result per tool use ----------------------------------


async def test_side_effects_are_the_declared_class_and_every_tool_use_has_one_result(
    make_env: Callable[..., Any], fake: FakeProviderServer, workspace: Path, metis_home: Path
) -> None:
    api = await make_env()
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        batch(
            ("read_file", {"path": "README.md"}),
            ("write_file", {"path": "new.txt", "content": "one\n"}),
            ("patch_file", {"path": "new.txt", "old_text": "one", "new_text": "two"}),
            ("list_dir", {}),
            ("grep_files", {"pattern": "demo"}),
            ("shell", {"command": "echo hi"}),
            ("read_file", {"path": "README.md", "offset": "1"}),  # → tool.input_invalid
            ("no_such_tool", {}),  # → tool.failed{not_found}
        ),
        FakeReply.call("shell", {"command": "cat new.txt"}),
        FakeReply.say("done"),
    )
    accepted, terminal = await api.run_turn(sid, "use every tool")
    assert terminal["type"] == "turn.completed", terminal

    events = await api.turn_events(sid, accepted["turn_id"])
    uses, results = await tool_uses_and_results(api, sid)
    assert len(uses) == 9
    called = one_per_tool_use(events, "tool.called")
    ran = [u for u in uses if u["name"] in DECLARED_CLASS and u["input"].get("offset") != "1"]
    assert set(called) == {u["id"] for u in ran}
    for use in ran:
        payload = called[use["id"]]["payload"]
        assert payload["tool_name"] == use["name"]
        assert payload["side_effects"] == DECLARED_CLASS[use["name"]], use["name"]
        assert payload["origin"] == "builtin"
        # the effective timeout: 60 s for read/write, the shell's input default 120 s
        assert payload["timeout_seconds"] == (120 if use["name"] == "shell" else 60), payload
        if use["name"] in ("read_file", "write_file", "patch_file"):  # schemas without defaults
            encoded = json.dumps(
                use["input"], sort_keys=True, separators=(",", ":"), ensure_ascii=False
            ).encode()
            assert payload["input_sha256"] == hashlib.sha256(encoded).hexdigest()
            assert payload["input_bytes"] == len(encoded)

    # exactly one terminal event per tool use, matching the stored result
    terminals = of_type(events, *TERMINAL_TOOL)
    assert sorted(e["payload"]["tool_use_id"] for e in terminals) == sorted(u["id"] for u in uses)
    kinds = {e["payload"]["tool_use_id"]: e for e in terminals}
    invalid, unknown = uses[6]["id"], uses[7]["id"]
    assert kinds[invalid]["type"] == "tool.input_invalid" and results[invalid]["is_error"]
    assert kinds[unknown]["type"] == "tool.failed" and results[unknown]["is_error"]
    assert kinds[unknown]["payload"]["error_class"] == "not_found"
    # actors and causal parents: called ← the batch's llm.call_completed,
    # completed ← called; a tool use stopped before `tool.called` hangs off the LLM call
    for event in of_type(events, "tool.called", *TERMINAL_TOOL):
        llm_done = [e for e in of_type(events, "llm.call_completed") if e["seq"] < event["seq"]][-1]
        tool_use_id = event["payload"]["tool_use_id"]
        expected_parent = (
            called[tool_use_id]["id"]
            if event["type"] != "tool.called" and tool_use_id in called
            else llm_done["id"]
        )
        assert event["parent_event_id"] == expected_parent, event
        assert event["actor"] == {
            "tool.called": "agent",
            "tool.input_invalid": "system",
        }.get(event["type"], "tool")
    messages = await all_messages(api, sid)
    for event in terminals:
        stored = next(m for m in messages if m["id"] == event["payload"]["result_message_id"])
        assert stored["metadata"]["tool_use_id"] == event["payload"]["tool_use_id"]
    assert results[uses[8]["id"]]["content"][0]["text"] == "exit_code: 0\ntwo\n"

    # the real SQLite file agrees: one tool_calls row per tool use, its result linked, its
    # class recorded and its status projected to the terminal one
    result_ids = {e["payload"]["tool_use_id"]: e["payload"]["result_message_id"] for e in terminals}
    with contextlib.closing(
        sqlite3.connect(f"file:{metis_home / 'metis.db'}?mode=ro", uri=True)
    ) as db:
        rows = db.execute(
            "SELECT id, name, side_effects, status, result_message_id FROM tool_calls "
            "WHERE session_id=? ORDER BY id",
            (sid,),
        ).fetchall()
    assert [r[0] for r in rows] == sorted(u["id"] for u in uses)
    status_of = {"tool.completed": "completed", "tool.failed": "failed"}
    for tool_use_id, name, side_effects, status, result_message_id in rows:
        assert result_message_id == result_ids[tool_use_id], name
        assert side_effects == DECLARED_CLASS.get(name), name
        assert status == status_of.get(kinds[tool_use_id]["type"], "invalid"), (name, status)
    assert types_of(events).count("llm.call_started") == 3


async def test_hostile_tool_inputs_fail_their_calls_never_the_turn(
    make_env: Callable[..., Any], fake: FakeProviderServer, workspace: Path
) -> None:
    """Arguments `json` would accept but nothing downstream can hold — lone surrogate escapes,
    not storable as UTF-8 — are unparseable input: the call ends `tool.input_invalid`, the
    turn goes on (deep nesting: tests/core/providers, the fake server cannot send it)."""
    api = await make_env()
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        batch(
            ("read_file", {"path": "\ud800"}),
            ("shell", {"command": "echo \udfff"}),
            ("list_dir", {}),
        ),
        FakeReply.say("done"),
    )
    accepted, terminal = await api.run_turn(sid, "go")
    assert terminal["type"] == "turn.completed", terminal
    events = await api.turn_events(sid, accepted["turn_id"])
    uses, results = await tool_uses_and_results(api, sid)
    assert len(uses) == 3 and len(results) == 3
    invalid = one_per_tool_use(events, "tool.input_invalid")
    assert set(invalid) == {u["id"] for u in uses[:2]}
    assert [u["id"] for u in uses[2:]] == list(one_per_tool_use(events, "tool.called"))
