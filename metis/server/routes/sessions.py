"""Sessions, messages and events over REST."""

import base64
import json
from typing import Any, Literal, TypeVar

from aiohttp import hdrs, web
from pydantic import ConfigDict, Field, ValidationError, field_validator
from pydantic.config import JsonDict

from metis.core.application import (
    SEARCH_CHARS,
    TITLE_CHARS,
    Application,
    SearchMatch,
    SessionView,
    title_problem,
)
from metis.core.canonical.ids import ULID_CHARS, is_ulid
from metis.core.canonical.money import decimal_str
from metis.core.canonical.times import format_us, now_us
from metis.core.datamodel import DataModel
from metis.core.errors import CursorNotFound
from metis.core.events.catalog import PERSISTED
from metis.http.openapi import from_setting
from metis.http.responses import json_head
from metis.server.errors import ApiError
from metis.server.http import (
    RouteTable,
    json_response,
    page_limit,
    parse_query,
    read_body,
    validation_error,
)
from metis.server.state import STATE_KEY

routes = RouteTable()
_SESSION_ERRORS = ("session_not_found",)
# Declared shapes of query values the handlers check themselves (documentation only: the
# handlers' own checks and messages stand).
_ULID: JsonDict = {"pattern": f"^{ULID_CHARS}$"}
_CURSOR: JsonDict = {"pattern": "^[A-Za-z0-9_-]+$", "description": "a next_cursor of this server"}
_EVENT_TYPE = "|".join(sorted(PERSISTED)).replace(".", "\\.")
_EVENT_TYPES: JsonDict = {
    "pattern": f"^,*(?:{_EVENT_TYPE})(?:,+(?:{_EVENT_TYPE}))*,*$",
    "description": "comma-separated persisted event types",
}


# ---- wire models -----------------------------------------------------------------------------


class CreateSessionRequest(DataModel):
    model_config = ConfigDict(extra="forbid")

    # absolute, or from a home directory (`~`, `~user`); it must be a directory
    workspace_path: str = Field(strict=True, json_schema_extra={"pattern": "^[/~]"})
    initial_active_model: str | None = Field(default=None, strict=True)


class PatchSessionRequest(DataModel):
    """Either field or both; an absent field is left as it is (`null` clears it)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    active_model: str | None = Field(default=None, strict=True)
    title: str | None = Field(default=None, strict=True, min_length=1, max_length=TITLE_CHARS)

    @field_validator("title")
    @classmethod
    def _one_line(cls, title: str | None) -> str | None:
        problem = title_problem(title) if title is not None else None
        if problem is not None:
            raise ValueError(problem)
        return title


class PendingSwap(DataModel):
    sticky_model: str | None
    until_turn: str | None


class SessionListItem(DataModel):
    id: str
    surface: Literal["metis", "aap"]
    workspace_path: str
    active_model: str | None
    sticky_model: str | None
    created_at: str
    updated_at: str
    ended_at: str | None
    turn_count: int
    cost_so_far_usd: str
    is_worker: bool
    parent_session_id: str | None
    current_turn_id: str | None


class Session(SessionListItem):
    pending_swap: PendingSwap | None
    routing_policy_version: str
    current_turn_status: Literal["in_flight", "cancelling"] | None
    pending_confirmations: list[dict[str, Any]]


class InstructionsInUse(DataModel):
    """The project instruction file (AGENTS.md, else CLAUDE.md) the session's turns use."""

    file: str
    sha256: str
    truncated: bool


class SessionWithAttach(Session):
    title: str | None  # set with PATCH, else the first prompt's first line
    instructions: InstructionsInUse | None
    attach_token: str | None
    attach_token_expires_at: str | None
    ws_url: str | None


class SearchMatchItem(DataModel):
    """Where a session found by `q` says the words: its title, a prompt or a reply."""

    where: Literal["title", "user", "assistant"]
    excerpt: str = Field(description="the words around the first place it says one, on one line")
    message_id: str | None = Field(description="the prompt's or reply's id; null for the title")


class SessionSummary(SessionListItem):
    status: Literal["active", "ended"]
    pending_confirmation_count: int = Field(
        description="the tool calls of the session waiting for someone to allow or deny them"
    )
    title: str | None  # set with PATCH, else the first prompt's first line; None before it
    match: SearchMatchItem | None = Field(
        default=None,
        description="with `q` only: where the session says the words; null when its id matched",
    )


class SessionList(DataModel):
    sessions: list[SessionSummary]
    next_cursor: str | None


class ModelChangeResponse(DataModel):
    id: str
    active_model: str | None
    swap_queued: bool
    swap_queued_until_turn: str | None
    title: str | None = None  # present when the PATCH set it


class EndResponse(DataModel):
    id: str
    ended_at: str | None
    purged: bool | None = None
    deleted: dict[str, int] | None = None


class ListQuery(DataModel):
    limit: int | None = Field(
        default=None, ge=1, json_schema_extra=from_setting(maximum="pages.sessions")
    )
    cursor: str | None = Field(default=None, json_schema_extra=_CURSOR)
    # as in POST /sessions: absolute, or from a home directory
    workspace_path: str | None = Field(default=None, json_schema_extra={"pattern": "^[/~]"})
    surface: Literal["metis", "aap"] | None = None
    status: Literal["active", "ended", "all"] = "all"
    q: str | None = Field(
        default=None,
        max_length=SEARCH_CHARS,
        description=(
            "sessions whose conversation (title, prompts, replies) holds every word, or whose "
            "id starts so"
        ),
    )


_LIST_FILTERS = ("workspace_path", "surface", "status", "q")


class DeleteQuery(DataModel):
    purge: bool = False


class MessagesQuery(DataModel):
    before: str | None = Field(
        default=None, description="a message id; not with after", json_schema_extra=_ULID
    )
    after: str | None = Field(
        default=None, description="a message id; not with before", json_schema_extra=_ULID
    )
    limit: int | None = Field(
        default=None, ge=1, json_schema_extra=from_setting(maximum="pages.messages")
    )


class EventsQuery(DataModel):
    event_types: str | None = Field(default=None, json_schema_extra=_EVENT_TYPES)
    since: str | None = None  # an event id
    until: str | None = None
    limit: int | None = Field(
        default=None, ge=1, json_schema_extra=from_setting(maximum="pages.events")
    )
    cursor: str | None = Field(default=None, json_schema_extra=_CURSOR)


_EVENTS_FILTERS = ("event_types", "until")


Q = TypeVar("Q", ListQuery, EventsQuery)


class MessagesPage(DataModel):
    messages: list[dict[str, Any]]
    has_more_before: bool
    has_more_after: bool


class EventsPage(DataModel):
    events: list[dict[str, Any]]
    next_cursor: str | None


# ---- rendering -------------------------------------------------------------------------------


def list_item(view: SessionView) -> dict[str, Any]:
    row = view.row
    return {
        "id": row.id,
        "surface": row.surface,
        "workspace_path": row.workspace_path,
        "active_model": view.active_model,
        "sticky_model": row.active_model,
        "created_at": format_us(row.created_at_us),
        "updated_at": format_us(row.updated_at_us),
        "ended_at": format_us(row.ended_at_us),
        "turn_count": row.turn_count,
        "cost_so_far_usd": decimal_str(view.cost_so_far_usd),
        "is_worker": False,
        "parent_session_id": None,
        "current_turn_id": view.current_turn_id,
    }


def render_session(view: SessionView) -> dict[str, Any]:
    """The Session object (also the WebSocket snapshot's `session`)."""
    return {
        **list_item(view),
        "pending_swap": view.pending_swap,
        "routing_policy_version": view.row.routing_policy_version,
        "current_turn_status": view.current_turn_status,
        "pending_confirmations": view.pending_confirmations,
    }


def _attach_fields(request: web.Request, view: SessionView) -> dict[str, Any]:
    """A fresh attach token; one a browser session is given is remembered with it, so that
    its logout closes the socket the token opens."""
    state = request.app[STATE_KEY]
    if view.ended or state.app.sessions.is_ending(view.id):
        return {"attach_token": None, "attach_token_expires_at": None, "ws_url": None}
    token, ttl_s = state.app.streams.mint_token(view.id)
    login = state.auth.login_of(request) if state.auth is not None else None
    if login is not None and state.auth is not None:
        state.auth.sockets.minted(token, login, ttl_s)
    return {
        "attach_token": token,
        "attach_token_expires_at": format_us(now_us() + int(ttl_s * 1_000_000)),
        "ws_url": f"ws://{state.base_host}:{state.port}/sessions/{view.id}/stream?attach={token}",
    }


def encode_cursor(position: str, filters: dict[str, Any]) -> str:
    """A `next_cursor`: the place a page ended and the filters of the listing it belongs to,
    so that a next page asked for with the cursor alone continues the same listing."""
    text = json.dumps([position, filters], separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def continued(request: web.Request, query: Q, filters: tuple[str, ...]) -> tuple[Q, str | None]:
    """The query in force and the place to continue from. With a cursor, its listing's filters
    apply; a filter the request repeats must say the same (400 `cursor_invalid` otherwise: the
    pages of two listings cannot be mixed)."""
    if query.cursor is None:
        return query, None
    position, carried = _decode_cursor(query.cursor)
    for name in filters:
        if name in request.query and getattr(query, name) != carried.get(name):
            raise validation_error(
                [
                    {
                        "loc": ["query", name],
                        "msg": "the cursor continues a listing with another value of this filter",
                        "type": "cursor_invalid",
                    }
                ]
            )
    if not set(carried) <= set(filters):
        raise _cursor_error()
    try:
        merged = type(query).model_validate({**query.model_dump(exclude=set(filters)), **carried})
    except ValidationError:
        raise _cursor_error() from None
    return merged, position


def _decode_cursor(raw: str) -> tuple[str, dict[str, Any]]:
    try:
        value = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode())
    except (ValueError, UnicodeDecodeError):
        value = None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], str)
        or not is_ulid(value[0].removeprefix("sess_"))
        or not isinstance(value[1], dict)
    ):
        raise _cursor_error()
    return value[0], value[1]


def _cursor_error() -> ApiError:
    return validation_error(
        [{"loc": ["query", "cursor"], "msg": "cursor is not valid", "type": "cursor_invalid"}]
    )


# ---- handlers --------------------------------------------------------------------------------


def _app(request: web.Request) -> Application:
    return request.app[STATE_KEY].app


@routes.route(
    "POST",
    "/sessions",
    status=201,
    body="required",
    request_model=CreateSessionRequest,
    response_model=Session,
    errors=("workspace_not_found", "invalid_workspace", "model_not_configured"),
)
async def create_session(request: web.Request) -> web.Response:
    """Create a session over a workspace directory."""
    body = await read_body(request, CreateSessionRequest)
    assert body is not None
    view = await _app(request).sessions.create(body.workspace_path, body.initial_active_model)
    return json_response(
        render_session(view), status=201, headers={"Location": f"/sessions/{view.id}"}
    )


def _match_item(found: SearchMatch | None) -> dict[str, Any] | None:
    """A search result's `match` as `GET /sessions` returns it."""
    if found is None:
        return None
    return {"where": found.where, "excerpt": found.excerpt, "message_id": found.message_id}


@routes.route(
    "GET",
    "/sessions",
    query_model=ListQuery,
    response_model=SessionList,
    errors=("invalid_workspace",),
)
async def list_sessions(request: web.Request) -> web.Response:
    """Sessions, newest first, with cursor pagination and filters."""
    query, before = continued(request, parse_query(request, ListQuery), _LIST_FILTERS)
    state = request.app[STATE_KEY]
    limit = page_limit(query.limit, state.settings.pages.sessions)
    service = state.app.sessions
    # a cursor is a place in the id order, not a row: paging goes on past a session purged
    # since the cursor was issued
    listed, more = await service.list(
        limit=limit,
        before_id=before,
        workspace_path=query.workspace_path,
        surface=query.surface,
        status=None if query.status == "all" else query.status,
        text=query.q,
    )
    next_cursor = (
        encode_cursor(listed[-1].view.id, query.model_dump(include=set(_LIST_FILTERS)))
        if more and listed
        else None
    )
    items = []
    for entry in listed:
        item = {
            **list_item(entry.view),
            "status": "ended" if entry.view.ended else "active",
            "pending_confirmation_count": len(entry.view.pending_confirmations),
            "title": entry.title,
        }
        if query.q is not None:
            item["match"] = _match_item(entry.match)
        items.append(item)
    return json_response({"sessions": items, "next_cursor": next_cursor})


@routes.route(
    "GET", "/sessions/{session_id}", response_model=SessionWithAttach, errors=_SESSION_ERRORS
)
async def get_session(request: web.Request) -> web.Response:
    """A session with a fresh single-use attach token for its WebSocket stream."""
    state = request.app[STATE_KEY]
    view = await state.app.sessions.get(request.match_info["session_id"])
    if request.method == hdrs.METH_HEAD:
        # a token minted for a HEAD is never seen, yet evicts an outstanding one (the
        # per-session cap): the same status and media type, nothing minted
        return json_head()
    return json_response(
        {
            **render_session(view),
            **await session_annotations(state.app, view),
            **_attach_fields(request, view),
        }
    )


async def session_annotations(app: Application, view: SessionView) -> dict[str, Any]:
    """What a single session's view shows beyond its row: its title and the project
    instruction file in use. GET /sessions/{id} and the WebSocket snapshot share it."""
    title = await app.sessions.title(view.id)
    instructions = await app.history.project_instructions(view.id, view.row.workspace_path)
    return {"title": title, "instructions": instructions}


@routes.route(
    "PATCH",
    "/sessions/{session_id}",
    body="required",
    request_model=PatchSessionRequest,
    response_model=ModelChangeResponse,
    errors=("session_not_found", "session_already_ended", "model_not_configured"),
)
async def patch_session(request: web.Request) -> web.Response:
    """Set or clear the sticky model (queued behind a running turn) and/or the title."""
    body = await read_body(request, PatchSessionRequest)
    assert body is not None
    state = request.app[STATE_KEY]
    app = state.app
    session_id = request.match_info["session_id"]
    if not body.model_fields_set:
        raise validation_error(
            [{"loc": ["body"], "msg": "set active_model or title", "type": "missing"}]
        )
    # the model change first: it is the part that can be refused (an ended session, a model
    # not configured), and a refused PATCH changes nothing
    if "active_model" in body.model_fields_set:
        change = await app.sessions.set_active_model(session_id, body.active_model)
    else:
        change = await app.sessions.model_state(session_id)
    answer = {
        "id": change.id,
        "active_model": change.active_model,
        "swap_queued": change.swap_queued,
        "swap_queued_until_turn": change.swap_queued_until_turn,
    }
    if "title" in body.model_fields_set:
        await app.sessions.set_title(session_id, body.title)
        answer["title"] = await app.sessions.title(session_id)
    return json_response(answer)


@routes.route(
    "DELETE",
    "/sessions/{session_id}",
    query_model=DeleteQuery,
    response_model=EndResponse,
    errors=("session_not_found", "session_already_ended"),
)
async def delete_session(request: web.Request) -> web.Response:
    """End the session (data kept), or purge it with `?purge=true`."""
    query = parse_query(request, DeleteQuery)
    service = _app(request).sessions
    session_id = request.match_info["session_id"]
    if query.purge:
        result = await service.purge(session_id)
        return json_response(
            {
                "id": result.id,
                "purged": True,
                "ended_at": format_us(result.ended_at_us),
                "deleted": {"messages": result.messages_deleted, "events": result.events_deleted},
            }
        )
    view = await service.end(session_id)
    return json_response({"id": view.id, "ended_at": format_us(view.row.ended_at_us)})


def _ulid_param(value: str | None, name: str) -> str | None:
    if value is not None and not is_ulid(value):
        raise validation_error([{"loc": ["query", name], "msg": "must be a ULID", "type": "ulid"}])
    return value


@routes.route(
    "GET",
    "/sessions/{session_id}/messages",
    query_model=MessagesQuery,
    response_model=MessagesPage,
    errors=_SESSION_ERRORS,
)
async def list_messages(request: web.Request) -> web.Response:
    """Committed messages in conversation order, paged by message id."""
    query = parse_query(request, MessagesQuery)
    limit = page_limit(query.limit, _app(request).settings.pages.messages)
    before, after = _ulid_param(query.before, "before"), _ulid_param(query.after, "after")
    if before is not None and after is not None:
        raise validation_error(
            [{"loc": ["query", "before"], "msg": "use either before or after", "type": "exclusive"}]
        )
    app = _app(request)
    await app.sessions.require(request.match_info["session_id"])
    page = await app.history.messages_page(
        request.match_info["session_id"], before=before, after=after, limit=limit
    )
    return json_response(
        {
            "messages": [m.wire() for m in page.messages],
            "has_more_before": page.has_more_before,
            "has_more_after": page.has_more_after,
        }
    )


@routes.route(
    "GET",
    "/sessions/{session_id}/events",
    query_model=EventsQuery,
    response_model=EventsPage,
    errors=_SESSION_ERRORS,
)
async def list_events(request: web.Request) -> web.Response:
    """Persisted events in seq order (read-your-writes: pending events are flushed first)."""
    query, cursor = continued(request, parse_query(request, EventsQuery), _EVENTS_FILTERS)
    limit = page_limit(query.limit, _app(request).settings.pages.events)
    types = None
    if query.event_types is not None:
        types = [t for t in query.event_types.split(",") if t]
        unknown = [t for t in types if t not in PERSISTED]
        if unknown or not types:
            raise validation_error(
                [
                    {
                        "loc": ["query", "event_types"],
                        "msg": f"unknown event types: {', '.join(unknown)}"
                        if unknown
                        else "no event type named (leave event_types out for every type)",
                        "type": "enum",
                    }
                ]
            )
    app = _app(request)
    session_id = request.match_info["session_id"]
    await app.sessions.require(session_id)
    await app.flush()
    after_seq, until_seq = 0, None
    if cursor is not None:
        after_seq = await _seq_of(app, session_id, cursor, "cursor")
    elif query.since is not None:
        after_seq = await _seq_of(app, session_id, query.since, "since")
    if query.until is not None:
        until_seq = await _seq_of(app, session_id, query.until, "until")
    events, more = await app.history.events_page(
        session_id, after_seq=after_seq, until_seq=until_seq, types=types, limit=limit
    )
    next_cursor = (
        encode_cursor(events[-1].id, query.model_dump(include=set(_EVENTS_FILTERS)))
        if more and events
        else None
    )
    return json_response({"events": [e.wire() for e in events], "next_cursor": next_cursor})


async def _seq_of(app: Application, session_id: str, event_id: str, name: str) -> int:
    """The seq of a cursor's event; one that names none says whether pruning may be why, so a
    client following the events across `metis trace prune` knows to start from the oldest kept
    one rather than suspect its own id."""
    try:
        return await app.history.seq_of(session_id, event_id)
    except CursorNotFound:
        row = await app.history.session_row(session_id)
        floor = row.events_floor_seq if row is not None else 0
        msg = "names no event of this session"
        if floor:
            msg = f"names no event this session still keeps (its events up to seq {floor} were pruned)"
        raise validation_error(
            [{"loc": ["query", name], "msg": msg, "type": "cursor_not_found"}]
        ) from None
