"""Redaction of configured secrets and token-shaped strings in text built from exceptions.

Provider errors can echo request headers; everything that reaches a log line, an event or an
error body goes through `redact` first.
"""

from __future__ import annotations

import re

_TOKEN_RE = re.compile(
    r"\b(sk-[A-Za-z0-9_\-]{8,}|sk-ant-[A-Za-z0-9_\-]{8,}|atk_[A-Za-z0-9_\-]{8,})"
)


_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a configured key so that redact() removes it wherever it shows up."""
    if value and len(value) >= 4:
        _secrets.add(value)


def redact(text: str, limit: int | None = None) -> str:
    """`text` with every registered secret and token-shaped string replaced, cut to `limit`
    characters; required before text from an exception reaches a log, event or error body."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, "[redacted]")
    text = _TOKEN_RE.sub("[redacted]", text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text
