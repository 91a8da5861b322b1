"""Creating, reading, listing and deleting AAP sessions."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from metis.aap.agents import with_secret_option
from metis.aap.http import AAP_STATE_KEY
from metis.config import load_settings
from metis.core.errors import ConfigError
from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.aap.client import WEATHER, AapClient
from tests.aap.conftest import roots
from tests.api import Api
from tests.e2e.test_long_sessions import MODELS, OUTPUT, SMALL, WINDOW

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
DATA_URI = f"data:image/png;base64,{PNG}"

SEED = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What's the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "And this?"}, {"type": "image", "url": DATA_URI}],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "look it up"},
            {"type": "text", "text": "Checking."},
            {
                "type": "tool_use",
                "toolCallId": "call_1",
                "name": "get_weather",
                "input": {"location": "Paris"},
            },
        ],
    },
    {"role": "tool", "toolCallId": "call_1", "content": [{"type": "text", "text": "12°C"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "12°C in Paris."}]},
]


async def _counts(daemon: Daemon) -> tuple[int, ...]:
    row = await daemon.core.db.fetchone(
        "SELECT (SELECT COUNT(*) FROM sessions), (SELECT COUNT(*) FROM messages), "
        "(SELECT COUNT(*) FROM aap_sessions), (SELECT COUNT(*) FROM events)"
    )
    return tuple(row)


async def test_create_and_get_normalise_the_configuration(aap: AapClient) -> None:
    sid = await aap.create(
        tools=[{"name": "read_file", "trust": True}, {"name": "shell"}],
        client_tools=[
            {
                "parameters": WEATHER["parameters"],
                "name": "get_weather",
                "description": "w",
                "x-extra": 1,
            }
        ],
    )
    assert sid.startswith("sess_")
    reply = await aap.request("GET", f"/sessions/{sid}")
    assert reply.status == 200
    assert reply.body == {
        "sessionId": sid,
        "agent": {
            "name": "metis",
            "tools": [{"name": "read_file", "trust": True}, {"name": "shell", "trust": False}],
            "options": {"model": "auto", "workspace": aap.workspace},
        },
        # same JSON value back, key order kept, unknown field dropped
        "tools": [{"parameters": WEATHER["parameters"], "name": "get_weather", "description": "w"}],
    }
    assert list(reply.body["tools"][0]) == ["parameters", "name", "description"]


async def test_seed_history_round_trips_exactly(aap: AapClient) -> None:
    sid = await aap.create(messages=SEED, client_tools=[WEATHER])
    assert await aap.history(sid, "full") == SEED
    assert await aap.history(sid, "compacted") == SEED  # nothing to compact
    reply = await aap.say(sid, "hello")
    full = await aap.history(sid)
    assert full[: len(SEED)] == SEED and full[len(SEED)] == {"role": "user", "content": "hello"}
    assert reply.stop == "end_turn"


@pytest.mark.parametrize(
    ("messages", "code"),
    [
        (
            [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "toolCallId": "a", "name": "t", "input": {}}],
                }
            ],
            "invalid_seed",
        ),
        ([{"role": "tool", "toolCallId": "a", "content": "x"}], "invalid_seed"),
        (
            [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "toolCallId": "a", "name": "t", "input": {}}],
                },
                {"role": "tool", "toolCallId": "a", "content": "x"},
                {"role": "tool", "toolCallId": "a", "content": "y"},
            ],
            "invalid_seed",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "toolCallId": "a", "name": "t", "input": {}},
                        {"type": "tool_use", "toolCallId": "a", "name": "t", "input": {}},
                    ],
                },
                {"role": "tool", "toolCallId": "a", "content": "x"},
            ],
            "invalid_seed",
        ),
        ([{"role": "user", "content": ""}], "invalid_content"),
        ([{"role": "user", "content": [{"type": "audio", "data": "x"}]}], "invalid_content"),
        (
            [{"role": "user", "content": [{"type": "image", "url": "https://example.com/a.png"}]}],
            "invalid_content",
        ),
        (
            [{"role": "user", "content": [{"type": "image", "url": "data:image/png;base64,@@@"}]}],
            "invalid_content",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "image", "url": "data:image/bmp;base64," + PNG}],
                }
            ],
            "invalid_content",
        ),
        (  # png bytes sent as a jpeg: a provider would refuse the turn once started
            [
                {
                    "role": "user",
                    "content": [{"type": "image", "url": "data:image/jpeg;base64," + PNG}],
                }
            ],
            "invalid_content",
        ),
        ([{"role": "narrator", "content": "x"}], "validation_error"),
        (
            [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "toolCallId": "a", "name": "t\n", "input": {}}
                    ],
                },
                {"role": "tool", "toolCallId": "a", "content": "x"},
            ],
            "invalid_content",
        ),
    ],
)
async def test_bad_seeds_are_refused_and_write_nothing(
    daemon_and_aap: tuple[Daemon, AapClient], messages: list[dict[str, Any]], code: str
) -> None:
    daemon, aap = daemon_and_aap
    before = await _counts(daemon)
    reply = await aap.request(
        "POST", "/sessions", {"agent": {"name": "metis"}, "messages": messages}
    )
    assert reply.status == 400 and reply.error == code, reply.body
    assert await _counts(daemon) == before


async def test_oversized_image_is_refused(
    start_daemon: Any, client_for: Any, workspace: Path
) -> None:
    daemon = await start_daemon(aap={"max_image_bytes": 16, "workspace_roots": [str(workspace)]})
    aap = await client_for(daemon)
    reply = await aap.request(
        "POST",
        "/sessions",
        {
            "agent": {"name": "metis"},
            "messages": [{"role": "user", "content": [{"type": "image", "url": DATA_URI}]}],
        },
    )
    assert reply.status == 400 and reply.error == "invalid_content"


@pytest.mark.parametrize(
    ("agent", "tools", "code"),
    [
        ({"name": "nobody"}, None, "unknown_agent"),
        ({"name": "metis", "options": {"colour": "red"}}, None, "invalid_option"),
        ({"name": "metis", "options": {"model": 3}}, None, "invalid_option"),
        ({"name": "metis", "options": {"model": "gpt-9"}}, None, "invalid_option"),
        ({"name": "metis", "tools": [{"name": "teleport"}]}, None, "invalid_tools"),
        ({"name": "metis", "tools": [{"name": "shell"}, {"name": "shell"}]}, None, "invalid_tools"),
        ({"name": "metis"}, [{**WEATHER, "name": "bad name!"}], "invalid_tools"),
        ({"name": "metis"}, [{**WEATHER, "name": "get_weather\n"}], "invalid_tools"),
        ({"name": "metis"}, [WEATHER, WEATHER], "invalid_tools"),
        ({"name": "metis"}, [{**WEATHER, "name": "read_file"}], "invalid_tools"),
        ({"name": "metis"}, [{**WEATHER, "parameters": {"type": "string"}}], "invalid_tools"),
        ({"name": "metis"}, [{"name": "x", "parameters": {"type": "object"}}], "validation_error"),
        ({"tools": []}, None, "validation_error"),
    ],
)
async def test_bad_configurations_are_refused_and_write_nothing(
    daemon_and_aap: tuple[Daemon, AapClient], agent: dict[str, Any], tools: Any, code: str
) -> None:
    daemon, aap = daemon_and_aap
    before = await _counts(daemon)
    body: dict[str, Any] = {"agent": agent}
    if tools is not None:
        body["tools"] = tools
    reply = await aap.request("POST", "/sessions", body)
    assert reply.status == 400 and reply.error == code, reply.body
    assert await _counts(daemon) == before


async def test_workspace_option_rules(
    daemon_and_aap: tuple[Daemon, AapClient], workspace: Path, tmp_path: Path, metis_home: Path
) -> None:
    _daemon, aap = daemon_and_aap
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "escape").symlink_to(outside)
    for value in (
        str(outside),
        str(workspace / "escape"),
        "../etc",
        str(workspace / "missing"),
        "a/b",
    ):
        reply = await aap.request(
            "POST", "/sessions", {"agent": {"name": "metis", "options": {"workspace": value}}}
        )
        assert reply.status == 400 and reply.error == "invalid_option", (value, reply.body)
    inside = workspace / "sub"
    inside.mkdir()
    sid = await aap.create(options={"workspace": str(inside)})
    rows = await Api(aap.http, aap.auth()).call("GET", f"/sessions/{sid}")
    assert rows[1]["workspace_path"] == str(inside.resolve())
    scratch = await aap.create(options={"workspace": "scratch-1"})
    created = metis_home / "workspaces" / "scratch-1"
    assert created.is_dir() and (created.stat().st_mode & 0o777) == 0o700
    info = await aap.request("GET", f"/sessions/{scratch}")
    assert info.body["agent"]["options"]["workspace"] == "scratch-1"
    default = await aap.create(options={})
    info = await aap.request("GET", f"/sessions/{default}")
    assert info.body["agent"]["options"]["workspace"] == str(
        (metis_home / "workspaces" / "default").resolve()
    )


async def test_bare_names_are_judged_after_resolution_and_refusals_create_nothing(
    daemon_and_aap: tuple[Daemon, AapClient], tmp_path: Path, metis_home: Path
) -> None:
    daemon, aap = daemon_and_aap
    scratch_root = metis_home / "workspaces"
    outside = tmp_path / "outside"
    outside.mkdir()
    (scratch_root / "evil").symlink_to(outside)
    (scratch_root / "dangling").symlink_to(tmp_path / "missing")
    before = await _counts(daemon)
    entries = sorted(scratch_root.iterdir())
    for value in ("evil", "dangling", "audit2\n"):
        reply = await aap.request(
            "POST", "/sessions", {"agent": {"name": "metis", "options": {"workspace": value}}}
        )
        assert reply.status == 400 and reply.error == "invalid_option", (value, reply.body)
    assert await _counts(daemon) == before
    assert sorted(scratch_root.iterdir()) == entries


async def test_aap_workspaces_ignore_the_metis_workspace_roots(
    start_daemon: Any, client_for: Any, workspace: Path, tmp_path: Path, metis_home: Path
) -> None:
    metis_only = tmp_path / "metis-only"
    metis_only.mkdir()
    daemon = await start_daemon(allowed_workspace_roots=[str(metis_only)], **roots(workspace))
    aap = await client_for(daemon)
    expected = {
        "scratch-2": metis_home / "workspaces" / "scratch-2",
        None: metis_home / "workspaces" / "default",
        str(workspace): workspace,
    }
    for value, path in expected.items():
        sid = await aap.create(options={} if value is None else {"workspace": value})
        _status, row = await Api(aap.http, aap.auth()).call("GET", f"/sessions/{sid}")
        assert row["workspace_path"] == str(path.resolve())


async def test_default_workspace_is_the_top_level_setting(
    start_daemon: Any, client_for: Any, workspace: Path, tmp_path: Path, metis_home: Path
) -> None:
    chosen = tmp_path / "chosen-default"
    daemon = await start_daemon(config=f"default_workspace: {chosen}\n", **roots(workspace))
    aap = await client_for(daemon)
    meta = await aap.request("GET", "/meta")
    option = next(o for o in meta.body["agents"][0]["options"] if o["name"] == "workspace")
    assert option["default"] == str(chosen.resolve()) and chosen.is_dir()
    sid = await aap.create(options={})
    _status, row = await Api(aap.http, aap.auth()).call("GET", f"/sessions/{sid}")
    assert row["workspace_path"] == str(chosen.resolve())
    (metis_home / "config.yaml").write_text(f"aap:\n  default_workspace: {chosen}\n")
    with pytest.raises(ConfigError, match=r"aap\.default_workspace: unknown key"):
        load_settings(home=metis_home, port=0)


async def test_a_workspace_override_must_equal_the_stored_value(
    aap: AapClient, metis_home: Path
) -> None:
    sid = await aap.create(options={"workspace": "audit"})
    same = await aap.say(sid, "hi", agent={"options": {"workspace": "audit"}})
    assert same.status == 200
    resolved = str((metis_home / "workspaces" / "audit").resolve())
    moved = await aap.say(sid, "hi", agent={"options": {"workspace": resolved}})
    assert moved.status == 400 and moved.error == "invalid_option"


async def test_compacted_history_keeps_the_order_of_full_when_nothing_was_compacted(
    aap: AapClient,
) -> None:
    seed = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "system", "content": "From now on, be terse."},
    ]
    sid = await aap.create(messages=seed)
    assert (await aap.say(sid, "again")).stop == "end_turn"
    full = await aap.history(sid, "full")
    assert full[:3] == seed
    assert await aap.history(sid, "compacted") == full


async def test_the_compacted_view_follows_the_providers_count_as_the_next_call_does(
    start_daemon: Any, client_for: Any, fake: FakeProviderServer, workspace: Path
) -> None:
    """Once the provider has counted four times the estimate, the runner fits the session to
    that count; the compacted history shows that fit, not the estimate's (which still fits
    the whole history in the window)."""
    models = MODELS.format(anthropic=fake.anthropic_base_url, window=WINDOW, output=OUTPUT)
    daemon = await start_daemon(models=models, **roots(workspace))
    aap = await client_for(daemon)
    sid = await aap.create(options={"model": SMALL, "workspace": str(workspace)})
    for i, counted in enumerate((None, 12_000)):  # ~1,500 estimated tokens a reply
        usage = {"input_tokens": counted} if counted else None
        fake.enqueue("anthropic", FakeReply.say(f"answer {i} " + "r" * 6000, usage=usage))
        assert (await aap.say(sid, f"question {i}")).status == 200
    full, compacted = await aap.history(sid, "full"), await aap.history(sid, "compacted")
    assert len(full) == 4 and len(compacted) < len(full)
    assert compacted[-1] == full[-1]


async def test_options_merge_by_key_and_the_workspace_and_name_are_fixed(
    daemon_and_aap: tuple[Daemon, AapClient], workspace: Path
) -> None:
    daemon, aap = daemon_and_aap
    sid = await aap.create()
    reply = await aap.say(sid, "hi", agent={"options": {"model": "scripted"}})
    assert reply.status == 200
    info = await aap.request("GET", f"/sessions/{sid}")
    assert info.body["agent"]["options"] == {"model": "scripted", "workspace": aap.workspace}
    same = await aap.say(sid, "again", agent={"options": {"workspace": aap.workspace}})
    assert same.status == 200
    other = workspace / "other"
    other.mkdir()
    moved = await aap.say(sid, "move", agent={"options": {"workspace": str(other)}})
    assert moved.status == 400 and moved.error == "invalid_option"
    renamed = await aap.say(sid, "rename", agent={"name": "someone"})
    assert renamed.status == 400 and renamed.error == "validation_error"
    await daemon.core.flush()
    rows = await daemon.core.db.fetchall(
        "SELECT payload_json FROM events WHERE session_id=? AND type='turn.started' ORDER BY seq",
        (sid,),
    )
    overrides = [json.loads(r["payload_json"])["per_message_override"] for r in rows]
    assert overrides == ["local:scripted", "local:scripted"]
    back = await aap.say(sid, "auto again", agent={"options": {"model": "auto"}})
    assert back.status == 200
    rows = await daemon.core.db.fetchall(
        "SELECT payload_json FROM events WHERE session_id=? AND type='turn.started' ORDER BY seq",
        (sid,),
    )
    assert json.loads(rows[-1]["payload_json"])["per_message_override"] is None


async def test_tool_overrides_persist_and_disable(daemon_and_aap: tuple[Daemon, AapClient]) -> None:
    _daemon, aap = daemon_and_aap
    sid = await aap.create(tools=[{"name": "list_dir", "trust": True}], client_tools=[WEATHER])
    reply = await aap.say(sid, "use server tool", agent={"tools": []}, tools=[])
    # nothing offered any more: the scripted model answers in text, nothing runs
    assert reply.stop == "end_turn" and reply.tool_calls() == []
    info = await aap.request("GET", f"/sessions/{sid}")
    assert info.body["agent"]["tools"] == [] and info.body["tools"] == []
    reply = await aap.say(sid, "use tool", agent={"tools": [{"name": "read_file", "trust": True}]})
    assert [c["name"] for c in reply.tool_calls()] == ["read_file"]
    info = await aap.request("GET", f"/sessions/{sid}")
    assert info.body["agent"]["tools"] == [{"name": "read_file", "trust": True}]


async def test_secret_options_are_never_returned(
    daemon_and_aap: tuple[Daemon, AapClient], caplog: pytest.LogCaptureFixture
) -> None:
    daemon, aap = daemon_and_aap
    state = daemon.app[AAP_STATE_KEY]
    state.agents.extras.append(with_secret_option("vault", "token", history=("full",)))
    secret = "s3cr3t-value-xyz"
    sid = await aap.create(agent="vault", options={"workspace": aap.workspace, "token": secret})
    for reply in (
        await aap.request("GET", f"/sessions/{sid}"),
        await aap.request("GET", "/sessions"),
        await aap.v1.request("GET", f"/session/{sid}"),
    ):
        assert secret not in json.dumps(reply.body) and '"***"' in json.dumps(reply.body)
    assert (await aap.say(sid, "hi", agent={"options": {"token": "***"}})).status == 200
    stored = await daemon.core.db.fetchone(
        "SELECT secret_options_json FROM aap_sessions WHERE session_id=?", (sid,)
    )
    assert json.loads(stored[0]) == {"token": secret}  # the echo kept the stored value
    assert (await aap.say(sid, "hi", agent={"options": {"token": "new-one"}})).status == 200
    stored = await daemon.core.db.fetchone(
        "SELECT secret_options_json FROM aap_sessions WHERE session_id=?", (sid,)
    )
    assert json.loads(stored[0]) == {"token": "new-one"}
    await daemon.core.flush()
    events = await daemon.core.db.fetchall("SELECT payload_json FROM events")
    assert not any(secret in e[0] for e in events)
    assert secret not in caplog.text
    meta = await aap.request("GET", "/meta")
    vault = next(a for a in meta.body["agents"] if a["name"] == "vault")
    assert vault["capabilities"]["history"] == {"full": {}}
    missing = await aap.request("GET", f"/sessions/{sid}/history?type=compacted")
    assert missing.status == 404 and missing.error == "history_type_not_supported"


async def test_history_type_errors(aap: AapClient) -> None:
    sid = await aap.create()
    for query, status, code in (
        ("", 400, "invalid_history_type"),
        ("?type=everything", 400, "invalid_history_type"),
    ):
        reply = await aap.request("GET", f"/sessions/{sid}/history{query}")
        assert (reply.status, reply.error) == (status, code)
    reply = await aap.request("GET", "/sessions/sess_01ARZ3NDEKTSV4RRFFQ69G5FAV/history?type=full")
    assert (reply.status, reply.error) == (404, "session_not_found")


async def test_pagination_walks_everything_once_despite_concurrent_changes(
    start_daemon: Any, client_for: Any, workspace: Path
) -> None:
    daemon = await start_daemon(aap={"page_size": 3, "workspace_roots": [str(workspace)]})
    aap = await client_for(daemon)
    metis_session = await Api(aap.http, aap.auth()).create_session(workspace)
    existing = [await aap.create() for _ in range(10)]
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        query = f"?after={after}" if after else ""
        reply = await aap.request("GET", f"/sessions{query}")
        assert reply.status == 200
        page_ids = [s["sessionId"] for s in reply.body["sessions"]]
        assert len(page_ids) <= 3
        seen.extend(page_ids)
        pages += 1
        # concurrent activity between page fetches
        await asyncio.gather(aap.create(), aap.create())
        if pages == 2:
            assert (await aap.request("DELETE", f"/sessions/{existing[0]}")).status == 204
        after = reply.body.get("next")
        if after is None:
            break
    assert metis_session["id"] not in seen
    assert len(seen) == len(set(seen))
    assert set(existing[1:]) <= set(seen)
    assert seen[: len(existing)] == list(reversed(existing))[: len(seen[: len(existing)])]
    bad = await aap.request("GET", "/sessions?after=garbage!")
    assert bad.status == 400 and bad.error == "invalid_cursor"
    first = await aap.request("GET", "/sessions")
    single = await aap.request("GET", f"/sessions/{first.body['sessions'][0]['sessionId']}")
    assert first.body["sessions"][0] == single.body
    v1 = await aap.v1.request("GET", "/sessions")
    assert v1.body["sessions"] == [s["sessionId"] for s in first.body["sessions"]]
    assert v1.body["nextCursor"] == v1.body["next"] == first.body["next"]


async def test_aap_session_is_a_metis_session(
    daemon_and_aap: tuple[Daemon, AapClient], workspace: Path
) -> None:
    daemon, aap = daemon_and_aap
    api = Api(aap.http, aap.auth())
    sid = await aap.create()
    status, listed = await api.call("GET", "/sessions")
    [item] = [s for s in listed["sessions"] if s["id"] == sid]
    assert item["surface"] == "aap"
    status, body = await api.submit(sid, "hello from metis")
    assert status == 409 and body["error"]["code"] == "surface_mismatch"
    metis_sid = (await api.create_session(workspace))["id"]
    for method, path in (("GET", f"/sessions/{metis_sid}"), ("DELETE", f"/sessions/{metis_sid}")):
        reply = await aap.request(method, path)
        assert reply.status == 404 and reply.error == "session_not_found"
    reply = await aap.say(metis_sid, "hi")
    assert reply.status == 404 and reply.error == "session_not_found"
    # metis end → AAP turn 409; AAP DELETE = purge → metis 404
    status, _ = await api.call("DELETE", f"/sessions/{sid}")
    assert status == 200
    reply = await aap.say(sid, "still there?")
    assert reply.status == 409 and reply.error == "session_already_ended"
    assert (await aap.request("DELETE", f"/sessions/{sid}")).status == 204
    status, body = await api.call("GET", f"/sessions/{sid}")
    assert status == 404
    assert (await aap.request("GET", f"/sessions/{sid}")).status == 404
    assert (
        await daemon.core.db.fetchone("SELECT 1 FROM aap_sessions WHERE session_id=?", (sid,))
        is None
    )


async def test_suspended_permission_is_not_answerable_through_metis(
    daemon_and_aap: tuple[Daemon, AapClient],
) -> None:
    _daemon, aap = daemon_and_aap
    sid = await aap.create(tools=[{"name": "list_dir"}])
    reply = await aap.say(sid, "use server tool")
    api = Api(aap.http, aap.auth())
    status, session = await api.call("GET", f"/sessions/{sid}")
    [pending] = session["pending_confirmations"]
    url = f"/sessions/{sid}/turns/{pending['turn_id']}/confirmations/{pending['confirmation_request_id']}"
    status, body = await api.call("POST", url, {"decision": "allow"})
    assert status == 409 and body["error"]["code"] == "surface_mismatch"
    granted = await aap.turn(
        sid,
        [
            {
                "role": "tool_permission",
                "toolCallId": reply.tool_calls()[0]["toolCallId"],
                "granted": True,
            }
        ],
    )
    assert granted.status == 200
    status, session = await api.call("GET", f"/sessions/{sid}")
    assert session["pending_confirmations"] == []


async def test_metis_end_closes_pending_calls(daemon_and_aap: tuple[Daemon, AapClient]) -> None:
    _daemon, aap = daemon_and_aap
    sid = await aap.create(client_tools=[WEATHER])
    reply = await aap.say(sid, "use tool")
    [call] = reply.tool_calls()
    status, _ = await Api(aap.http, aap.auth()).call("DELETE", f"/sessions/{sid}")
    assert status == 200
    history = await aap.history(sid)
    assert history[-1] == {
        "role": "tool",
        "toolCallId": call["toolCallId"],
        "content": "Tool call cancelled",
    }
