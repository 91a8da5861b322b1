"""AAP inputs found by fuzzing that once got a 500 or stored what cannot be read back."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.server.runner import Daemon
from tests.aap.client import AapClient
from tests.aap.conftest import roots


async def test_a_cursor_past_sqlite_integers_is_invalid(aap: AapClient) -> None:
    for stamp in (2**63, 2**64 + 5):
        cursor = base64.urlsafe_b64encode(f"c1|{stamp}|sess_x".encode()).decode().rstrip("=")
        for client in (aap, aap.v1):
            reply = await client.request("GET", f"/sessions?after={cursor}")
            assert reply.status == 400 and reply.body["error"]["code"] == "invalid_cursor"


async def test_nan_infinity_and_repeated_keys_are_invalid_json_and_nothing_is_stored(
    aap: AapClient,
) -> None:
    """A key given twice once let its last value win: a second `trust` trusted a tool."""
    json_type = {"Content-Type": "application/json"}
    for number in (b"NaN", b"Infinity", b"1e999"):
        body = (
            b'{"agent": {"name": "metis"}, "tools": [{"name": "ct", "description": "d", '
            b'"parameters": {"type": "object", "x": ' + number + b"}}]}"
        )
        reply = await aap.request("POST", "/sessions", raw=body, headers=json_type)
        assert reply.status == 400 and reply.body["error"]["code"] == "invalid_json"
    for body, said in (
        (b'{"agent": {"name": "zzz", "name": "metis"}}', 'key "name" at line 1 column 34'),
        (
            b'{"agent": {"name": "metis", "tools": [{"name": "shell", "trust": false, '
            b'"trust": true}]}}',
            'key "trust" at line 1 column 81',
        ),
    ):
        reply = await aap.request("POST", "/sessions", raw=body, headers=json_type)
        assert reply.status == 400 and reply.body["error"] == {
            "code": "invalid_json",
            "message": f"malformed JSON: Detected duplicate {said}",
            "details": {},
        }
    reply = await aap.v1.request(
        "PUT", "/session", raw=b'{"messages": [], "messages": []}', headers=json_type
    )
    assert reply.status == 400 and reply.body["error"]["code"] == "invalid_json"
    listed = await aap.request("GET", "/sessions")
    assert listed.status == 200 and listed.body["sessions"] == []


async def test_a_value_that_should_be_an_object_says_so_without_naming_our_classes(
    aap: AapClient,
) -> None:
    for body in ({"agent": 5}, {"agent": {"name": "metis"}, "tools": [5]}):
        reply = await aap.request("POST", "/sessions", body)
        assert reply.status == 400 and reply.body["error"]["code"] == "validation_error"
        [problem] = reply.body["error"]["details"]["errors"]
        assert problem["msg"] == "Input should be an object", problem
    reply = await aap.v1.request("PUT", "/session", {"agent": 5, "messages": []})
    assert reply.body["error"]["details"]["errors"][0]["msg"] == "Input should be an object"


async def test_a_nul_in_the_workspace_option_is_an_invalid_option(aap: AapClient) -> None:
    for value in ("/tmp/\u0000", "~\u0000/x"):
        reply = await aap.request(
            "POST", "/sessions", {"agent": {"name": "metis", "options": {"workspace": value}}}
        )
        assert reply.status == 400 and reply.body["error"]["code"] == "invalid_option", value


async def test_a_workspace_name_too_long_for_the_file_system_is_an_invalid_option(
    aap: AapClient,
) -> None:
    for value in ("/" + "x" * 5000, "/tmp/" + "y" * 300):
        agent = {"name": "metis", "options": {"workspace": value}}
        reply = await aap.request("POST", "/sessions", {"agent": agent})
        assert reply.status == 400 and reply.body["error"]["code"] == "invalid_option", reply.body


async def test_a_tilde_naming_no_known_user_is_an_invalid_option(aap: AapClient) -> None:
    """`Path.expanduser` raises RuntimeError for `~user` with no such user: once a 500."""
    for value in ("~nosuchuser-metis", "~\u00a5", "~nosuchuser-metis/x"):
        agent = {"name": "metis", "options": {"workspace": value}}
        reply = await aap.request("POST", "/sessions", {"agent": agent})
        assert reply.status == 400 and reply.body["error"]["code"] == "invalid_option", value
        assert reply.body["error"]["details"]["option"] == "workspace"
        body = {"agent": agent, "messages": [{"role": "user", "content": "hi"}]}
        reply = await aap.v1.request("PUT", "/session", body)
        assert reply.status == 400 and reply.body["error"]["code"] == "invalid_option", value
        assert reply.body["error"]["details"]["option"] == "workspace"
    listed = await aap.request("GET", "/sessions")
    assert listed.status == 200 and listed.body["sessions"] == []


async def test_a_creation_whose_aap_rows_fail_leaves_nothing_behind(
    daemon_and_aap: tuple[Daemon, AapClient],
) -> None:
    """The session, its AAP row, its seed history and `session.created` are one transaction:
    when the store refuses the AAP row, none of them exists and the client gets an error."""
    daemon, aap = daemon_and_aap
    await daemon.core.db.transaction(
        lambda conn: conn.execute(
            "CREATE TRIGGER no_aap_sessions BEFORE INSERT ON aap_sessions "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    )
    body = {"agent": {"name": "metis"}, "messages": [{"role": "user", "content": "seeded"}]}
    reply = await aap.request("POST", "/sessions", body)
    assert reply.status == 500 and reply.body["error"]["code"] == "internal_error"
    await daemon.core.flush()
    for table in ("sessions", "messages", "aap_sessions"):
        assert await daemon.core.db.fetchall(f"SELECT 1 FROM {table}") == [], table
    # nothing was created, so nothing had to be purged again either
    stored = await daemon.core.db.fetchall(
        "SELECT 1 FROM events WHERE type IN ('session.created', 'session.purged')"
    )
    assert stored == []
    listed = await aap.request("GET", "/sessions")
    assert listed.status == 200 and listed.body["sessions"] == []


async def test_a_bare_session_an_older_release_left_is_discarded_at_start(
    api_key: str, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """Releases before one-transaction creation committed the core session, then its AAP row:
    a crash between the two left a session AAP cannot see and metis cannot drive. A database
    holding one (made here by creating the core session alone) gets it discarded at start."""
    first = await start_daemon(**roots(workspace))
    bare = await first.core.sessions.create(str(workspace), surface="aap")  # commit 1 only
    await first.stop()
    second = await start_daemon(**roots(workspace))
    assert await second.core.session_store.get(bare.id) is None
    assert (
        await second.core.db.fetchone("SELECT 1 FROM events WHERE session_id=?", (bare.id,)) is None
    )
