"""Session titles against a purge: `PATCH /sessions/{id}` checks the session, then writes the
title; a purge committed between the two left the title row's foreign key to fail inside the
write (a 500). The write itself now finds the session gone: SessionNotFound, a 404."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from metis.core.errors import SessionNotFound
from metis.server import titles
from metis.server.runner import Daemon
from tests.api import Api


async def test_a_title_for_a_session_purged_meanwhile_is_not_found(
    daemon: Daemon, http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    session = await api.create_session(workspace)
    status, _ = await api.call("DELETE", f"/sessions/{session['id']}", params={"purge": "true"})
    assert status == 200
    # the PATCH handler's write, as it runs after a purge that landed behind its check
    with pytest.raises(SessionNotFound):
        await titles.set_title(daemon.core.db, session["id"], "too late")
    await titles.set_title(daemon.core.db, session["id"], None)  # clearing: nothing to clear
