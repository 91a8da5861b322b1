"""The HTTP client under the SDKs, and the one raw request the adapters make through them.

Both SDKs ship an aiohttp-based transport (`DefaultAioHttpClient`). It is used by default: its
C-accelerated parser reads a streamed body in whatever chunks arrived, where the default
httpx/h11 stack hands over one HTTP chunk (one server event) at a time, at several times the
cost per event. aiohttp does not apply the proxy environment variables the way httpx does, so
when one is set the SDK's own httpx client is kept and the proxy keeps working.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any

import httpx2

from metis.core.models.types import ProviderConfig
from metis.core.providers.sse import SseBody

log = logging.getLogger(__name__)

PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")


def proxy_configured() -> bool:
    """Whether a proxy variable is set (either case); then the SDK's own httpx client is kept, as
    aiohttp would not apply it the same way."""
    return any(os.environ.get(name) or os.environ.get(name.lower()) for name in PROXY_VARIABLES)


def sdk_http_client(sdk: ModuleType) -> Any:
    """`http_client=` for `sdk` (`anthropic` or `openai`); None keeps the SDK's default."""
    if proxy_configured():
        return None
    return sdk.DefaultAioHttpClient()


def sdk_client_options(sdk: ModuleType, provider: ProviderConfig) -> dict[str, Any]:
    """The keyword arguments of `sdk`'s async client for `provider`: its key and base URL, the
    transport above, its timeouts, and no SDK retries (`retry.py` owns retrying, per call)."""
    return {
        "api_key": provider.sdk_key,
        "base_url": provider.base_url,
        "max_retries": 0,
        "http_client": sdk_http_client(sdk),
        "timeout": sdk.Timeout(
            connect=provider.connect_timeout_s,
            read=provider.read_timeout_s,
            write=30.0,
            pool=provider.connect_timeout_s,
        ),
    }


async def post_json(
    client: Any, path: str, body: bytes, cast_to: Any, request_id: str, *, stream: bool = False
) -> Any:
    """POST a prebuilt JSON body through the SDK's documented raw request (`client.post`).

    Auth, headers, status errors, timeouts and the transport stay the SDK's; only the body is
    ours (`wire_body.py` says why). With `stream`, the response's body is left unread.
    """
    if log.isEnabledFor(logging.DEBUG):
        log.debug("request %s to %s: %s", request_id, path, body[:20000].decode())
    return await client.post(path, cast_to=cast_to, content=body, stream=stream)


async def post_event_stream(client: Any, path: str, body: bytes, request_id: str) -> SseBody:
    """The streamed call: the response's `text/event-stream` body, decoded by metis."""
    response = await post_json(client, path, body, httpx2.Response, request_id, stream=True)
    return SseBody(response)
