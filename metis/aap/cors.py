"""CORS for the AAP routes only: configured origins, reflected, never credentials.

With no configured origins no `Access-Control-*` header is ever sent. The daemon's own origin
always counts as allowed for the state-changing Origin check (it is same-origin anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

ALLOW_METHODS = "GET, POST, PUT, DELETE, OPTIONS"
ALLOW_HEADERS = "authorization, content-type"
MAX_AGE = "600"


class CorsPolicy:
    def __init__(
        self, origins: Iterable[str], own_origins: Callable[[], Iterable[str]] = tuple
    ) -> None:
        """`own_origins` is called per check: the port is only known once the daemon binds."""
        self.origins = frozenset(origins)
        self.any = "*" in self.origins
        self._own = own_origins

    @property
    def enabled(self) -> bool:
        return bool(self.origins)

    def allowed(self, origin: str) -> bool:
        """May this origin call AAP at all (the 403 `origin_not_allowed` check)?"""
        own = {o.lower() for o in self._own()}
        return origin.lower() in own or self.any or origin in self.origins

    def response_headers(self, origin: str | None) -> dict[str, str]:
        """Headers every AAP response to this origin carries (empty when not allowed)."""
        if origin is None or not self.enabled or not self.allowed(origin):
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    def preflight_headers(self, origin: str | None) -> dict[str, str]:
        headers = self.response_headers(origin)
        if headers:
            headers.update(
                {
                    "Access-Control-Allow-Methods": ALLOW_METHODS,
                    "Access-Control-Allow-Headers": ALLOW_HEADERS,
                    "Access-Control-Max-Age": MAX_AGE,
                }
            )
        return headers
