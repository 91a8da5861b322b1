"""Why a connection was never made, read from the OS error under an HTTP client's.

The clients' own words ("All connection attempts failed", "Request timed out.") name no cause,
so a server that is not running reads like a slow one. The cause is in the exception chain
(`ConnectionRefusedError`, `socket.gaierror` under the client's wrapper): the provider adapters
and the MCP servers' HTTP transport both read it here."""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it was raised from or while handling, innermost last."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def os_refusal(chain: Iterable[BaseException]) -> str | None:
    """`connection refused` or `host not found` when the chain holds that OS error, else None."""
    for exc in chain:
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, socket.gaierror):
            return "host not found"
    return None
