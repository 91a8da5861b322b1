"""`GET /sessions/{id}/stream?attach=…`: the upgrade checks, then the socket.

Host, shutdown and route checks already ran in the middleware. Every refusal here is an
ordinary HTTP response in the REST error envelope, decided before `prepare()`, so a refused
client never gets a socket.
"""

from __future__ import annotations

import logging

from aiohttp import WSCloseCode, web

from metis.core.application import token_fingerprint
from metis.server.errors import ApiError
from metis.server.http import RouteTable
from metis.server.middleware import origin_allowed
from metis.server.state import STATE_KEY
from metis.server.ws.connection import Connection
from metis.server.ws.protocol import CLOSE_MESSAGES, close_reason

log = logging.getLogger(__name__)

routes = RouteTable()


# What aiohttp closes with, on its own, for a frame it refuses: a malformed frame (1002) or a
# text frame that is not UTF-8 (1007). This surface's close table has one pair for a bad frame
# from the client, 1008 `protocol_error`, so a client dispatching on the code finds it there.
_REFUSED_FRAME = (WSCloseCode.PROTOCOL_ERROR, WSCloseCode.INVALID_TEXT)


class MetisWebSocket(web.WebSocketResponse):
    """aiohttp closes on its own for frames it refuses (over the size limit, malformed at the
    protocol level, text that is not UTF-8) with an empty reason; every close reason of this
    surface is JSON, and its codes are those of the close table."""

    async def close(
        self, *, code: int = WSCloseCode.OK, message: bytes = b"", drain: bool = True
    ) -> bool:
        if not message and code != WSCloseCode.OK:
            reason = "message_too_big" if code == WSCloseCode.MESSAGE_TOO_BIG else "protocol_error"
            if code in _REFUSED_FRAME:
                code = WSCloseCode.POLICY_VIOLATION
            message = close_reason(reason, CLOSE_MESSAGES[reason])
        return await super().close(code=code, message=message, drain=drain)


@routes.route(
    "GET",
    "/sessions/{session_id}/stream",
    status=101,
    websocket=True,
    summary="Live event stream of one session (WebSocket; attach=<token from GET /sessions/{id}>)",
    errors=(
        "origin_not_allowed",
        "upgrade_required",
        "session_not_found",
        "session_already_ended",
        "attach_token_invalid",
        "attach_token_wrong_session",
    ),
)
async def stream(request: web.Request) -> web.StreamResponse:
    """Upgrade to the session's WebSocket stream after the upgrade checks."""
    state = request.app[STATE_KEY]
    app = state.app
    settings = app.settings.websocket
    origin = request.headers.get("Origin")
    if origin is not None and not origin_allowed(origin, state):
        raise ApiError("origin_not_allowed", "Origin is not allowed", {"origin": origin})
    ws = MetisWebSocket(
        autoping=True,
        heartbeat=None,
        compress=False,
        # aiohttp refuses a frame whose length reaches this value; "over the limit" is refused.
        max_msg_size=settings.max_inbound_frame_bytes + 1,
        timeout=settings.close_timeout_s,
    )
    if not ws.can_prepare(request).ok:
        raise ApiError("upgrade_required", "this endpoint only serves WebSocket upgrades")
    session_id = request.match_info["session_id"]
    await app.sessions.require_active(session_id)  # 404 session_not_found, 409 ended/ending
    token = request.query.get("attach")
    auth = request.app[STATE_KEY].auth
    # ---- one synchronous step: check and consume the token, attach the connection ----------
    if auth is not None and auth.sockets.revoked(token):  # its browser session logged out
        raise ApiError("attach_token_invalid", "attach token missing, unknown, expired or used")
    verdict = app.streams.check_token(token, session_id)
    if verdict == "invalid":
        raise ApiError("attach_token_invalid", "attach token missing, unknown, expired or used")
    if verdict == "wrong_session":
        raise ApiError("attach_token_wrong_session", "attach token was minted for another session")
    connection = Connection(app, ws, session_id)
    connection.attach()
    closed = auth.sockets.opened(token, connection) if auth is not None else lambda: None
    # ---- end of the synchronous step --------------------------------------------------------
    log.info(
        "websocket %s attached to %s (token %s)",
        connection.name,
        session_id,
        token_fingerprint(token or ""),
    )
    try:
        try:
            await ws.prepare(request)
        except BaseException:
            connection.detach()
            raise
        await connection.run(request)
    finally:
        closed()
    return ws
