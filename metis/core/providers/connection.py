"""Words for a request that never got an HTTP answer, naming the provider and where it was sent.

The SDKs report every such failure in their own coarse terms — the openai SDK over aiohttp calls
a refused connection "Request timed out." — so "Ollama isn't running" would read as a slow
provider. What happened is in the exception chain (`ConnectionRefusedError` under the SDK's
wrapper and the HTTP client's), so the message is read from there.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

from metis.core.connect_errors import exception_chain, os_refusal
from metis.core.models.types import ProviderConfig
from metis.core.providers.errors import ProviderError

_DEFAULT_PORTS = {"https": 443, "http": 80}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A provider entry's name in models.yaml, its `host:port` and its timeouts."""

    provider: str
    address: str
    connect_timeout_s: float
    read_timeout_s: float

    @classmethod
    def of(cls, config: ProviderConfig, base_url: object) -> Endpoint:
        """The endpoint of `config` as its SDK client resolved it (`base_url` may be the SDK's
        default, when models.yaml names none)."""
        parts = urlsplit(str(base_url))
        host = parts.hostname or "?"
        if ":" in host:  # an IPv6 literal
            host = f"[{host}]"
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
        return cls(config.name, f"{host}:{port}", config.connect_timeout_s, config.read_timeout_s)


def _types(module: str, *names: str) -> tuple[type[BaseException], ...]:
    """Exception types of the SDKs' HTTP layers (httpx2, and aiohttp under it); none until an
    adapter imported them. Looked up, not imported: the core knows no HTTP library itself."""
    found = sys.modules.get(module)
    return tuple(getattr(found, n) for n in names) if found is not None else ()


def _why_not_connected(chain: list[BaseException]) -> str | None:
    """Why no connection was made (from the OS error under the HTTP client's), or None when the
    chain shows no failed connect."""
    connect_errors: tuple[type[BaseException], ...] = (
        *_types("aiohttp", "ClientConnectorError"),
        *_types("httpx2", "ConnectError"),
    )
    refused = os_refusal(chain)
    if refused is not None:
        return refused
    if not any(isinstance(e, connect_errors) for e in chain):
        return None
    for exc in chain:
        if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, TimeoutError):
            return exc.strerror.lower()
    return "connection failed"


def _timeout_kind(chain: list[BaseException]) -> str | None:
    """`connect` or `read` for a timeout the chain names, `unknown` for one it does not say,
    None for no timeout. aiohttp's own exception is exact where there is one: the SDKs' mapping
    of it is not (it calls a dropped connection a connect timeout)."""
    if any(isinstance(e, _types("aiohttp", "ClientError")) for e in chain):
        connect = _types("aiohttp", "ConnectionTimeoutError")
        read = _types("aiohttp", "SocketTimeoutError")
        timeouts: tuple[type[BaseException], ...] = (TimeoutError,)
    else:
        connect = _types("httpx2", "ConnectTimeout", "PoolTimeout")
        read = _types("httpx2", "ReadTimeout")
        timeouts = (TimeoutError, *_types("httpx2", "TimeoutException"))
    if any(isinstance(e, connect) for e in chain):
        return "connect"
    if any(isinstance(e, read) for e in chain):
        return "read"
    if any(isinstance(e, timeouts) for e in chain):
        return "unknown"
    return None


def describe(exc: BaseException, endpoint: Endpoint) -> str:
    """What went wrong, e.g. `ollama: cannot connect to 127.0.0.1:11434 (connection refused)`."""
    chain = list(exception_chain(exc))
    name, address = endpoint.provider, endpoint.address
    refused = _why_not_connected(chain)
    if refused is not None:
        return f"{name}: cannot connect to {address} ({refused})"
    timeout = _timeout_kind(chain)
    if timeout == "connect":
        return (
            f"{name}: cannot connect to {address} (no answer within "
            f"{endpoint.connect_timeout_s:g} s, connect_timeout_s)"
        )
    if timeout == "read":
        return (
            f"{name}: no reply from {address} within {endpoint.read_timeout_s:g} s (read_timeout_s)"
        )
    if timeout == "unknown":
        return f"{name}: the request to {address} timed out"
    return f"{name}: the connection to {address} failed ({type(chain[-1]).__name__})"


def network_error(exc: BaseException, *, endpoint: Endpoint, model: str) -> ProviderError:
    """A transport failure (no HTTP answer, or the connection lost mid-answer) as `network`."""
    return ProviderError(
        "network", describe(exc, endpoint), provider=endpoint.provider, model=model
    )
