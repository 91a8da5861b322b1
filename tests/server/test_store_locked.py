"""Another process holding the store's write lock (a user's `sqlite3` shell in a transaction):
a write is answered 503 `store_locked` with `Retry-After` instead of 500, reads go on (WAL),
and once the lock is released the same request succeeds and what it saved is there."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from metis.server.runner import Daemon
from tests.api import Api
from tests.ws_client import Ws

MESSAGE = "the session store is locked by another process; try again"


@contextmanager
def write_locked(daemon: Daemon) -> Iterator[sqlite3.Connection]:
    """The daemon's database file opened by another connection holding the write lock, as an
    open `sqlite3` shell's `BEGIN IMMEDIATE` would; rolled back on leaving."""
    other = sqlite3.connect(daemon.settings.db_path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield other
        other.execute("ROLLBACK")
    finally:
        other.close()


def assert_store_locked(status: int, headers: dict[str, str], body: object) -> None:
    assert status == 503, body
    assert headers["Retry-After"] == "1"
    assert isinstance(body, dict)
    error = body["error"]
    assert error["code"] == "store_locked" and error["message"] == MESSAGE
    assert error["details"]["retry_after_s"] == 1


async def call(
    api: Api, method: str, path: str, body: object = None
) -> tuple[int, dict[str, str], object]:
    async with api.http.request(method, path, json=body) as r:
        return r.status, dict(r.headers), await r.json()


async def test_a_write_while_another_process_holds_the_lock_is_503_and_succeeds_after(
    daemon: Daemon, api: Api, workspace: Path
) -> None:
    daemon.core.db.write_wait_s = 0.3  # the wait before giving up (5 s in the daemon)
    sid = (await api.create_session(workspace))["id"]
    with write_locked(daemon):
        assert_store_locked(
            *await call(api, "POST", "/sessions", {"workspace_path": str(workspace)})
        )
        assert_store_locked(*await call(api, "PATCH", f"/sessions/{sid}", {"title": "kept"}))
        # reads go on under WAL while the other process writes
        status, listed = await api.call("GET", "/sessions")
        assert status == 200 and [s["id"] for s in listed["sessions"]] == [sid]
        assert (await api.call("GET", f"/sessions/{sid}"))[0] == 200
        assert (await api.call("GET", "/health"))[0] == 200
    # released: the very same requests succeed, with no restart, and what they saved is there
    created = await api.create_session(workspace)
    status, patched = await api.call("PATCH", f"/sessions/{sid}", {"title": "kept"})
    assert status == 200, patched
    status, listed = await api.call("GET", "/sessions")
    assert {s["id"] for s in listed["sessions"]} == {sid, created["id"]}
    assert (await api.call("GET", f"/sessions/{sid}"))[1]["title"] == "kept"
    with sqlite3.connect(daemon.settings.db_path) as db:  # on disk, not only in memory
        assert db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 2


async def test_a_turn_refused_while_the_store_is_locked_holds_nothing_and_runs_after(
    daemon: Daemon, api: Api, workspace: Path
) -> None:
    daemon.core.db.write_wait_s = 0.3
    sid = (await api.create_session(workspace))["id"]
    with write_locked(daemon):
        turn = {"content": [{"type": "text", "text": "hello"}]}
        assert_store_locked(*await call(api, "POST", f"/sessions/{sid}/turns", turn))
    # the refused turn took no slot: the next one is accepted and runs to its end
    _, ended = await api.run_turn(sid, "hello")
    assert ended["type"] == "turn.completed", ended
    texts = [m["content"][0]["text"] for m in (await api.messages(sid))["messages"]]
    assert texts[0] == "hello" and len(texts) == 2  # one user message: the refused one left none


async def test_a_websocket_subscribes_and_stays_open_while_the_store_is_locked(
    daemon: Daemon, api: Api, workspace: Path
) -> None:
    """A socket's commands only read (subscribe, its snapshot) or act in memory (cancel, whose
    failures are ignored by contract): none is dropped by the lock, and the socket carries the
    next turn once it is released."""
    daemon.core.db.write_wait_s = 0.3
    sid = (await api.create_session(workspace))["id"]
    with write_locked(daemon):
        ws, _ = await Ws.subscribed(api, sid, snapshot=True)
        try:
            assert (await ws.recv())["type"] == "snapshot"
            await ws.send({"type": "cancel", "turn_id": "01M7YA76RDGJRJS6TX6XK99B3Q"})
            turn = {"content": [{"type": "text", "text": "hello"}]}
            assert_store_locked(*await call(api, "POST", f"/sessions/{sid}/turns", turn))
            await ws.send({"type": "ping", "nonce": "n1"})
            assert await ws.recv() == {"type": "pong", "nonce": "n1"}
        except BaseException:
            await ws.close()
            raise
    try:
        accepted, _ = await api.run_turn(sid, "hello")
        events = await ws.turn(accepted["turn_id"])
        assert events[-1]["type"] == "turn.completed"
    finally:
        await ws.close()
