"""`GET /sessions/{id}/export`: a session as a file to keep, Markdown to read or JSON to
process — what `metis sessions export`, the terminal app's `/export` and the dashboard's
Download write. The document is rendered here, once, from the same shapes the REST API returns
(`metis.wire.export`), so every client's file is the same."""

from typing import Any, Literal

from aiohttp import web
from pydantic import Field

from metis.core.application import Application
from metis.core.datamodel import DataModel
from metis.server.http import RouteTable, parse_query
from metis.server.routes.sessions import render_session, session_annotations
from metis.server.state import STATE_KEY
from metis.wire.export import FORMATS, render

routes = RouteTable()
EVENTS_PER_READ = 1000


class ExportQuery(DataModel):
    format: Literal["md", "json"] = Field(
        default="md", description="md: Markdown to read; json: the session, messages and events"
    )


async def _all_events(app: Application, session_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after_seq, more = 0, True
    while more:
        page, more = await app.history.events_page(
            session_id, after_seq=after_seq, limit=EVENTS_PER_READ
        )
        events.extend(e.wire() for e in page)
        if not page:
            break
        after_seq = page[-1].seq
    return events


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
    data = {
        "session": {**render_session(view), **await session_annotations(app, view)},
        "messages": [m.wire() for m in await app.history.all_messages(session_id)],
        "events": await _all_events(app, session_id),
    }
    return web.Response(
        text=render(data, query.format),
        content_type=FORMATS[query.format],
        charset="utf-8",
        headers={"Content-Disposition": f'attachment; filename="{session_id}.{query.format}"'},
    )
