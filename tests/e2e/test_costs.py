"""Cost accumulation through the real daemon, the real SDKs and the fake provider.

Every LLM call is priced by core from the token counts the fake provider reports; a call that
completed, was cancelled or failed adds its spend to its turn and its session whatever the turn's
outcome. The expected prices are computed here from the models.yaml the daemon loaded, in exact
Decimal arithmetic, and compared as strings: on REST, on the WebSocket and in SQLite.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api
from tests.e2e.test_provider_turns import MODEL_OF, models_yaml, session_on, types_of
from tests.ws_client import Ws, events_of

SONNET = MODEL_OF["anthropic"]
DECIMAL_WIRE = re.compile(r"^-?[0-9]+(\.[0-9]*[1-9])?$")  # trailing zeros stripped
QUARTET = ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")
PRICE_KEY = {
    "input_tokens": "input_per_mtok",
    "cache_read_tokens": "cache_read_per_mtok",
    "cache_write_tokens": "cache_write_per_mtok",
    "output_tokens": "output_per_mtok",
}
# Token counts chosen so every call costs a different, many-digit amount.
U0 = {"input_tokens": 17, "output_tokens": 3, "cache_read_tokens": 0, "cache_write_tokens": 0}
U1 = {
    "input_tokens": 1234,
    "output_tokens": 567,
    "cache_read_tokens": 8901,
    "cache_write_tokens": 23,
}
U2 = {"input_tokens": 77, "output_tokens": 1, "cache_read_tokens": 3, "cache_write_tokens": 1}
U3 = {"input_tokens": 4321, "output_tokens": 89, "cache_read_tokens": 0, "cache_write_tokens": 777}

Env = tuple[Daemon, Api, FakeProviderServer]


def prices(fake: FakeProviderServer, model: str = SONNET) -> dict[str, Decimal]:
    """The prices the daemon loaded, read from the same models.yaml text."""
    loaded = yaml.safe_load(models_yaml(fake))
    entry = next(m for m in loaded["models"] if m["id"] == model)
    return {k: Decimal(str(v)) for k, v in entry["pricing"].items()}


def cost_of(tokens: dict[str, Any], price: dict[str, Decimal]) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = 28
        total = sum(
            (Decimal(int(tokens.get(k, 0))) * price.get(PRICE_KEY[k], Decimal(0)) for k in QUARTET),
            Decimal(0),
        )
        return total / Decimal(1_000_000)


def plain(value: Decimal) -> str:
    """The Decimal wire form, written independently of the daemon's serializer."""
    if value == 0:
        return "0"
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def total(values: list[str]) -> Decimal:
    return sum((Decimal(v) for v in values), Decimal(0))


def usd_fields(value: Any, path: str = "$") -> list[tuple[str, Any]]:
    """Every (path, value) whose key ends in `_usd`, anywhere in a JSON document."""
    found: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith("_usd"):
                found.append((f"{path}.{key}", item))
            found.extend(usd_fields(item, f"{path}.{key}"))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found.extend(usd_fields(item, f"{path}[{i}]"))
    return found


def assert_decimal_strings(document: Any) -> int:
    fields = usd_fields(document)
    bad = [(p, v) for p, v in fields if not (isinstance(v, str) and DECIMAL_WIRE.match(v))]
    assert not bad, bad
    return len(fields)


def calls_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The terminal event of every LLM call attempt, in order."""
    return [e for e in events if e["type"] in ("llm.call_completed", "llm.call_failed")]


def assert_priced_by_formula(call: dict[str, Any], price: dict[str, Decimal]) -> None:
    payload = call["payload"]
    assert payload["cost_usd"] == plain(cost_of(payload, price)), payload
    assert payload["pricing_version"] == "e2e-1"


def assert_store_invariants(metis_home: Path, session_id: str) -> None:
    """The sessions and turns rows equal the sums over their llm.call_* events."""
    db = sqlite3.connect(f"file:{metis_home / 'metis.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        events = db.execute(
            "SELECT turn_id, payload_json FROM events WHERE session_id=? AND type IN "
            "('llm.call_completed','llm.call_failed') ORDER BY seq",
            (session_id,),
        ).fetchall()
        payloads = [(row["turn_id"], json.loads(row["payload_json"])) for row in events]
        for p in (p for _, p in payloads):
            assert isinstance(p["cost_usd"], str) and DECIMAL_WIRE.match(p["cost_usd"]), p
        session = db.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
        assert session["cost_so_far_usd"] == plain(total([p["cost_usd"] for _, p in payloads]))
        for key in QUARTET:
            assert session[key] == sum(int(p[key]) for _, p in payloads), key
        turns = db.execute("SELECT * FROM turns WHERE session_id=?", (session_id,)).fetchall()
        assert len(turns) == session["turn_count"]
        for turn in turns:
            mine = [p for t, p in payloads if t == turn["id"]]
            assert turn["cost_usd"] == plain(total([p["cost_usd"] for p in mine])), turn["id"]
            assert turn["llm_call_count"] == len(mine)
            for key in QUARTET:
                assert turn[key] == sum(int(p[key]) for p in mine), (turn["id"], key)
    finally:
        db.close()


async def session_view(api: Api, session_id: str) -> dict[str, Any]:
    status, got = await api.call("GET", f"/sessions/{session_id}")
    assert status == 200, got
    assert_decimal_strings(got)
    return got


async def test_session_total_is_the_exact_sum_of_its_calls_across_turns(
    env: Env, workspace: Path, metis_home: Path
) -> None:
    _, api, fake = env
    price = prices(fake)
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        FakeReply.call("shell", {"command": "echo one"}, usage=U1),
        FakeReply.say("first answer", usage=U2),
    )
    first, terminal1 = await api.run_turn(sid, "turn one")
    assert terminal1["type"] == "turn.completed"
    after_first = await session_view(api, sid)
    assert after_first["turn_count"] == 1

    # the second turn is watched live over the WebSocket as well
    ws, _ = await Ws.subscribed(api, sid, snapshot=True)
    try:
        snapshot = await ws.recv()
        assert snapshot["type"] == "snapshot" and assert_decimal_strings(snapshot) >= 3
        assert snapshot["session"]["cost_so_far_usd"] == after_first["cost_so_far_usd"]
        fake.enqueue("anthropic", FakeReply.say("second answer", usage=U3))
        second, terminal2 = await api.run_turn(sid, "turn two")
        assert terminal2["type"] == "turn.completed"
        live = await ws.turn(second["turn_id"])
    finally:
        await ws.close()

    events = await api.events(sid)
    assert assert_decimal_strings(events) >= 5
    turn1 = [e for e in events if e["turn_id"] == first["turn_id"]]
    turn2 = [e for e in events if e["turn_id"] == second["turn_id"]]
    expected = [plain(cost_of(u, price)) for u in (U1, U2, U3)]
    assert [c["payload"]["cost_usd"] for c in calls_of(turn1) + calls_of(turn2)] == expected
    assert types_of(calls_of(turn1 + turn2)) == ["llm.call_completed"] * 3
    for call in calls_of(events):
        assert_priced_by_formula(call, price)

    # per turn: the terminal payload carries the exact sum of its calls
    assert terminal1["payload"]["total_cost_usd"] == plain(total(expected[:2]))
    assert terminal2["payload"]["total_cost_usd"] == expected[2]
    assert (
        terminal1["payload"]["llm_call_count"] == 2 and terminal2["payload"]["llm_call_count"] == 1
    )
    assert terminal1["payload"]["input_tokens"] == U1["input_tokens"] + U2["input_tokens"]

    # per session: REST detail and list agree with the exact sum, and with turn_count
    session_total = plain(total(expected))
    assert after_first["cost_so_far_usd"] == plain(total(expected[:2]))
    got = await session_view(api, sid)
    assert got["cost_so_far_usd"] == session_total and got["turn_count"] == 2
    status, listing = await api.call("GET", "/sessions")
    assert status == 200 and assert_decimal_strings(listing) >= 1
    item = next(s for s in listing["sessions"] if s["id"] == sid)
    assert item["cost_so_far_usd"] == session_total and item["turn_count"] == 2

    # the stored assistant messages carry the same per-call cost
    messages = (await api.messages(sid))["messages"]
    assert_decimal_strings(messages)
    assistant_costs = [
        m["metadata"]["usage"]["cost_usd"] for m in messages if m["role"] == "assistant"
    ]
    assert assistant_costs == expected

    # WebSocket: the same Decimal strings, in the persisted and the streaming-only events
    assert_decimal_strings(live)
    completes = [e for e in live if e["type"] == "message.complete"]
    assert [c["payload"]["usage"]["cost_usd"] for c in completes] == [expected[2]]
    by_type = {e["type"]: e["payload"] for e in live}
    assert by_type["llm.call_completed"]["cost_usd"] == expected[2]
    assert by_type["turn.completed"]["total_cost_usd"] == expected[2]
    assert_decimal_strings(events_of(ws.frames, catch_up=True))

    assert_store_invariants(metis_home, sid)

    # ending the session reports the same total
    status, _ = await api.call("DELETE", f"/sessions/{sid}")
    assert status == 200
    ended = next(e for e in await api.events(sid) if e["type"] == "session.ended")
    assert ended["payload"]["total_cost_usd"] == session_total
    assert ended["payload"]["turn_count"] == 2


@pytest.mark.parametrize("stall", ["before_first_token", "mid_stream"])
async def test_cancelled_turn_keeps_the_spend_of_its_completed_call(
    env: Env, workspace: Path, metis_home: Path, stall: str
) -> None:
    _, api, fake = env
    price = prices(fake)
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue("anthropic", FakeReply.say("warm up", usage=U0))
    _, warm = await api.run_turn(sid, "earlier turn")
    assert warm["type"] == "turn.completed"

    # first call completes (a tool call), the second stalls until the cancel
    events_before_hang = 0 if stall == "before_first_token" else 4  # 4 = message_start..delta
    fake.enqueue(
        "anthropic",
        FakeReply.call("shell", {"command": "echo one"}, usage=U1),
        FakeReply.hang_after(events_before_hang, text="this never finishes", usage=U2),
    )
    ws, _ = await Ws.subscribed(api, sid)  # to see, live, how far the daemon got
    try:
        status, accepted = await api.submit(sid, "this turn gets cancelled")
        assert status == 202
        turn_id = accepted["turn_id"]

        def seen(kind: str) -> Callable[[dict[str, Any]], bool]:
            return lambda f: (
                f.get("type") == "event"
                and f["event"]["type"] == kind
                and f["event"]["turn_id"] == turn_id
            )

        await ws.until(seen("llm.call_completed"))  # the first call (the tool call) is priced
        if stall == "before_first_token":  # the second call waits for its first event
            await ws.until(seen("llm.call_started"))
            await fake.wait_until(lambda: len(fake.requests) >= 3, timeout=10)
        else:  # the daemon has streamed part of the second answer
            await ws.until(seen("text.delta"))
    finally:
        await ws.close()
    status, body = await api.call("POST", f"/sessions/{sid}/turns/{turn_id}/cancel")
    assert status == 202 and body["cancellation_initiated"] is True
    terminal = await api.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.cancelled" and terminal["payload"]["reason"] == "user_cancel"

    events = await api.turn_events(sid, turn_id)
    assert_decimal_strings(events)
    calls = calls_of(events)
    assert types_of(calls) == ["llm.call_completed", "llm.call_failed"]
    first, cancelled = calls[0]["payload"], calls[1]["payload"]
    assert first["cost_usd"] == plain(cost_of(U1, price)) and first["cost_usd"] != "0"
    assert cancelled["error_class"] == "cancelled"
    for call in calls:
        assert_priced_by_formula(call, price)
    if stall == "before_first_token":
        assert cancelled["cost_usd"] == "0"  # nothing was reported before the cancel
    else:  # message_start reported the prompt's buckets: the cancelled call is costed with them
        assert cancelled["input_tokens"] == U2["input_tokens"]
        assert cancelled["cache_read_tokens"] == U2["cache_read_tokens"]
        assert cancelled["cache_write_tokens"] == U2["cache_write_tokens"]
        assert Decimal(cancelled["cost_usd"]) > 0

    turn_total = total([first["cost_usd"], cancelled["cost_usd"]])
    assert terminal["payload"]["total_cost_usd"] == plain(turn_total)
    assert Decimal(terminal["payload"]["total_cost_usd"]) >= cost_of(U1, price)
    assert terminal["payload"]["llm_call_count"] == 2
    assert terminal["payload"]["tool_call_count"] == 1
    assert terminal["payload"]["input_tokens"] == U1["input_tokens"] + cancelled["input_tokens"]

    got = await session_view(api, sid)
    assert got["cost_so_far_usd"] == plain(cost_of(U0, price) + turn_total)
    assert got["turn_count"] == 2 and got["current_turn_id"] is None
    assert_store_invariants(metis_home, sid)


@pytest.mark.parametrize(
    ("failure", "error_class"),
    [
        (FakeReply.fail(500, "api_error", retry_after=0, repeat=3), "server_error"),
        (FakeReply.drop_after(6, text="cut off in the middle", chunk_chars=4, usage=U2), "network"),
    ],
    ids=["http_500", "dropped_mid_stream"],
)
async def test_turn_failed_on_its_second_call_keeps_the_first_calls_spend(
    env: Env, workspace: Path, metis_home: Path, failure: FakeReply, error_class: str
) -> None:
    _, api, fake = env
    price = prices(fake)
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue("anthropic", FakeReply.call("shell", {"command": "echo one"}, usage=U1), failure)
    accepted, terminal = await api.run_turn(sid, "this turn fails on its second call")
    assert terminal["type"] == "turn.failed" and terminal["payload"]["reason"] == "provider_error"
    assert terminal["payload"]["error_class"] == error_class

    events = await api.turn_events(sid, accepted["turn_id"])
    assert_decimal_strings(events)
    calls = calls_of(events)
    assert calls[0]["type"] == "llm.call_completed"
    assert calls[0]["payload"]["cost_usd"] == plain(cost_of(U1, price))
    failed = [c["payload"] for c in calls[1:]]
    assert failed and all(c["type"] == "llm.call_failed" for c in calls[1:])
    assert all(f["error_class"] == error_class for f in failed)
    for call in calls:
        assert_priced_by_formula(call, price)
    if error_class == "server_error":  # three attempts, none reported usage
        assert [f["cost_usd"] for f in failed] == ["0", "0", "0"]
    else:  # dropped after message_start: the known prompt buckets are costed
        assert len(failed) == 1 and failed[0]["input_tokens"] == U2["input_tokens"]
        assert Decimal(failed[0]["cost_usd"]) > 0

    turn_total = total([c["payload"]["cost_usd"] for c in calls])
    assert turn_total >= cost_of(U1, price)
    assert terminal["payload"]["total_cost_usd"] == plain(turn_total)
    assert terminal["payload"]["llm_call_count"] == len(calls)
    got = await session_view(api, sid)
    assert got["cost_so_far_usd"] == plain(turn_total) and got["turn_count"] == 1
    assert_store_invariants(metis_home, sid)
