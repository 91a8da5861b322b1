"""Session titles: kept by the core (the `session_titles` table of the core schema, the rule in
SessionService).

- A title is one line of visible text: a line break, another control character or a bidi
  override is refused (400), and so is a blank one. A title taken from a first prompt is made
  to follow the same rule (what may not be in a title is dropped from it).
- A refused PATCH changes nothing: its title is not kept when its model change is refused.

- A single session reads its title by key, a page reads its titles at once: both by one rule.
- Against a purge: `PATCH /sessions/{id}` checks the session, then writes the title; a purge
  committed between the two left the title row's foreign key to fail inside the write (a 500).
  The write itself now finds the session gone: SessionNotFound, a 404.
- Against an upgrade: releases before the core kept titles stored them in the metis surface's
  own migration track ("session_titles"). A database of that layout opens, and its titles read
  back through the API.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.core.canonical.ids import new_session_id, new_ulid
from metis.core.errors import SessionNotFound
from metis.core.store.migrations import MIGRATIONS
from metis.server.runner import Daemon
from tests.api import Api, api_session


async def test_a_title_for_a_session_purged_meanwhile_is_not_found(
    daemon: Daemon, http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    session = await api.create_session(workspace)
    status, _ = await api.call("DELETE", f"/sessions/{session['id']}", params={"purge": "true"})
    assert status == 200
    # the PATCH handler's write, as it runs after a purge that landed behind its check
    with pytest.raises(SessionNotFound):
        await daemon.core.sessions.set_title(session["id"], "too late")
    await daemon.core.sessions.set_title(session["id"], None)  # clearing: nothing to clear


async def test_a_title_with_a_line_break_or_control_character_is_refused(
    http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    session = await api.create_session(workspace)
    for title in (
        "two\nlines",
        "tab\there",
        "bell\x07",
        "del\x7f",
        "c1\x9b2J",
        "line\u2028separator",
        "txt.exe\u202egnp",
    ):
        status, body = await api.call("PATCH", f"/sessions/{session['id']}", {"title": title})
        assert status == 400, (title, body)
        [error] = body["error"]["details"]["errors"]
        assert error["type"] == "value_error" and error["msg"].startswith("a title is one line")
    for invisible in ("   ", "\u200b", "\u00ad \ufeff\u2060"):  # zero-width, soft hyphen, BOM…
        status, body = await api.call("PATCH", f"/sessions/{session['id']}", {"title": invisible})
        assert status == 400 and "visible character" in json.dumps(body), (invisible, body)
    status, body = await api.call("PATCH", f"/sessions/{session['id']}", {"title": "Fine — ✓ 👩‍💻"})
    assert (status, body["title"]) == (200, "Fine — ✓ 👩‍💻")


async def test_a_title_taken_from_the_first_prompt_holds_no_control_characters(
    http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    session = await api.create_session(workspace)
    await api.run_turn(session["id"], "\n  \x1b[2J\x1b[31mRED\x1b[0m \u202eevil\x01  \nsecond line")
    _, shown = await api.call("GET", f"/sessions/{session['id']}")
    assert shown["title"] == "[2J[31mRED[0m evil"
    _, listed = await api.call("GET", "/sessions")
    assert [s["title"] for s in listed["sessions"]] == ["[2J[31mRED[0m evil"]


async def test_a_session_and_the_listing_show_the_same_title_by_the_same_rule(
    http: aiohttp.ClientSession, workspace: Path
) -> None:
    """GET /sessions/{id} reads one session's title by key; the listing reads a page's at once:
    no turn yet (none), the first prompt's first line, a title set, then cleared again."""
    api = Api(http)
    sid = (await api.create_session(workspace))["id"]

    async def both() -> tuple[Any, Any]:
        _, shown = await api.call("GET", f"/sessions/{sid}")
        _, listed = await api.call("GET", "/sessions")
        [row] = [s for s in listed["sessions"] if s["id"] == sid]
        return shown["title"], row["title"]

    assert await both() == (None, None)
    await api.run_turn(sid, "\n  fix the flaky test\nin the parser")
    await api.run_turn(sid, "a later prompt")
    assert await both() == ("fix the flaky test", "fix the flaky test")
    status, patched = await api.call("PATCH", f"/sessions/{sid}", {"title": "Parser work"})
    assert status == 200 and patched["title"] == "Parser work"
    assert await both() == ("Parser work", "Parser work")
    status, patched = await api.call("PATCH", f"/sessions/{sid}", {"title": None})
    assert status == 200 and patched["title"] == "fix the flaky test"
    assert await both() == ("fix the flaky test", "fix the flaky test")


async def test_a_refused_patch_leaves_the_title_as_it_was(
    http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    session = await api.create_session(workspace)
    path = f"/sessions/{session['id']}"
    status, body = await api.call("PATCH", path, {"title": "kept", "active_model": "nope:none"})
    assert status == 400 and body["error"]["code"] == "model_not_configured"
    status, _ = await api.call("DELETE", path)
    assert status == 200
    status, body = await api.call("PATCH", path, {"title": "late", "active_model": None})
    assert status == 409 and body["error"]["code"] == "session_already_ended"
    status, listed = await api.call("GET", "/sessions", params={"status": "all"})
    assert [s["title"] for s in listed["sessions"] if s["id"] == session["id"]] == [None]


def _old_layout_database(path: Path, workspace: Path) -> tuple[str, str]:
    """A database as the release before core titles left it: core schema v2, the surface's
    `session_titles` track at version 1 with its table, one titled session and one whose
    title is its first prompt's first line. Returns (titled id, untitled id)."""
    titled, untitled = new_session_id(), new_session_id()
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.executescript(
        "CREATE TABLE schema_tracks (name TEXT PRIMARY KEY, version INTEGER NOT NULL);"
        "INSERT INTO schema_tracks (name, version) VALUES ('session_titles', 1);"
        "CREATE TABLE IF NOT EXISTS session_titles (session_id TEXT PRIMARY KEY"
        "  REFERENCES sessions(id) ON DELETE CASCADE, title TEXT NOT NULL,"
        "  updated_at_us INTEGER NOT NULL);"
    )
    for session_id in (titled, untitled):
        conn.execute(
            "INSERT INTO sessions (id, workspace_path, routing_policy_version, status, "
            "created_at_us, updated_at_us) VALUES (?, ?, 'v', 'active', 1, 1)",
            (session_id, str(workspace)),
        )
    conn.execute(
        "INSERT INTO session_titles (session_id, title, updated_at_us) VALUES (?, ?, 1)",
        (titled, "Kept across the upgrade"),
    )
    content = [{"type": "text", "text": "\n  Fix the flaky test  \nthen the docs"}]
    conn.execute(
        "INSERT INTO messages (id, session_id, turn_id, role, status, content_json, "
        "metadata_json, created_at_us, schema_version) "
        "VALUES (?, ?, NULL, 'user', 'complete', ?, '{}', 1, 1)",
        (new_ulid(), untitled, json.dumps(content)),
    )
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    return titled, untitled


async def test_a_database_of_the_surface_track_layout_keeps_its_titles(
    metis_home: Path, workspace: Path, start_daemon: Callable[..., Any]
) -> None:
    titled, untitled = _old_layout_database(metis_home / "metis.db", workspace)
    daemon = await start_daemon()
    async with api_session(daemon) as http:
        api = Api(http)
        status, body = await api.call("GET", f"/sessions/{titled}")
        assert status == 200 and body["title"] == "Kept across the upgrade"
        status, body = await api.call("GET", "/sessions")
        assert status == 200
        titles = {s["id"]: s["title"] for s in body["sessions"]}
        assert titles == {titled: "Kept across the upgrade", untitled: "Fix the flaky test"}
        # the adopted table takes new titles too
        status, body = await api.call("PATCH", f"/sessions/{untitled}", {"title": "Renamed"})
        assert status == 200 and body["title"] == "Renamed"
        status, body = await api.call("GET", f"/sessions/{untitled}")
        assert body["title"] == "Renamed"
