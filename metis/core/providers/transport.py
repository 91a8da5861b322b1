"""The HTTP client under the SDKs.

Both SDKs ship an aiohttp-based transport (`DefaultAioHttpClient`). It is used by default: its
C-accelerated parser reads a streamed body in whatever chunks arrived, where the default
httpx/h11 stack hands over one HTTP chunk (one server event) at a time, at several times the
cost per event. aiohttp does not apply the proxy environment variables the way httpx does, so
when one is set the SDK's own httpx client is kept and the proxy keeps working.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")


def proxy_configured() -> bool:
    return any(os.environ.get(name) or os.environ.get(name.lower()) for name in PROXY_VARIABLES)


def sdk_http_client(sdk: ModuleType) -> Any:
    """`http_client=` for `sdk` (`anthropic` or `openai`); None keeps the SDK's default."""
    if proxy_configured():
        return None
    return sdk.DefaultAioHttpClient()
