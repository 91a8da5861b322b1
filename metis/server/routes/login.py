"""`GET /login?token=…`: a browser trades a one-time login token for a session cookie.

The token comes from a login URL the daemon mints (`Daemon.login_url()`, printed by
`metis serve`); it is not the key. See metis/server/auth.py.
"""

from __future__ import annotations

import math

from aiohttp import web
from pydantic import BaseModel

from metis.server.auth import CHALLENGE, LOGIN_PATH
from metis.server.errors import ApiError
from metis.server.http import RouteTable, parse_query
from metis.server.state import STATE_KEY

routes = RouteTable()


class LoginQuery(BaseModel):
    token: str | None = None


@routes.route(
    "GET",
    LOGIN_PATH,
    status=303,
    public=True,
    query_model=LoginQuery,
    errors=("unauthorized",),
    summary="Browser login: trade a one-time token for a session cookie, then 303 to /",
)
async def login(request: web.Request) -> web.Response:
    """Redeem a login token (single use, short-lived) and set the HttpOnly session cookie."""
    state = request.app[STATE_KEY]
    auth = state.auth
    token = parse_query(request, LoginQuery).token
    if auth is None or not token or not auth.login_tokens.redeem(token):
        raise ApiError(
            "unauthorized",
            "the login token is missing, unknown, already used or expired; "
            "ask the daemon for a new login URL",
            headers=dict(CHALLENGE),
        )
    response = web.Response(status=303, headers={"Location": "/", "Referrer-Policy": "no-referrer"})
    response.set_cookie(
        auth.cookie_name(state.port),
        auth.sessions.open(),
        max_age=math.ceil(auth.sessions.ttl_s),  # never 0: that would delete the cookie
        path="/",
        httponly=True,
        samesite="Strict",
    )
    return response
