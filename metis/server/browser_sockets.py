"""The WebSockets each browser session opened, so that its logout closes them.

A socket is authorised once, at its upgrade, by an attach token that an authenticated request
obtained; nothing asks for the credential again while it stays open. A browser session that
logs out must not keep receiving its sessions' events in a tab (or on a machine) that did not
follow the logout, so the attach tokens a browser session is given are remembered with it, the
socket each one opened is filed under it, and its logout closes them all. Sessions are known by
the digest `BrowserSessions` keeps (`login`), never by their secret.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol


class Closable(Protocol):
    def close_out_of_band(self, ws_code: int, code: str) -> None: ...


class SocketsByLogin:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # attach token → login; None once that browser session logged out (until it expires)
        self._tokens: dict[str, str | None] = {}
        self._expiries: deque[tuple[float, str]] = deque()  # in minting order: one TTL
        self._open: dict[str, set[Closable]] = {}

    def minted(self, token: str, login: str, ttl_s: float) -> None:
        """`token` (valid `ttl_s`) was given to browser session `login`; tokens never used
        are dropped once they expire (at the next mint)."""
        now = self._clock()
        while self._expiries and self._expiries[0][0] <= now:
            self._tokens.pop(self._expiries.popleft()[1], None)
        self._tokens[token] = login
        self._expiries.append((now + ttl_s, token))

    def revoked(self, token: str | None) -> bool:
        """Whether `token` was given to a browser session that has logged out since: the
        upgrade refuses it, or a tab that did not follow the logout (one reconnecting at that
        moment) would open a socket no logout closes any more."""
        return token is not None and token in self._tokens and self._tokens[token] is None

    def opened(self, token: str | None, socket: Closable) -> Callable[[], None]:
        """The socket `token` opened is filed under its browser session (if a browser session
        was given the token); the function returned forgets it once it closes."""
        login = self._tokens.pop(token or "", None)
        if login is None:
            return lambda: None
        sockets = self._open.setdefault(login, set())
        sockets.add(socket)

        def closed() -> None:
            sockets.discard(socket)
            if not sockets and self._open.get(login) is sockets:
                del self._open[login]

        return closed

    def logged_out(self, login: str) -> int:
        """Close every socket browser session `login` opened (1008 `logged_out`), and revoke
        the tokens it was given and has not used yet (see `revoked`); how many sockets were
        closed."""
        self._tokens = {t: None if v == login else v for t, v in self._tokens.items()}
        sockets = self._open.pop(login, set())
        for socket in sockets:
            socket.close_out_of_band(1008, "logged_out")
        return len(sockets)
