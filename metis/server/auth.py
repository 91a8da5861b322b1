"""Who may drive the metis REST surface: the daemon's key, or a browser session's secret.

Every route but the public ones (`GET /health`, `GET /openapi.json`, `GET /login`, the
dashboard's page and files) needs `Authorization: Bearer <credential>`, where the credential is
the daemon's key (the same key as AAP, `metis/http/apikey.py`: `METIS_API_KEY`, else
`METIS_HOME/api_key`) or the secret of a browser session. A browser cannot be given the key; it
trades a one-time login token (`GET /login?token=…`, minted by `Daemon.login_url()`: short-lived,
single-use, not the key) for a browser-session secret, handed to the page in the redirect's URL
fragment (`/#login=<secret>`: a fragment never reaches a server). The page keeps it in
localStorage, which only its own origin (scheme, host and port) can read, and sends it as the
bearer header. No cookie is involved: cookies are not port-scoped, so every other listener on
127.0.0.1 would receive one. A browser-session request that changes state must also carry the
daemon's own loopback Origin (the middleware checks it). The WebSocket upgrade is authorised by
its single-use attach token, which only an authenticated request obtains.

Login tokens are kept as SHA-256 digests, browser sessions as HMAC-SHA-256 digests keyed by the
daemon's key: a lookup never compares the secret itself, the tables hold no usable credential,
and a new key (the file replaced, the daemon restarted) voids every session the old one made.
Browser sessions outlive the daemon: their digests and expiry times (wall clock) are written to
`METIS_HOME/browser_sessions.json` (mode 0600, replaced atomically whenever a session opens or
ends), so a page keeps working across a restart. `POST /logout` ends the calling session. Login
tokens stay in memory: a restart voids the unused ones. `config.yaml` `auth: {required: false}`
switches the metis check off (the AAP key stays).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from aiohttp import web

from metis.config import AuthSettings
from metis.http.apikey import ApiKey, bearer_token, key_matches
from metis.private_file import write_private
from metis.server.browser_sockets import SocketsByLogin

CHALLENGE = {"WWW-Authenticate": "Bearer"}
LOGIN_PATH = "/login"
SESSIONS_FILE = "browser_sessions.json"  # in METIS_HOME
# 2: HMAC digests keyed by the daemon's key; 1 (plain SHA-256, key-independent) is dropped
_SESSIONS_FORMAT = 2

log = logging.getLogger(__name__)

Credential = Literal["key", "browser"]
Clock = Callable[[], float]


def _digest(secret: str) -> bytes:
    # aiohttp decodes header bytes with surrogate escapes; such a value simply never matches
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


class _ExpiringSecrets:
    """Random secrets with an expiry, stored by digest; expired ones are pruned on issue."""

    def __init__(self, ttl_s: float, clock: Clock = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._expiry: dict[bytes, float] = {}

    def _digest(self, secret: str) -> bytes:
        return _digest(secret)

    def _issue(self) -> str:
        now = self._clock()
        self._expiry = {d: t for d, t in self._expiry.items() if t > now}
        secret = secrets.token_urlsafe(32)
        self._expiry[self._digest(secret)] = now + self.ttl_s
        return secret

    def __len__(self) -> int:
        return len(self._expiry)


class LoginTokens(_ExpiringSecrets):
    """One-time tokens of the browser login URL: valid for `ttl_s`, each redeemable once."""

    def mint(self) -> str:
        return self._issue()

    def redeem(self, token: str) -> bool:
        """True once for a minted, unexpired token; a used, expired or unknown token is False."""
        expires = self._expiry.pop(self._digest(token), None)
        return expires is not None and expires > self._clock()


class BrowserSessions(_ExpiringSecrets):
    """Server-side browser sessions: the browser holds a random secret, valid for `ttl_s`.

    Each is stored as HMAC-SHA-256(`key`, secret): bound to the daemon's key, so sessions a
    previous key minted never match again. With a `path`, the sessions (digest → wall-clock
    expiry) are loaded from that file and the file is rewritten atomically, mode 0600, whenever
    a session opens or is revoked; without one they live in memory only. An unreadable file is
    logged and ignored (its browsers log in again).
    """

    def __init__(
        self, ttl_s: float, key: str, clock: Clock = time.time, *, path: Path | None = None
    ) -> None:
        super().__init__(ttl_s, clock)
        self._key = key.encode("utf-8", "surrogateescape")
        self.path = path
        if path is not None:
            self._expiry = self._load(path)

    def _digest(self, secret: str) -> bytes:
        message = b"metis browser session\0" + secret.encode("utf-8", "surrogateescape")
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def open(self) -> str:
        secret = self._issue()
        self._save()
        return secret

    def revoke(self, secret: str) -> bool:
        """End a session now (logout); False when it was unknown or already over."""
        expires = self._expiry.pop(self._digest(secret), None)
        if expires is None:
            return False
        self._save()
        return expires > self._clock()

    def login_of(self, secret: str) -> str:
        """The name a session is known by outside this table (its digest, not its secret)."""
        return self._digest(secret).hex()

    def valid(self, session_id: str) -> bool:
        digest = self._digest(session_id)
        expires = self._expiry.get(digest)
        if expires is None:
            return False
        if expires <= self._clock():
            del self._expiry[digest]
            return False
        return True

    def _load(self, path: Path) -> dict[bytes, float]:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o077:  # as METIS_HOME/api_key: owner-only, tightened at start
                log.warning("browser sessions file %s had mode %o; tightened to 0600", path, mode)
                path.chmod(0o600)
            raw = path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("browser sessions not restored: cannot read %s (%s)", path, exc.strerror)
            return {}
        try:
            data = json.loads(raw)
            if data.get("format") == 1:
                log.info("browser sessions of an older format dropped: browsers log in again")
                return {}
            if data.get("format") != _SESSIONS_FORMAT:
                raise ValueError("unknown format")
            now = self._clock()
            return {
                bytes.fromhex(digest): float(expires)
                for digest, expires in data["sessions"].items()
                if len(digest) == 64 and float(expires) > now
            }
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("browser sessions not restored: %s is not a sessions file", path)
            return {}

    def _save(self) -> None:
        if self.path is None:
            return
        body = json.dumps(
            {
                "format": _SESSIONS_FORMAT,
                "sessions": {d.hex(): t for d, t in self._expiry.items()},
            },
            separators=(",", ":"),
        ).encode()
        try:
            write_private(self.path, body, durable=True)
        except OSError as exc:
            # the session works until the daemon stops; only its restart is lost
            log.warning("browser sessions not saved to %s (%s)", self.path, exc.strerror)


@dataclass
class ServerAuth:
    """The metis surface's authentication state: the daemon's key, login tokens, sessions."""

    api_key: ApiKey
    settings: AuthSettings
    # where browser sessions persist (METIS_HOME/browser_sessions.json); None: memory only
    sessions_file: Path | None = None
    login_tokens: LoginTokens = field(init=False)
    sessions: BrowserSessions = field(init=False)
    sockets: SocketsByLogin = field(init=False, default_factory=SocketsByLogin)

    def __post_init__(self) -> None:
        self.login_tokens = LoginTokens(self.settings.login_token_ttl_s)
        self.sessions = BrowserSessions(
            self.settings.browser_session_ttl_s, self.api_key.value, path=self.sessions_file
        )

    def __repr__(self) -> str:  # never the key
        return f"ServerAuth(required={self.required}, key={self.api_key!r})"

    @property
    def required(self) -> bool:
        return self.settings.required

    def credential(self, request: web.Request) -> Credential | None:
        """How a request is authenticated, or None: its `Authorization: Bearer` token is the
        daemon's key or a valid browser session's secret. Cookies are never looked at."""
        token = bearer_token(request.headers.get("Authorization"))
        if not token:
            return None
        if key_matches(token, self.api_key.value):
            return "key"
        if self.sessions.valid(token):
            return "browser"
        return None

    def browser_secret(self, request: web.Request) -> str | None:
        """The browser-session secret a request carries (valid or not), else None."""
        token = bearer_token(request.headers.get("Authorization"))
        if not token or key_matches(token, self.api_key.value):
            return None
        return token

    def login_of(self, request: web.Request) -> str | None:
        """The browser session a request comes from (`BrowserSessions.login_of`), if any."""
        secret = self.browser_secret(request)
        return self.sessions.login_of(secret) if secret and self.sessions.valid(secret) else None

    def login_path(self) -> str:
        """A fresh one-time login path (`/login?token=…`); prefix it with the daemon's URL."""
        return f"{LOGIN_PATH}?token={self.login_tokens.mint()}"

    def new_login(self) -> tuple[str, float]:
        """A fresh one-time login path and the wall-clock time (epoch seconds) it expires."""
        return self.login_path(), time.time() + self.login_tokens.ttl_s
