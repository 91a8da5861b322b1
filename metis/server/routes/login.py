"""`GET /login?token=…`: a browser trades a one-time login token for a session cookie;
`POST /login/tokens`: a key holder (`metis open`) asks the running daemon for such a URL.

A browser whose link cannot be redeemed gets a page saying how to get a new one (a 401 with
the same challenge as the API's error), or, when it already holds a valid session, the
dashboard itself.

The token comes from a login URL the daemon mints (`Daemon.login_url()`, printed by
`metis serve`, or `POST /login/tokens`); it is not the key. See metis/server/auth.py.
"""

import math

from aiohttp import web

from metis.core.canonical.times import format_us
from metis.core.datamodel import DataModel
from metis.dashboard.routes import login_link_page
from metis.server.auth import CHALLENGE, LOGIN_PATH
from metis.server.errors import ApiError
from metis.server.http import RouteTable, json_response, parse_query
from metis.server.state import STATE_KEY

routes = RouteTable()


class LoginQuery(DataModel):
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
        if auth is not None and auth.credential(request, state.port) == "cookie":
            # a link opened again (history, a second click) in a browser already logged in
            return _to_the_dashboard()
        if _wants_html(request):
            # a person following a link: a page saying what to do, not the API's JSON error
            return login_link_page(state, dict(CHALLENGE))
        raise ApiError(
            "unauthorized",
            "the login token is missing, unknown, already used or expired; "
            "ask the daemon for a new login URL",
            headers=dict(CHALLENGE),
        )
    response = _to_the_dashboard()
    response.set_cookie(
        auth.cookie_name(state.port),
        auth.sessions.open(),
        max_age=math.ceil(auth.sessions.ttl_s),  # never 0: that would delete the cookie
        path="/",
        httponly=True,
        samesite="Strict",
    )
    return response


def _to_the_dashboard() -> web.Response:
    """303 to `/`, with no referrer: the token stays out of the next request's headers."""
    return web.Response(status=303, headers={"Location": "/", "Referrer-Policy": "no-referrer"})


def _wants_html(request: web.Request) -> bool:
    """Whether the client asked for a page (browsers navigating send `Accept: text/html,…`)."""
    return "text/html" in request.headers.get("Accept", "")


class LoginUrl(DataModel):
    url: str
    expires_at: str


@routes.route(
    "POST",
    f"{LOGIN_PATH}/tokens",
    status=201,
    response_model=LoginUrl,
    errors=("unauthorized",),
    summary="A fresh one-time browser login URL (key only: a browser session cannot mint one)",
)
async def new_login_url(request: web.Request) -> web.Response:
    """Mint a login URL for `metis open`: single-use, valid `auth.login_token_ttl_s`."""
    state = request.app[STATE_KEY]
    auth = state.auth
    if auth is None or (auth.required and auth.credential(request, state.port) != "key"):
        # a session cookie must not extend itself into new sessions: only the key mints
        raise ApiError(
            "unauthorized",
            "only the daemon's key (`Authorization: Bearer <key>`) can mint a login URL",
            headers=dict(CHALLENGE),
        )
    path, expires = auth.new_login()
    return json_response(
        {
            "url": f"http://{state.base_host}:{state.port}{path}",
            "expires_at": format_us(int(expires * 1_000_000)),
        },
        status=201,
    )
