"""`GET /sessions/{id}/export`: a session as a file — Markdown to read, JSON to process — an
attachment named after the session, made of exactly what the REST API serves."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from metis.server.runner import Daemon
from tests.api import Api

ATTACH_FIELDS = {"attach_token", "attach_token_expires_at", "ws_url"}


async def _export(
    http: aiohttp.ClientSession, session_id: str, fmt: str | None = None
) -> tuple[int, str, str, str]:
    """(status, media type, Content-Disposition, body)."""
    params = {"format": fmt} if fmt else {}
    async with http.get(f"/sessions/{session_id}/export", params=params) as response:
        disposition = response.headers.get("Content-Disposition", "")
        return response.status, response.content_type, disposition, await response.text()


async def test_a_session_exports_as_markdown_or_json_made_of_what_rest_serves(
    http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    sid = (await api.create_session(workspace))["id"]
    await api.run_turn(sid, "please use server tool")
    status, media, disposition, text = await _export(http, sid)
    assert (status, media) == (200, "text/markdown"), text
    assert disposition == f'attachment; filename="{sid}.md"'
    assert text.startswith("# please use server tool\n")
    assert "## Turn 1: please use server tool" in text and "Tool call `" in text

    status, media, disposition, text = await _export(http, sid, "json")
    assert (status, media) == (200, "application/json")
    assert disposition == f'attachment; filename="{sid}.json"'
    exported = json.loads(text)
    _, shown = await api.call("GET", f"/sessions/{sid}")
    assert exported["session"] == {k: v for k, v in shown.items() if k not in ATTACH_FIELDS}
    assert exported["messages"] == (await api.messages(sid, limit=200))["messages"]
    assert exported["events"] == await api.events(sid)
    # an ended session exports too, with its end
    status, _ = await api.call("DELETE", f"/sessions/{sid}")
    assert status == 200
    status, _, _, text = await _export(http, sid, "json")
    assert status == 200 and json.loads(text)["session"]["ended_at"] is not None


async def test_an_export_of_no_session_or_in_no_known_format_is_refused(
    http: aiohttp.ClientSession, daemon: Daemon, workspace: Path
) -> None:
    status, media, _, text = await _export(http, "sess_01M8F0Y1GRTGTNQW1QF6KMN09B")
    assert (status, media) == (404, "application/json")
    assert json.loads(text)["error"]["code"] == "session_not_found"
    sid = (await Api(http).create_session(workspace))["id"]
    status, _, _, text = await _export(http, sid, "pdf")
    assert status == 400 and json.loads(text)["error"]["code"] == "validation_error"
    async with (
        aiohttp.ClientSession(daemon.base_url) as anonymous,
        anonymous.get(f"/sessions/{sid}/export") as response,
    ):
        assert response.status == 401
