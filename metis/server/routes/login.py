"""`GET /login?token=…`: a browser trades a one-time login token for a browser-session secret;
`POST /logout`: a browser ends its session; `POST /login/tokens`: a key holder (`metis open`)
asks the running daemon for a login URL.

The secret goes back in the redirect's URL fragment (`303 Location: /#login=<secret>`), which
the browser never sends to any server; the page moves it to localStorage (its own origin only)
and sends it as `Authorization: Bearer <secret>`. No cookie is set: cookies are not
port-scoped, so any other listener on 127.0.0.1 the browser visits would receive one.

A browser whose link cannot be redeemed gets a page saying how to get a new one (a 401 with
the same challenge as the API's error); its script goes on to the dashboard instead when the
browser already holds a valid session (metis/dashboard/static/js/login-link.js).

The token comes from a login URL the daemon mints (`Daemon.login_url()`, printed by
`metis serve`, or `POST /login/tokens`); it is not the key. See metis/server/auth.py.
"""

from aiohttp import web

from metis.core.canonical.times import format_us
from metis.core.datamodel import DataModel
from metis.dashboard.routes import login_link_page
from metis.server.auth import CHALLENGE, LOGIN_PATH
from metis.server.errors import ApiError
from metis.server.http import RouteTable, json_response, parse_query
from metis.server.state import STATE_KEY

# the URL fragment that hands a browser its session secret (read by static/js/auth.js)
FRAGMENT = "login="

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
    # the GET spends the token and opens a session: a HEAD (a link checker's, a prefetch)
    # must not, and the answer's Location would carry the session's secret
    head=False,
    summary="Browser login: trade a one-time token for a browser-session secret, handed to "
    "the page in the fragment of a 303 to /#login=<secret>",
)
async def login(request: web.Request) -> web.Response:
    """Redeem a login token (single use, short-lived) and open a browser session."""
    state = request.app[STATE_KEY]
    auth = state.auth
    token = parse_query(request, LoginQuery).token
    if auth is None or not token or not auth.login_tokens.redeem(token):
        if _wants_html(request):
            # a person following a link: a page saying what to do, not the API's JSON error
            # (its script leads a browser that is already logged in on to the dashboard)
            return login_link_page(state, dict(CHALLENGE))
        raise ApiError(
            "unauthorized",
            "the login token is missing, unknown, already used or expired; "
            "ask the daemon for a new login URL",
            headers=dict(CHALLENGE),
        )
    # no referrer: the spent token stays out of the next request's headers; the fragment
    # carries the secret to the page and never reaches a server
    return web.Response(
        status=303,
        headers={
            "Location": f"/#{FRAGMENT}{auth.sessions.open()}",
            "Referrer-Policy": "no-referrer",
        },
    )


def _wants_html(request: web.Request) -> bool:
    """Whether the client asked for a page (browsers navigating send `Accept: text/html,…`)."""
    return "text/html" in request.headers.get("Accept", "")


class LogoutResult(DataModel):
    revoked: bool


@routes.route(
    "POST",
    "/logout",
    response_model=LogoutResult,
    errors=("unauthorized", "origin_not_allowed"),
    summary="End the calling browser session (its secret stops working at once)",
)
async def logout(request: web.Request) -> web.Response:
    """Revoke the browser session whose secret authenticates this request. `revoked` is false
    when the request came with the key (or none, with `auth.required: false`): a key holder
    has no session to end."""
    auth = request.app[STATE_KEY].auth
    secret = auth.browser_secret(request) if auth is not None else None
    revoked = secret is not None and auth is not None and auth.sessions.revoke(secret)
    if secret is not None and auth is not None:  # its sockets stop receiving at once
        auth.sockets.logged_out(auth.sessions.login_of(secret))
    return json_response({"revoked": revoked})


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
    if auth is None or (auth.required and auth.credential(request) != "key"):
        # a browser session must not extend itself into new sessions: only the key mints
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
