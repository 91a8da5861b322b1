"""The AAP façade's sessions obey core's protected-directory rule: an AAP root above `/etc`
does not make `/etc` usable; a root naming the directory itself does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.api import Api


async def _workspace_of(aap: Any, value: str) -> tuple[int, Any]:
    reply = await aap.request(
        "POST", "/sessions", {"agent": {"name": "metis", "options": {"workspace": value}}}
    )
    return reply.status, reply.body


async def test_aap_refuses_a_protected_directory_under_a_wider_root(
    start_daemon: Any, client_for: Any
) -> None:
    daemon = await start_daemon(aap={"workspace_roots": ["/"]})
    aap = await client_for(daemon)
    for value in ("/etc", "/usr", str(Path.home())):
        status, body = await _workspace_of(aap, value)
        assert status == 400 and body["error"]["code"] == "invalid_option", (value, body)
        assert body["error"]["details"]["option"] == "workspace", body
        assert body["error"]["details"]["reason"] == "protected_directory", body
    # `/` itself is named by the root: accepted
    sid = await aap.create(options={"workspace": "/"})
    _status, row = await Api(aap.http, aap.auth()).call("GET", f"/sessions/{sid}")
    assert row["workspace_path"] == "/"


async def test_aap_accepts_a_protected_directory_listed_as_a_root(
    start_daemon: Any, client_for: Any
) -> None:
    daemon = await start_daemon(aap={"workspace_roots": ["/etc"]})
    aap = await client_for(daemon)
    sid = await aap.create(options={"workspace": "/etc"})
    _status, row = await Api(aap.http, aap.auth()).call("GET", f"/sessions/{sid}")
    assert row["workspace_path"] == str(Path("/etc").resolve())
