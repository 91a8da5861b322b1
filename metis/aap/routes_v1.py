"""AAP v1 routes at `/aap/v1`: the same sessions in the legacy shapes, a thin adapter over the
v3 handlers (`metis/aap/routes_v3.py`) wherever the v1 wire allows.

Differences from v3: tool schemas are `inputSchema`; `PUT /session` creates and runs the first
turn; `GET /session/:id` carries both histories inline; `GET /sessions` lists ids only and sends
the cursor as both `nextCursor` and `next` (the two v1 documents disagree on the name).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from metis.aap import routes_v3, sessions
from metis.aap.agents import Workspaces
from metis.aap.errors import TURN_ERRORS, AapError, validation_error
from metis.aap.http import (
    cors_headers,
    json_response,
    parse_body,
    raw_body,
    state_of,
)
from metis.aap.stream import respond
from metis.aap.turns import PreparedTurn, parse_turn_messages, plan_turn
from metis.aap.wire import AgentResponse, SessionsQuery, UserMessage
from metis.aap.wire_v1 import (
    CreateRunResponse,
    CreateSessionRequest,
    MetaResponse,
    SessionList,
    SessionResponse,
    TurnRequest,
)
from metis.http.routes import RouteTable

VERSION = 1
routes = RouteTable(tag=f"aap-v{VERSION}")
_SESSION = ("session_not_found",)


def _check_v1_tools(body: dict[str, Any]) -> None:
    """v1 names the schema `inputSchema`; a v3-style `parameters` is pointed at the right name."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and "parameters" in tool and "inputSchema" not in tool:
            raise validation_error(
                [
                    {
                        "loc": ["body", "tools", i, "inputSchema"],
                        "msg": "v1 tool specs name the schema `inputSchema`, not `parameters`",
                    }
                ]
            )


def _body(request: web.Request, model: Any) -> Any:
    _check_v1_tools(raw_body(request))
    return parse_body(request, model)


@routes.route("GET", "/meta", public=True, response_model=MetaResponse)
async def meta(request: web.Request) -> web.Response:
    """The protocol version (1) and the agents, with `inputSchema` tool schemas."""
    return routes_v3.meta_of(request, VERSION)


@routes.route(
    "GET",
    "/sessions",
    query_model=SessionsQuery,
    response_model=SessionList,
    errors=("invalid_cursor",),
)
async def list_sessions(request: web.Request) -> web.Response:
    """AAP session ids, newest first."""
    state = state_of(request)
    found, cursor = await sessions.page(state, request.query.get("after"))
    body: dict[str, Any] = {"sessions": [s.session_id for s in found]}
    if cursor is not None:
        body["nextCursor"] = cursor
        body["next"] = cursor
    return json_response(request, body)


@routes.route(
    "PUT",
    "/session",
    status=201,
    body="required",
    streams=True,
    request_model=CreateSessionRequest,
    response_model=CreateRunResponse,
    errors=(
        "unknown_agent",
        "invalid_option",
        "invalid_tools",
        "invalid_content",
        "invalid_seed",
        "routing_failed",
    ),
)
async def create_and_run(request: web.Request) -> web.StreamResponse:
    """Create a session from a history whose last message is the first turn's user message."""
    state = state_of(request)
    body = _body(request, CreateSessionRequest)
    if not body.messages or not isinstance(body.messages[-1], UserMessage):
        raise AapError(
            "invalid_seed",
            "the last message must be a user message",
            {"index": len(body.messages) - 1},
        )
    raw_tools = raw_body(request).get("tools")
    draft = sessions.draft_session(state, body.agent, raw_tools, body.messages[:-1], VERSION)
    # The first turn's content is checked before anything is written (a new session has no
    # overrides and nothing pending).
    first = parse_turn_messages([body.messages[-1]], state.settings.max_image_bytes)
    with Workspaces.provisioned(draft.workspace) as workspace:
        session = await sessions.commit_session(state, draft, workspace)
        plan = plan_turn(
            state,
            PreparedTurn(session, False, first),
            body.stream or "none",
            cors_headers(request),
            session_start=session.session_id,
            status_json=201,
        )
        try:
            return await respond(request, state, plan)
        except Exception:
            # Nothing was streamed: a refused first turn leaves no session behind (nor, as
            # the block fails, a scratch directory created for it).
            await state.app.sessions.purge(session.session_id)
            raise


@routes.route("GET", "/session/{session_id}", response_model=SessionResponse, errors=_SESSION)
async def get_session(request: web.Request) -> web.Response:
    """The session with its declared histories inline."""
    state = state_of(request)
    session = await sessions.require(state, request.match_info["session_id"])
    history = await sessions.history(state, session, sessions.declared_history(state, session))
    return json_response(request, {**sessions.info(state, session, VERSION), "history": history})


@routes.route(
    "POST",
    "/session/{session_id}",
    body="required",
    streams=True,
    request_model=TurnRequest,
    response_model=AgentResponse,
    errors=TURN_ERRORS,
)
async def post_turn(request: web.Request) -> web.StreamResponse:
    """Send a user message or tool answers to an existing session."""
    return await routes_v3.run_turn(request, _body(request, TurnRequest), VERSION)


# the v3 handler as is: the same path parameter, no body, an empty 204
routes.route("DELETE", "/session/{session_id}", status=204, errors=_SESSION)(
    routes_v3.delete_session
)
