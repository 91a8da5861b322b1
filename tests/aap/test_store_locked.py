"""AAP while another process holds the store's write lock: a write is 503 `store_locked` in
AAP's envelope with `Retry-After` (and the CORS headers), reads go on, and the same request
succeeds once the lock is released."""

from __future__ import annotations

from metis.server.runner import Daemon
from tests.aap.client import AapClient, Reply
from tests.server.test_store_locked import MESSAGE, write_locked

HELLO = [{"role": "user", "content": "hello"}]


def assert_store_locked(reply: Reply) -> None:
    assert reply.status == 503, reply.body
    assert reply.headers["Retry-After"] == "1"
    assert reply.error == "store_locked" and reply.body["error"]["message"] == MESSAGE


async def test_an_aap_write_while_the_store_is_locked_is_503_and_succeeds_after(
    daemon_and_aap: tuple[Daemon, AapClient],
) -> None:
    daemon, aap = daemon_and_aap
    daemon.core.db.write_wait_s = 0.3
    sid = await aap.create()
    create = {"agent": {"name": "metis", "options": {"workspace": aap.workspace}}}
    with write_locked(daemon):
        assert_store_locked(await aap.request("POST", "/sessions", create))
        assert_store_locked(await aap.turn(sid, HELLO))
        assert_store_locked(await aap.v1.request("DELETE", f"/session/{sid}"))
        listed = await aap.request("GET", "/sessions")  # reads go on
        assert listed.status == 200
        assert [s["sessionId"] for s in listed.body["sessions"]] == [sid]
        assert (await aap.request("GET", f"/sessions/{sid}/history?type=full")).status == 200
    created = await aap.request("POST", "/sessions", create)
    assert created.status == 201, created.body
    reply = await aap.turn(sid, HELLO)
    assert reply.status == 200 and reply.stop == "end_turn", reply.body
    listed = await aap.request("GET", "/sessions")
    assert {s["sessionId"] for s in listed.body["sessions"]} == {sid, created.body["sessionId"]}
    history = (await aap.request("GET", f"/sessions/{sid}/history?type=full")).body["history"]
    # the one user message is the accepted turn's: the refused one left nothing
    assert [m["role"] for m in history["full"]] == ["user", "assistant"]
