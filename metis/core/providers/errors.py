"""The closed provider-error taxonomy and the helpers shared by both mappings.

Every failure an adapter surfaces is a `ProviderError` with one of nine classes, so retries,
availability and the events' `error_class` never depend on which SDK raised what.
"""

from __future__ import annotations

import json
import logging
import ssl
import sys
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import pydantic

from metis.core.canonical.redaction import redact

log = logging.getLogger(__name__)

ErrorClass = Literal[
    "auth",
    "rate_limit",
    "server_error",
    "network",
    "invalid_request",
    "context_overflow",
    "content_filter",
    "cancelled",
    "other",
]
RETRYABLE: frozenset[str] = frozenset({"rate_limit", "server_error", "network"})
COUNTED_FOR_AVAILABILITY: frozenset[str] = frozenset(
    {"auth", "rate_limit", "server_error", "network"}
)
MAX_MESSAGE_CHARS = 500


class ProviderError(Exception):
    """A classified adapter failure. `message` is safe to log and show: never a key, header or body."""

    def __init__(
        self,
        error_class: ErrorClass,
        message: str,
        *,
        provider: str,
        model: str,
        http_status: int | None = None,
        provider_error: str | None = None,
        provider_said: str | None = None,
        retry_after_s: float | None = None,
        attempts: int = 1,
        after_first_token: bool = False,
    ) -> None:
        super().__init__(message)
        self.error_class: ErrorClass = error_class
        self.message = message
        self.provider = provider
        self.model = model
        self.http_status = http_status
        self.provider_error = provider_error
        # the provider's own words (its error body's message), scrubbed as `message` is: what
        # a refusal adds to the sentence metis makes of the status and code
        self.provider_said = provider_said
        self.retry_after_s = retry_after_s
        self.attempts = attempts
        self.after_first_token = after_first_token
        # set by the retry policy when it retries: the wait it chose, for the attempt's report
        self.retry_in_s: float | None = None

    @property
    def retryable(self) -> bool:
        """Whether the class is one the driver retries (rate limits, server and network errors); it
        retries only while nothing has been streamed yet."""
        return self.error_class in RETRYABLE

    @property
    def counts_for_availability(self) -> bool:
        """Whether this failure counts toward taking the provider or model out of routing."""
        return self.error_class in COUNTED_FOR_AVAILABILITY

    def __repr__(self) -> str:
        return (
            f"ProviderError({self.error_class!r}, {self.message!r}, provider={self.provider!r}, "
            f"model={self.model!r}, http_status={self.http_status!r}, attempts={self.attempts})"
        )


def safe_text(text: str, secret: str | None = None) -> str:
    """Redact configured keys and key-shaped tokens, then cut, before text leaves an adapter."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "[redacted]")
    return redact(" ".join(text.split()), limit=MAX_MESSAGE_CHARS)


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms`, else `retry-after` (seconds or HTTP-date); ≥ 0."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


class StreamErrorEvent(Exception):
    """An error the provider reported inside a 200 stream; the adapter's `classify` maps it."""

    def __init__(self, body: object) -> None:
        super().__init__("error event in the response stream")
        self.body = body  # the event's data (JSON text or the parsed object)


def error_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """(type, code, message) of an error body in either provider's shape, or of a bare error object."""
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return None, None, None
    if not isinstance(body, Mapping):
        return None, None, None
    inner = body.get("error", body)
    if not isinstance(inner, Mapping):
        return None, None, inner if isinstance(inner, str) else None
    etype = inner.get("type")
    code = inner.get("code")
    message = inner.get("message")
    return (
        etype if isinstance(etype, str) else None,
        str(code) if isinstance(code, str | int) and not isinstance(code, bool) else None,
        message if isinstance(message, str) else None,
    )


_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    ssl.SSLError,
    ConnectionError,
    TimeoutError,
    EOFError,
)
_MALFORMED_ERRORS: tuple[type[BaseException], ...] = (
    json.JSONDecodeError,
    pydantic.ValidationError,
    UnicodeDecodeError,
)


def is_transport_error(exc: BaseException) -> bool:
    """Whether an exception is a broken or timed-out connection (the `network` class), whichever
    HTTP stack raised it."""
    if isinstance(exc, _TRANSPORT_ERRORS):
        return True
    # The SDKs' HTTP client is imported with an adapter, not with this module (the daemon
    # answers /health without it): until it is, none of its exceptions can exist.
    httpx2 = sys.modules.get("httpx2")
    if httpx2 is not None and isinstance(exc, httpx2.TransportError | httpx2.TimeoutException):
        return True
    try:
        import anyio

        return isinstance(exc, anyio.EndOfStream | anyio.BrokenResourceError)
    except ImportError:  # pragma: no cover - anyio ships with both SDKs
        return False


def is_malformed_error(exc: BaseException) -> bool:
    """Whether an exception means the response could not be parsed (JSON, schema or encoding)."""
    return isinstance(exc, _MALFORMED_ERRORS)


def internal_error(exc: BaseException, *, provider: str, model: str) -> ProviderError:
    """Wrap an exception no table row covers; the traceback goes to the log, never to the caller."""
    log.error("provider %s model %s: unexpected adapter exception", provider, model, exc_info=exc)
    return ProviderError(
        "other",
        f"internal adapter error: {type(exc).__name__}",
        provider=provider,
        model=model,
    )


def status_class_common(status: int) -> ErrorClass:
    """Status-only fallbacks shared by both tables (used once the wire-specific rows missed)."""
    if status in (401, 403):
        return "auth"
    if status == 429:
        return "rate_limit"
    if status == 413:
        return "context_overflow"
    if status == 408:
        return "network"
    if status >= 500:
        return "server_error"
    if 400 <= status < 500:
        return "invalid_request"
    return "other"


def headers_of(exc: Any) -> Mapping[str, str] | None:
    """The HTTP response headers an SDK exception carries, if any (for `retry-after`)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    return headers if isinstance(headers, Mapping) or hasattr(headers, "get") else None
