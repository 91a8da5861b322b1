"""`GET /sessions/{id}/export`: a session as a file to keep, Markdown to read or JSON to
process — what `metis sessions export`, the terminal app's `/export` and the dashboard's
Download write. The document is rendered here, once, from the same shapes the REST API returns
(`metis.wire.export`), so every client's file is the same.

A long session's document is megabytes of text: it is put together in a worker thread, so the
event loop keeps serving the live streams meanwhile instead of pausing for it."""

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from aiohttp import web
from pydantic import Field

from metis.core.application import Application
from metis.core.canonical.messages import Message
from metis.core.datamodel import DataModel
from metis.core.events.envelope import Event
from metis.server.http import RouteTable, parse_query
from metis.server.routes.sessions import render_session, session_annotations
from metis.server.state import STATE_KEY
from metis.wire.export import FORMATS, render

routes = RouteTable()


class ExportQuery(DataModel):
    format: Literal["md", "json"] = Field(
        default="md", description="md: Markdown to read; json: the session, messages and events"
    )


def _document(
    session: dict[str, Any], messages: Sequence[Message], events: Sequence[Event], fmt: str
) -> bytes:
    """The file, UTF-8 (run in a worker thread: see the module's docstring)."""
    data = {
        "session": session,
        "messages": [m.wire() for m in messages],
        "events": [e.wire() for e in events],
    }
    return render(data, fmt).encode()


@routes.route(
    "GET",
    "/sessions/{session_id}/export",
    query_model=ExportQuery,
    documents=tuple(FORMATS.values()),
    errors=("session_not_found",),
)
async def export_session(request: web.Request) -> web.Response:
    """The session as a file (an attachment named after it), ended or not."""
    query = parse_query(request, ExportQuery)
    app: Application = request.app[STATE_KEY].app
    session_id = request.match_info["session_id"]
    view = await app.sessions.get(session_id)
    await app.flush()  # every event emitted so far is in the file
    session = {**render_session(view), **await session_annotations(app, view)}
    messages = await app.history.all_messages(session_id)
    events = await app.history.all_events(session_id)
    document = await asyncio.to_thread(_document, session, messages, events, query.format)
    return web.Response(
        body=document,
        content_type=FORMATS[query.format],
        charset="utf-8",
        headers={"Content-Disposition": f'attachment; filename="{session_id}.{query.format}"'},
    )
