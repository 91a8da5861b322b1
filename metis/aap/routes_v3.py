"""AAP v3 routes at `/aap`: translation only."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from metis.aap import sessions
from metis.aap.agents import Workspaces
from metis.aap.errors import TURN_ERRORS
from metis.aap.http import (
    cors_headers,
    json_response,
    no_content,
    parse_body,
    raw_body,
    state_of,
)
from metis.aap.stream import respond
from metis.aap.turns import check_shape, plan_turn, prepare_turn
from metis.aap.wire import CreatedResponse, HistoryQuery, SessionsQuery
from metis.aap.wire_v3 import (
    AgentResponse,
    CreateSessionRequest,
    HistoryResponse,
    MetaResponse,
    SessionInfo,
    SessionList,
    TurnRequest,
)
from metis.http.routes import RouteTable

VERSION = 3
routes = RouteTable(tag=f"aap-v{VERSION}")
_SESSION = ("session_not_found",)


@routes.route("GET", "/meta", public=True, response_model=MetaResponse)
async def meta(request: web.Request) -> web.Response:
    """The protocol version and the agents this server runs."""
    return meta_of(request, VERSION)


def meta_of(request: web.Request, version: int) -> web.Response:
    """`GET /meta` in `version`'s shapes (v1 differs in its tool schemas only)."""
    state = state_of(request)
    return json_response(
        request, {"version": version, "agents": [a.info(version) for a in state.agents.all()]}
    )


@routes.route(
    "GET",
    "/sessions",
    query_model=SessionsQuery,
    response_model=SessionList,
    errors=("invalid_cursor",),
)
async def list_sessions(request: web.Request) -> web.Response:
    """AAP sessions, newest first, with an opaque `next` cursor."""
    state = state_of(request)
    found, cursor = await sessions.page(state, request.query.get("after"))
    body: dict[str, object] = {"sessions": [sessions.info(state, s, VERSION) for s in found]}
    if cursor is not None:
        body["next"] = cursor
    return json_response(request, body)


@routes.route(
    "POST",
    "/sessions",
    status=201,
    body="required",
    request_model=CreateSessionRequest,
    response_model=CreatedResponse,
    errors=(
        "unknown_agent",
        "invalid_option",
        "invalid_tools",
        "invalid_content",
        "invalid_seed",
    ),
)
async def create_session(request: web.Request) -> web.Response:
    """Create a session (no turn runs); optional seed history and client tools."""
    state = state_of(request)
    body = parse_body(request, CreateSessionRequest)
    draft = sessions.draft_session(
        state, body.agent, raw_body(request).get("tools"), body.messages or [], VERSION
    )
    with Workspaces.provisioned(draft.workspace) as workspace:
        session = await sessions.commit_session(state, draft, workspace)
    return json_response(request, {"sessionId": session.session_id}, status=201)


@routes.route("GET", "/sessions/{session_id}", response_model=SessionInfo, errors=_SESSION)
async def get_session(request: web.Request) -> web.Response:
    """A session's agent configuration and client tools."""
    state = state_of(request)
    session = await sessions.require(state, request.match_info["session_id"])
    return json_response(request, sessions.info(state, session, VERSION))


@routes.route("DELETE", "/sessions/{session_id}", status=204, errors=_SESSION)
async def delete_session(request: web.Request) -> web.Response:
    """Delete the session and all its history (a metis purge)."""
    state = state_of(request)
    session = await sessions.require(state, request.match_info["session_id"])
    await state.app.sessions.purge(session.session_id)
    return no_content(request)


@routes.route(
    "GET",
    "/sessions/{session_id}/history",
    query_model=HistoryQuery,
    response_model=HistoryResponse,
    errors=("session_not_found", "invalid_history_type", "history_type_not_supported"),
)
async def get_history(request: web.Request) -> web.Response:
    """The session's `compacted` or `full` history."""
    state = state_of(request)
    session = await sessions.require(state, request.match_info["session_id"])
    kind = sessions.history_kind(state, session, request.query.get("type"))
    return json_response(request, {"history": await sessions.history(state, session, [kind])})


@routes.route(
    "POST",
    "/sessions/{session_id}/turns",
    body="required",
    streams=True,
    request_model=TurnRequest,
    response_model=AgentResponse,
    errors=TURN_ERRORS,
)
async def post_turn(request: web.Request) -> web.StreamResponse:
    """Send a user message or tool answers; the reply streams (delta/message) or returns (none)."""
    return await run_turn(request, parse_body(request, TurnRequest), VERSION)


async def run_turn(request: web.Request, body: Any, version: int) -> web.StreamResponse:
    """A parsed turn request (v3 `TurnRequest` or v1's) against the path's session."""
    state = state_of(request)
    check_shape(body.messages)  # part of parsing the body: before the session is looked up
    session = await sessions.require(state, request.match_info["session_id"])
    prepared = await prepare_turn(
        state, session, body.agent, raw_body(request).get("tools"), body.messages, version
    )
    plan = plan_turn(state, prepared, body.stream or "none", cors_headers(request))
    return await respond(request, state, plan)
