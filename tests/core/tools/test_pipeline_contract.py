"""The dispatch pipeline's gates through the real daemon.

A real daemon on loopback with a real SQLite file and a temp workspace; the model is the fake
provider server reached through the real Anthropic SDK. Each test scripts the model's tool calls
and checks what the pipeline did at the step that must end them: the events (payloads, actors,
causal parents), the stored `tool` messages, the text the model received in its next request,
the `confirmations` rows, and the filesystem outside the workspace.

Where a gate must come before the confirmation step (schema, sandbox), every builtin is set to
`prompt` with a 1 s expiry: a call that wrongly reached step 4 shows up as a confirmation event
(and a `confirmation_timeout`) instead of hanging the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api, api_session
from tests.core.tools.test_dispatch_concurrency import (
    batch,
    one_per_tool_use,
    tool_uses_and_results,
)
from tests.e2e.test_provider_turns import models_yaml, session_on, types_of

TERMINAL_TOOL = ("tool.input_invalid", "tool.completed", "tool.failed")
FAILED_FIELDS = {
    "tool_use_id",
    "tool_name",
    "error_class",
    "message",
    "duration_ms",
    "result_message_id",
}
CONFIRMATION_EVENTS = ("tool.confirmation_requested", "tool.confirmation_resolved")
ALL_AUTO = "{none: auto, read: auto, write: auto, execute: auto, network: auto}"
# every builtin asks, and an unanswered request expires after 1 s (see the module docstring)
ALL_PROMPT = (
    "tools:\n"
    "  confirmation:\n"
    "    default: {none: prompt, read: prompt, write: prompt, execute: prompt, network: prompt}\n"
    "    timeout_seconds: 1\n"
)


def confirmation_config(per_tool: str) -> str:
    """Every class `auto` except the `per_tool` modes given (a YAML flow mapping)."""
    return f"tools:\n  confirmation:\n    default: {ALL_AUTO}\n    per_tool: {per_tool}\n"


@pytest.fixture
async def start_api(
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
) -> AsyncIterator[Callable[..., Any]]:
    """Start a daemon (config.yaml = `config`, models on the fake server); return it and an Api.

    Called with no `config`, it restarts on the same METIS_HOME with the files already there.
    """
    opened: list[aiohttp.ClientSession] = []

    async def start(config: str | None = None) -> tuple[Daemon, Api]:
        if config is None:
            d = await start_daemon()
        else:
            d = await start_daemon(config=config, models=models_yaml(fake))
        http = api_session(d)
        opened.append(http)
        return d, Api(http)

    yield start
    for http in opened:
        await http.close()


# -- helpers -------------------------------------------------------------------------------------


def by_seq(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(events, key=lambda e: e["seq"])


def of_type(events: list[dict[str, Any]], *types: str) -> list[dict[str, Any]]:
    return [e for e in by_seq(events) if e["type"] in types]


def for_tool_use(events: list[dict[str, Any]], tool_use_id: str) -> list[dict[str, Any]]:
    return [e for e in by_seq(events) if e["payload"].get("tool_use_id") == tool_use_id]


def text_of(result: dict[str, Any]) -> str:
    assert [b["type"] for b in result["content"]] == ["text"], result
    return str(result["content"][0]["text"])


def sent_results(server: FakeProviderServer, index: int) -> dict[str, tuple[bool, str]]:
    """The tool results carried by Anthropic request `index`: id → (is_error, text)."""
    last = server.requests_for("anthropic")[index].body["messages"][-1]
    assert last["role"] == "user"
    out: dict[str, tuple[bool, str]] = {}
    for block in last["content"]:
        if block["type"] != "tool_result":
            continue
        content = block["content"]
        text = content if isinstance(content, str) else "".join(c["text"] for c in content)
        out[block["tool_use_id"]] = (bool(block.get("is_error", False)), text)
    return out


def offered_tools(server: FakeProviderServer, index: int) -> list[str]:
    return [t["name"] for t in server.requests_for("anthropic")[index].body.get("tools", [])]


def db_rows(metis_home: Path, table: str, session_id: str) -> list[dict[str, Any]]:
    """Rows of `confirmations` or `tool_calls` for one session, read from the real SQLite file."""
    with contextlib.closing(
        sqlite3.connect(f"file:{metis_home / 'metis.db'}?mode=ro", uri=True)
    ) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            f"SELECT * FROM {table} WHERE session_id=? ORDER BY id",
            (session_id,),
        ).fetchall()
    return [dict(r) for r in rows]


def confirmation_rows(metis_home: Path, session_id: str) -> list[dict[str, Any]]:
    return db_rows(metis_home, "confirmations", session_id)


def tool_call_rows(metis_home: Path, session_id: str) -> list[dict[str, Any]]:
    return db_rows(metis_home, "tool_calls", session_id)


async def wait_requests(api: Api, sid: str, turn_id: str, n: int) -> list[dict[str, Any]]:
    """Wait until the turn has `n` confirmation requests; return their events in seq order."""
    return await api.wait_for_events(
        sid, lambda e: e["turn_id"] == turn_id and e["type"] == "tool.confirmation_requested", n
    )


async def answer(
    api: Api, sid: str, turn_id: str, request_id: str, decision: str, **fields: Any
) -> tuple[int, Any]:
    return await api.call(
        "POST",
        f"/sessions/{sid}/turns/{turn_id}/confirmations/{request_id}",
        {"decision": decision, **fields},
    )


def llm_completed_before(events: list[dict[str, Any]], event: dict[str, Any]) -> dict[str, Any]:
    return [e for e in of_type(events, "llm.call_completed") if e["seq"] < event["seq"]][-1]


# -- schema violations end at step 2 ---------------------------------------------------------------

INVALID_CALLS: list[tuple[str, dict[str, Any], set[str]]] = [
    ("read_file", {"path": "notes.txt", "offset": "10"}, {"$.offset"}),  # no coercion
    ("read_file", {"path": "notes.txt", "limit": 5001}, {"$.limit"}),  # out of range
    ("read_file", {}, {"$.path"}),  # missing required
    ("write_file", {"path": "made.txt", "content": 5}, {"$.content"}),  # wrong type
    ("write_file", {"path": "made.txt", "content": "x", "mode": "w"}, {"$.mode"}),  # extra
    ("patch_file", {"path": "notes.txt", "old_text": "", "new_text": "x"}, {"$.old_text"}),
    ("list_dir", {"path": 5}, {"$.path"}),
    ("grep_files", {"pattern": "a", "max_results": 0}, {"$.max_results"}),
    ("shell", {"command": "touch ran.txt", "timeout_seconds": 601}, {"$.timeout_seconds"}),
    ("shell", {"command": "touch ran.txt", "timeout_seconds": True}, {"$.timeout_seconds"}),
]


async def test_schema_violations_end_as_input_invalid_before_any_gate_or_side_effect(
    start_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
    metis_home: Path,
) -> None:
    (workspace / "notes.txt").write_text("alpha\n")
    _, api = await start_api(ALL_PROMPT)
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        batch(*((name, tool_input) for name, tool_input, _ in INVALID_CALLS)),
        FakeReply.say("understood"),
    )
    accepted, terminal = await api.run_turn(sid, "call every tool wrongly")
    assert terminal["type"] == "turn.completed", terminal
    assert terminal["payload"]["tool_call_count"] == 0

    events = await api.turn_events(sid, accepted["turn_id"])
    # terminal for the tool use: no confirmation asked, nothing called, no tool.failed
    assert not of_type(events, "tool.called", "tool.failed", *CONFIRMATION_EVENTS), types_of(events)
    uses, results = await tool_uses_and_results(api, sid)
    order = [u["id"] for u in uses]
    assert [u["name"] for u in uses] == [name for name, _, _ in INVALID_CALLS]
    invalid = one_per_tool_use(events, "tool.input_invalid")
    assert [e["payload"]["tool_use_id"] for e in of_type(events, *TERMINAL_TOOL)] == order

    messages = (await api.messages(sid, limit=200))["messages"]
    to_model = sent_results(fake, 1)
    assert list(to_model) == order, "every error result reaches the model, in tool_use order"
    for use, (name, _, paths) in zip(uses, INVALID_CALLS, strict=True):
        event = invalid[use["id"]]
        payload = event["payload"]
        # exactly these fields, actor system, parent = the batch's LLM call
        assert set(payload) == {"tool_use_id", "tool_name", "errors", "result_message_id"}
        assert payload["tool_name"] == name
        assert event["actor"] == "system"
        assert event["parent_event_id"] == llm_completed_before(events, event)["id"]
        assert {e["path"] for e in payload["errors"]} == paths, (name, payload["errors"])
        assert all(set(e) == {"path", "message"} and e["message"] for e in payload["errors"])
        # the model's text lists the event's errors, one `- {path}: {message}` line each
        expected = "\n".join(
            [f"Invalid input for {name}:"]
            + [f"- {e['path']}: {e['message']}" for e in payload["errors"]]
        )
        result = results[use["id"]]
        assert result["is_error"] is True
        assert text_of(result) == expected
        assert to_model[use["id"]] == (True, expected)
        stored = next(m for m in messages if m["id"] == payload["result_message_id"])
        assert stored["metadata"]["tool_use_id"] == use["id"]

    rows = tool_call_rows(metis_home, sid)
    assert [r["id"] for r in rows] == sorted(order)
    assert all((r["status"], r["started_at_us"]) == ("invalid", None) for r in rows), rows

    # nothing ran: no file made, none changed, no confirmation row
    assert (workspace / "notes.txt").read_text() == "alpha\n"
    assert sorted(p.name for p in workspace.iterdir()) == ["notes.txt"]
    assert confirmation_rows(metis_home, sid) == []


# -- unknown and not-enabled tools end at step 1 ---------------------------------------------------


async def test_unknown_and_not_enabled_tools_fail_not_found_listing_the_offered_tools(
    start_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
) -> None:
    config = ALL_PROMPT + "    per_tool: {list_dir: auto}\n  enabled: [read_file, list_dir]\n"
    _, api = await start_api(config)
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        batch(
            ("no_such_tool", {"anything": 1}),
            ("shell", {"command": "touch ran.txt"}),  # a builtin, but not enabled
            ("list_dir", {}),
        ),
        FakeReply.say("ok"),
    )
    accepted, terminal = await api.run_turn(sid, "call tools")
    assert terminal["type"] == "turn.completed", terminal
    assert sorted(offered_tools(fake, 0)) == ["list_dir", "read_file"]

    events = await api.turn_events(sid, accepted["turn_id"])
    uses, results = await tool_uses_and_results(api, sid)
    unknown, disabled, listed = (u["id"] for u in uses)
    failed = one_per_tool_use(events, "tool.failed")
    assert set(failed) == {unknown, disabled}
    assert list(one_per_tool_use(events, "tool.called")) == [listed]
    assert not of_type(events, "tool.input_invalid", *CONFIRMATION_EVENTS)
    for tool_use_id, name in ((unknown, "no_such_tool"), (disabled, "shell")):
        event = failed[tool_use_id]
        payload = event["payload"]
        assert set(payload) == FAILED_FIELDS
        assert payload["error_class"] == "not_found" and payload["tool_name"] == name
        text = text_of(results[tool_use_id])
        prefix = f'Unknown tool "{name}". Available tools: '
        assert text.startswith(prefix) and text.endswith("."), text
        assert sorted(text[len(prefix) : -1].split(", ")) == ["list_dir", "read_file"]
        assert payload["message"] == text and results[tool_use_id]["is_error"] is True
        assert sent_results(fake, 1)[tool_use_id] == (True, text)
        # no tool.called: the parent is the last gate event, the batch's LLM call
        assert event["parent_event_id"] == llm_completed_before(events, event)["id"]
        assert event["actor"] == "tool"
    assert not (workspace / "ran.txt").exists()


# -- sandbox escapes end at step 3 -----------------------------------------------------------------


async def test_path_escapes_fail_permission_denied_before_confirmation_and_touch_nothing(
    start_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
    outside: Path,
    metis_home: Path,
) -> None:
    (workspace / "sub").mkdir()
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / "link").symlink_to(outside)  # a directory symlink pointing outside
    sibling = workspace.parent / (workspace.name + "-other")  # shares the root's prefix
    before_outside = sorted(p.name for p in outside.iterdir())
    calls: list[tuple[str, dict[str, Any], str]] = [
        ("write_file", {"path": "../x.txt", "content": "x"}, "outside"),
        ("write_file", {"path": "sub/../../y.txt", "content": "x"}, "outside"),
        ("write_file", {"path": str(outside / "abs.txt"), "content": "x"}, "outside"),
        ("write_file", {"path": str(sibling / "z.txt"), "content": "x"}, "outside"),
        ("patch_file", {"path": "link/secret.txt", "old_text": "TOP", "new_text": "x"}, "outside"),
        ("read_file", {"path": str(outside / "secret.txt")}, "outside"),
        ("read_file", {"path": "../outside/secret.txt"}, "outside"),
        ("list_dir", {"path": "link"}, "outside"),
        ("grep_files", {"pattern": "SECRET", "path": ".."}, "outside"),
        ("write_file", {"path": ".git/hooks/pre-commit", "content": "x"}, "protected"),
        ("write_file", {"path": "sub/.git/config", "content": "x"}, "protected"),
    ]
    _, api = await start_api(ALL_PROMPT)
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue("anthropic", batch(*((n, i) for n, i, _ in calls)), FakeReply.say("refused"))
    accepted, terminal = await api.run_turn(sid, "escape the workspace")
    assert terminal["type"] == "turn.completed", terminal

    events = await api.turn_events(sid, accepted["turn_id"])
    assert not of_type(events, "tool.called", "tool.input_invalid", *CONFIRMATION_EVENTS), types_of(
        events
    )
    uses, results = await tool_uses_and_results(api, sid)
    failed = one_per_tool_use(events, "tool.failed")
    assert list(failed) == [u["id"] for u in uses]
    to_model = sent_results(fake, 1)
    for use, (_, tool_input, kind) in zip(uses, calls, strict=True):
        event = failed[use["id"]]
        assert event["payload"]["error_class"] == "permission_denied", (tool_input, event)
        assert event["payload"]["tool_name"] == use["name"]
        assert event["parent_event_id"] == llm_completed_before(events, event)["id"]
        text = text_of(results[use["id"]])
        path = tool_input["path"]
        assert text == (
            f'Path "{path}" is outside the workspace.'
            if kind == "outside"
            else f'Path "{path}" is inside a protected directory and cannot be modified.'
        )
        assert to_model[use["id"]] == (True, text)
        assert event["payload"]["message"] == text

    # nothing outside the root was created, changed or read; nothing protected was written
    assert sorted(p.name for p in outside.iterdir()) == before_outside
    assert (outside / "secret.txt").read_text() == "TOP-SECRET\n"
    assert not (workspace.parent / "x.txt").exists() and not (workspace.parent / "y.txt").exists()
    assert not sibling.exists()
    assert list((workspace / ".git" / "hooks").iterdir()) == []
    assert not (workspace / "sub" / ".git").exists()
    assert "TOP-SECRET" not in str(fake.requests_for("anthropic")[1].body)
    for row in tool_call_rows(metis_home, sid):  # never started (projected status)
        assert (row["status"], row["error_class"], row["started_at_us"]) == (
            "failed",
            "permission_denied",
            None,
        ), row
    assert "TOP-SECRET" not in str((await api.messages(sid, limit=200))["messages"])
    assert confirmation_rows(metis_home, sid) == []


# -- `wait`, allowed and successful ----------------------------------------------------------------


async def test_wait_allow_runs_requested_resolved_called_completed_with_causal_parents(
    start_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
    metis_home: Path,
) -> None:
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    _, api = await start_api(confirmation_config("{read_file: prompt}"))
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic", FakeReply.call("read_file", {"path": "notes.txt"}), FakeReply.say("read")
    )
    status, accepted = await api.submit(sid, "read the notes")
    assert status == 202, accepted
    turn_id = accepted["turn_id"]
    (requested,) = await wait_requests(api, sid, turn_id, 1)
    request = requested["payload"]
    rid = request["confirmation_request_id"]
    assert set(request) == {
        "confirmation_request_id",
        "tool_use_id",
        "tool_name",
        "side_effects",
        "policy",
        "input_summary",
        "projected_modifications",
        "command_summary",
        "message_id",
        "allowed_scopes",
        "expires_at",
    }
    assert request["projected_modifications"] is None and request["command_summary"] is None
    assert 0 < len(request["input_summary"]) <= 200 and "\n" not in request["input_summary"]
    assert "alpha" not in request["input_summary"]  # file contents never go into a summary
    assert request["policy"] == "wait" and request["tool_name"] == "read_file"
    assert request["side_effects"] == "read"
    assert request["allowed_scopes"] == ["once", "session"] and request["expires_at"]
    assert requested["actor"] == "system"

    # the request is listed for a client attaching later, under the same id
    _, session = await api.call("GET", f"/sessions/{sid}")
    (listed,) = session["pending_confirmations"]
    assert listed["confirmation_request_id"] == rid and listed["turn_id"] == turn_id
    assert listed["requested_event_id"] == requested["id"]
    (row,) = confirmation_rows(metis_home, sid)
    assert (row["id"], row["status"], row["policy"]) == (rid, "pending", "wait")

    status, body = await answer(api, sid, turn_id, rid, "allow")
    assert status == 200 and body == {
        "request_id": rid,
        "decision": "allow",
        "scope": "once",
        "applied": True,
    }
    terminal = await api.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.completed" and terminal["payload"]["tool_call_count"] == 1

    events = await api.turn_events(sid, turn_id)
    (use,), results = await tool_uses_and_results(api, sid)
    chain = for_tool_use(events, use["id"])
    assert types_of(chain) == [
        "tool.confirmation_requested",
        "tool.confirmation_resolved",
        "tool.called",
        "tool.completed",
    ]
    requested_e, resolved_e, called_e, completed_e = chain
    assert requested_e["id"] == requested["id"]
    assert requested_e["parent_event_id"] == llm_completed_before(events, requested_e)["id"]
    assert resolved_e["parent_event_id"] == requested_e["id"]
    assert called_e["parent_event_id"] == resolved_e["id"]
    assert completed_e["parent_event_id"] == called_e["id"]
    assert [e["actor"] for e in chain] == ["system", "user", "agent", "tool"]
    assert resolved_e["payload"] == {
        "confirmation_request_id": rid,
        "tool_use_id": use["id"],
        "decision": "allow",
        "scope": "once",
        "remembered": False,
        "reason": None,
    }
    assert request["message_id"] == next(
        m["id"] for m in (await api.messages(sid))["messages"] if m["role"] == "assistant"
    )
    assert set(completed_e["payload"]) == {
        "tool_use_id",
        "is_error",
        "output_bytes",
        "truncated",
        "duration_ms",
        "files_modified",
        "exit_code",
        "result_message_id",
    }
    assert completed_e["payload"]["is_error"] is False
    assert text_of(results[use["id"]]) == "alpha\nbeta\n"
    assert sent_results(fake, 1) == {use["id"]: (False, "alpha\nbeta\n")}
    (row,) = confirmation_rows(metis_home, sid)
    assert (row["status"], row["scope"], row["remembered"]) == ("allowed", "once", 0)
    _, session = await api.call("GET", f"/sessions/{sid}")
    assert session["pending_confirmations"] == []

    # the same answer again is an idempotent no-op; a different one is refused
    status, body = await answer(api, sid, turn_id, rid, "allow")
    assert status == 200 and body["applied"] is False
    status, body = await answer(api, sid, turn_id, rid, "deny")
    assert status == 409 and body["error"]["code"] == "confirmation_already_resolved"
    assert body["error"]["details"]["resolution"] == "allow"
    assert body["error"]["details"]["scope"] == "once"  # how it was settled, to show it
    assert types_of(await api.turn_events(sid, turn_id)).count("tool.confirmation_resolved") == 1

    # `once` is not remembered: the next call asks again
    fake.enqueue(
        "anthropic", FakeReply.call("read_file", {"path": "notes.txt"}), FakeReply.say("again")
    )
    status, accepted = await api.submit(sid, "read them again")
    assert status == 202
    (again,) = await wait_requests(api, sid, accepted["turn_id"], 1)
    status, _ = await answer(
        api, sid, accepted["turn_id"], again["payload"]["confirmation_request_id"], "deny"
    )
    assert status == 200
    assert (await api.wait_turn(sid, accepted["turn_id"]))["type"] == "turn.completed"


# -- a request id presented under another turn -----------------------------------------------------


async def test_request_id_under_another_turn_or_session_is_not_found_and_changes_nothing(
    start_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
    metis_home: Path,
) -> None:
    (workspace / "notes.txt").write_text("alpha\n")
    _, api = await start_api(confirmation_config("{read_file: prompt}"))
    sid = await session_on(api, workspace, "anthropic")
    other_sid = await session_on(api, workspace, "anthropic")
    # an earlier, finished turn of the same session, and a finished turn of another session
    fake.enqueue("anthropic", FakeReply.say("hello"))
    earlier, _ = await api.run_turn(sid, "hi")
    fake.enqueue("anthropic", FakeReply.say("hello"))
    foreign, _ = await api.run_turn(other_sid, "hi")

    fake.enqueue(
        "anthropic", FakeReply.call("read_file", {"path": "notes.txt"}), FakeReply.say("read")
    )
    status, accepted = await api.submit(sid, "read the notes")
    assert status == 202
    turn_id = accepted["turn_id"]
    (requested,) = await wait_requests(api, sid, turn_id, 1)
    rid = requested["payload"]["confirmation_request_id"]

    # a real id under another real turn of the same session, or of another session
    for where in (f"{sid}/turns/{earlier['turn_id']}", f"{other_sid}/turns/{foreign['turn_id']}"):
        for decision in ("allow", "deny"):
            status, body = await api.call(
                "POST", f"/sessions/{where}/confirmations/{rid}", {"decision": decision}
            )
            assert status == 404 and body["error"]["code"] == "confirmation_not_found", body
            assert body["error"]["details"] == {"request_id": rid}
    # the right turn, but under another session's URL: that turn is not in that session
    status, body = await api.call(
        "POST",
        f"/sessions/{other_sid}/turns/{turn_id}/confirmations/{rid}",
        {"decision": "allow"},
    )
    assert status == 404 and body["error"]["code"] == "turn_not_found", body
    # malformed ids are unknown ids: 404 with the resource's code
    status, body = await answer(api, sid, turn_id, "not-a-ulid", "allow")
    assert status == 404 and body["error"]["code"] == "confirmation_not_found", body
    status, body = await answer(api, sid, "not-a-ulid", rid, "allow")
    assert status == 404 and body["error"]["code"] == "turn_not_found", body

    # none of it touched the request: still pending, nothing resolved, nothing run
    (row,) = confirmation_rows(metis_home, sid)
    assert row["status"] == "pending" and row["resolved_at_us"] is None
    _, session = await api.call("GET", f"/sessions/{sid}")
    assert [p["confirmation_request_id"] for p in session["pending_confirmations"]] == [rid]
    events = await api.turn_events(sid, turn_id)
    assert not of_type(events, "tool.confirmation_resolved", "tool.called", *TERMINAL_TOOL)

    # the id in the event is the one the right URL accepts
    status, body = await answer(api, sid, turn_id, rid, "deny", reason="not now")
    assert status == 200 and body["applied"] is True
    assert (await api.wait_turn(sid, turn_id))["type"] == "turn.completed"
    (use,), results = await tool_uses_and_results(api, sid)
    assert text_of(results[use["id"]]) == "Tool call denied: not now"
    assert (
        one_per_tool_use(events := await api.turn_events(sid, turn_id), "tool.failed")[use["id"]][
            "payload"
        ]["error_class"]
        == "user_denied"
    )
    assert "tool.called" not in types_of(events)

    # a settled request stays known, but still only under its own turn
    fake.enqueue(
        "anthropic", FakeReply.call("read_file", {"path": "notes.txt"}), FakeReply.say("read")
    )
    status, accepted = await api.submit(sid, "read the notes again")
    assert status == 202
    later = accepted["turn_id"]
    (requested,) = await wait_requests(api, sid, later, 1)
    later_rid = requested["payload"]["confirmation_request_id"]
    for turn, request_id in ((later, rid), (turn_id, later_rid)):
        status, body = await answer(api, sid, turn, request_id, "allow")
        assert status == 404 and body["error"]["code"] == "confirmation_not_found", body
    assert [r["status"] for r in confirmation_rows(metis_home, sid)] == ["denied", "pending"]
    status, body = await answer(api, sid, later, later_rid, "allow")
    assert status == 200 and body["applied"] is True
    assert (await api.wait_turn(sid, later))["type"] == "turn.completed"


# -- policy modes ----------------------------------------------------------------------------------


async def test_deny_mode_fails_policy_denied_without_confirmation_events(
    start_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
    metis_home: Path,
) -> None:
    (workspace / "notes.txt").write_text("alpha\n")
    # per_tool beats the class default both ways: read_file (read: auto) is denied, shell
    # (execute: prompt by default here) runs
    config = (
        "tools:\n"
        "  confirmation:\n"
        "    default: {none: auto, read: auto, write: prompt, execute: prompt, network: prompt}\n"
        "    per_tool: {read_file: deny, write_file: deny, shell: auto}\n"
    )
    _, api = await start_api(config)
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        batch(
            ("read_file", {"path": "notes.txt"}),
            ("write_file", {"path": "notes.txt", "content": "changed"}),
            ("list_dir", {}),
            ("shell", {"command": "echo ran"}),
            # steps 2 and 3 come before the policy (step 4): their outcomes win over `deny`
            ("read_file", {"path": "notes.txt", "offset": "1"}),
            ("write_file", {"path": "../escape.txt", "content": "x"}),
        ),
        FakeReply.say("ok"),
    )
    accepted, terminal = await api.run_turn(sid, "try everything")
    assert terminal["type"] == "turn.completed", terminal

    events = await api.turn_events(sid, accepted["turn_id"])
    assert not of_type(events, *CONFIRMATION_EVENTS), types_of(events)
    uses, results = await tool_uses_and_results(api, sid)
    read, write, listed, shell, invalid, escape = (u["id"] for u in uses)
    failed = one_per_tool_use(events, "tool.failed")
    assert set(failed) == {read, write, escape}
    assert list(one_per_tool_use(events, "tool.input_invalid")) == [invalid]
    assert failed[escape]["payload"]["error_class"] == "permission_denied"
    assert not (workspace.parent / "escape.txt").exists()
    assert list(one_per_tool_use(events, "tool.called")) == [listed, shell]
    to_model = sent_results(fake, 1)
    for tool_use_id, name in ((read, "read_file"), (write, "write_file")):
        event = failed[tool_use_id]
        assert set(event["payload"]) == FAILED_FIELDS
        assert event["payload"]["error_class"] == "policy_denied"
        text = text_of(results[tool_use_id])
        assert text == f'Tool "{name}" is disabled by the local tool policy.'
        assert event["payload"]["message"] == text
        assert to_model[tool_use_id] == (True, text)
        assert event["parent_event_id"] == llm_completed_before(events, event)["id"]
    assert text_of(results[shell]) == "exit_code: 0\nran\n"
    assert (workspace / "notes.txt").read_text() == "alpha\n"
    assert confirmation_rows(metis_home, sid) == []


async def test_trusted_workspace_runs_writes_without_asking_but_still_asks_for_shell(
    start_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
) -> None:
    config = (
        "tools:\n"
        "  confirmation:\n"
        "    default: {none: auto, read: auto, write: prompt, execute: prompt, network: prompt}\n"
        f"    trusted_workspaces: [{workspace.parent}]\n"
    )
    _, api = await start_api(config)
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        batch(
            ("write_file", {"path": "made.txt", "content": "made\n"}),
            ("shell", {"command": "cat made.txt"}),
        ),
        FakeReply.say("ok"),
    )
    status, accepted = await api.submit(sid, "write then run")
    assert status == 202
    turn_id = accepted["turn_id"]
    (requested,) = await wait_requests(api, sid, turn_id, 1)
    assert requested["payload"]["tool_name"] == "shell"
    assert requested["payload"]["command_summary"] == "cat made.txt"
    status, _ = await answer(
        api, sid, turn_id, requested["payload"]["confirmation_request_id"], "allow"
    )
    assert status == 200
    assert (await api.wait_turn(sid, turn_id))["type"] == "turn.completed"
    events = await api.turn_events(sid, turn_id)
    uses, results = await tool_uses_and_results(api, sid)
    write, shell = (u["id"] for u in uses)
    assert types_of(for_tool_use(events, write)) == ["tool.called", "tool.completed"]
    assert types_of(for_tool_use(events, shell))[:2] == list(CONFIRMATION_EVENTS)
    assert text_of(results[shell]) == "exit_code: 0\nmade\n"


async def test_prompt_once_and_session_scope_are_remembered_also_after_a_restart(
    start_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
    metis_home: Path,
) -> None:
    """`prompt_once`: any answer is remembered; `prompt` remembers only `scope: session`.
    Remembered decisions are the `remembered = 1` rows, reloaded after a restart."""
    (workspace / "notes.txt").write_text("alpha\n")
    config = confirmation_config(
        "{read_file: prompt_once, grep_files: prompt_once, list_dir: prompt, write_file: prompt}"
    )
    # tool → (decision, scope) given at the first prompt, and whether it is then remembered
    first_answers = {
        "read_file": ("allow", "once", True),
        "grep_files": ("deny", "once", True),
        "list_dir": ("allow", "session", True),
        "write_file": ("allow", "once", False),
    }
    calls = (
        ("read_file", {"path": "notes.txt"}),
        ("grep_files", {"pattern": "alpha"}),
        ("list_dir", {}),
        ("write_file", {"path": "out.txt", "content": "x"}),
    )
    d1, api = await start_api(config)
    sid = await session_on(api, workspace, "anthropic")

    # turn 1: all four ask, together; each gets its answer
    fake.enqueue("anthropic", batch(*calls), FakeReply.say("first"))
    status, accepted = await api.submit(sid, "first")
    assert status == 202
    turn_id = accepted["turn_id"]
    requested = await wait_requests(api, sid, turn_id, 4)
    assert sorted(r["payload"]["tool_name"] for r in requested) == sorted(first_answers)
    for event in requested:
        decision, scope, _ = first_answers[event["payload"]["tool_name"]]
        rid = event["payload"]["confirmation_request_id"]
        reason = {"reason": "no grep"} if decision == "deny" else {}
        status, body = await answer(api, sid, turn_id, rid, decision, scope=scope, **reason)
        assert status == 200 and body["applied"] is True, body
    assert (await api.wait_turn(sid, turn_id))["type"] == "turn.completed"
    events = await api.turn_events(sid, turn_id)
    resolved = {
        e["payload"]["tool_use_id"]: e["payload"]
        for e in of_type(events, "tool.confirmation_resolved")
    }
    uses, _ = await tool_uses_and_results(api, sid)
    for use in uses:
        decision, scope, remembered = first_answers[use["name"]]
        assert resolved[use["id"]]["decision"] == decision
        assert resolved[use["id"]]["scope"] == scope
        assert resolved[use["id"]]["remembered"] is remembered, use["name"]
    rows = {r["tool_name"]: r for r in confirmation_rows(metis_home, sid)}
    assert {name: bool(r["remembered"]) for name, r in rows.items()} == {
        name: remembered for name, (_, _, remembered) in first_answers.items()
    }

    async def second_turn(api: Api, label: str) -> None:
        """read_file/list_dir run without asking, grep_files is denied without asking,
        write_file asks again (answered `deny` here)."""
        fake.enqueue("anthropic", batch(*calls), FakeReply.say(label))
        status, accepted = await api.submit(sid, label)
        assert status == 202
        turn_id = accepted["turn_id"]
        (ask,) = await wait_requests(api, sid, turn_id, 1)
        assert ask["payload"]["tool_name"] == "write_file", label
        status, _ = await answer(
            api, sid, turn_id, ask["payload"]["confirmation_request_id"], "deny"
        )
        assert status == 200
        assert (await api.wait_turn(sid, turn_id))["type"] == "turn.completed"
        events = await api.turn_events(sid, turn_id)
        uses, results = await tool_uses_and_results(api, sid)
        read, grep, listed, write = (u["id"] for u in uses[-4:])
        assert types_of(for_tool_use(events, read)) == ["tool.called", "tool.completed"], label
        assert types_of(for_tool_use(events, listed)) == ["tool.called", "tool.completed"], label
        assert text_of(results[read]) == "alpha\n"
        # a remembered deny: user_denied, no confirmation events, no tool.called
        (grep_failed,) = for_tool_use(events, grep)
        assert grep_failed["type"] == "tool.failed", label
        assert grep_failed["payload"]["error_class"] == "user_denied"
        assert text_of(results[grep]).startswith("Tool call denied")
        assert types_of(for_tool_use(events, write)) == [
            "tool.confirmation_requested",
            "tool.confirmation_resolved",
            "tool.failed",
        ]
        assert text_of(results[write]) == "Tool call denied"

    await second_turn(api, "second")
    # restart on the same METIS_HOME: the remembered rows are reloaded
    await d1.stop()
    _, api = await start_api()
    await second_turn(api, "after restart")
    assert (workspace / "out.txt").read_text() == "x"  # written in turn 1 only

    # remembered for that session only: another session of the workspace asks again
    other = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic", FakeReply.call("read_file", {"path": "notes.txt"}), FakeReply.say("other")
    )
    status, accepted = await api.submit(other, "read")
    assert status == 202
    (ask,) = await wait_requests(api, other, accepted["turn_id"], 1)
    assert ask["payload"]["tool_name"] == "read_file"
    rid = ask["payload"]["confirmation_request_id"]
    status, _ = await answer(api, other, accepted["turn_id"], rid, "allow")
    assert status == 200
    assert (await api.wait_turn(other, accepted["turn_id"]))["type"] == "turn.completed"


async def reads_under_prompt_once(
    start_api: Callable[..., Any], server: FakeProviderServer, workspace: Path, calls: int
) -> tuple[Api, str, str]:
    """A turn whose first reply calls `read_file` (mode `prompt_once`) `calls` times in one
    batch, then says "done"; returns (api, session id, turn id) once it is accepted."""
    (workspace / "notes.txt").write_text("alpha\n")
    _, api = await start_api(confirmation_config("{read_file: prompt_once}"))
    sid = await session_on(api, workspace, "anthropic")
    reads = [("read_file", {"path": "notes.txt"})] * calls
    server.enqueue("anthropic", batch(*reads), FakeReply.say("done"))
    status, accepted = await api.submit(sid, f"read {calls} times")
    assert status == 202
    return api, sid, accepted["turn_id"]


@pytest.mark.parametrize("decision", ["allow", "deny"])
async def test_prompt_once_asks_once_when_one_batch_calls_the_tool_several_times(
    start_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
    decision: str,
) -> None:
    """Three `read_file` calls in one batch: one question; its answer (remembered) decides the
    other two, which never ask (no confirmation events, no second request row)."""
    api, sid, turn_id = await reads_under_prompt_once(start_api, fake, workspace, 3)
    (ask,) = await wait_requests(api, sid, turn_id, 1)
    await asyncio.sleep(0.2)  # a second question, if one were asked, would be out by now
    assert len(of_type(await api.turn_events(sid, turn_id), CONFIRMATION_EVENTS[0])) == 1
    status, _ = await answer(api, sid, turn_id, ask["payload"]["confirmation_request_id"], decision)
    assert status == 200
    assert (await api.wait_turn(sid, turn_id))["type"] == "turn.completed"
    events = await api.turn_events(sid, turn_id)
    assert len(of_type(events, *CONFIRMATION_EVENTS)) == 2
    uses, results = await tool_uses_and_results(api, sid)
    assert len(uses) == 3
    for use in uses:
        if decision == "allow":
            assert text_of(results[use["id"]]) == "alpha\n"
        else:
            assert text_of(results[use["id"]]).startswith("Tool call denied")


async def test_a_call_waiting_behind_its_tools_first_question_is_cancelled_with_the_turn(
    start_api: Callable[..., Any],
    fake: FakeProviderServer,
    workspace: Path,
    metis_home: Path,
) -> None:
    api, sid, turn_id = await reads_under_prompt_once(start_api, fake, workspace, 2)
    await wait_requests(api, sid, turn_id, 1)
    status, _ = await api.call("POST", f"/sessions/{sid}/turns/{turn_id}/cancel", {})
    assert status in (200, 202)
    assert (await api.wait_turn(sid, turn_id))["type"] == "turn.cancelled"
    events = await api.turn_events(sid, turn_id)
    failed = of_type(events, "tool.failed")
    assert len(failed) == 2 and {e["payload"]["error_class"] for e in failed} == {"cancelled"}
    assert not of_type(events, "tool.called")
    assert [r["status"] for r in confirmation_rows(metis_home, sid)] == ["withdrawn"]
