"""A purge leaves no trace of the session's text in the store's files, through the real daemon:
neither the database file nor its write-ahead log holds the purged prompts or replies."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from metis.server.runner import Daemon
from tests.api import Api

SECRET = "purge-me-7f3a9c"
KEPT = "keep-me-b41d02"


def holding(home: Path, text: str) -> list[str]:
    """The store's files (database, WAL) whose bytes contain `text`."""
    files = sorted(home.glob("metis.db*"))
    assert any(f.name == "metis.db" for f in files), files
    return [f.name for f in files if text.encode() in f.read_bytes()]


async def test_a_purged_sessions_text_is_gone_from_the_database_and_its_wal(
    daemon: Daemon, workspace: Path, api_of: Callable[[Daemon], Api], metis_home: Path
) -> None:
    api = api_of(daemon)
    purged = (await api.create_session(workspace))["id"]
    kept = (await api.create_session(workspace))["id"]
    for n in range(3):  # the two sessions' rows share pages: the kept one's stay, rewritten
        await api.run_turn(purged, f"{SECRET} {n} " + "x" * 500)
        await api.run_turn(kept, f"{KEPT} {n}")
    assert holding(metis_home, SECRET)  # the text was on disk
    status, body = await api.call("DELETE", f"/sessions/{purged}", params={"purge": "true"})
    assert status == 200 and body["purged"] is True, body
    assert holding(metis_home, SECRET) == []
    assert holding(metis_home, KEPT)  # the other session is untouched
    status, _ = await api.call("GET", f"/sessions/{kept}/messages")
    assert status == 200
