"""Time as integer microseconds since the epoch, and its one wire format (RFC 3339, UTC, `Z`).

Stored rows, events and every surface use the same representation, so ordering and equality
never depend on float rounding or time zones.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta


def now_us() -> int:
    """The wall clock in integer microseconds since the epoch, the form every stored time uses."""
    return time.time_ns() // 1000


def us_to_datetime(us: int) -> datetime:
    """A stored time as an aware UTC datetime, exact to the microsecond."""
    seconds, micros = divmod(us, 1_000_000)
    return datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=micros)


def datetime_to_us(value: datetime) -> int:
    """An aware datetime as stored microseconds; naive ones are refused because their zone is a
    guess."""
    if value.tzinfo is None:
        raise ValueError("naive datetimes are not accepted; use timezone-aware UTC")
    delta = value.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


_EPOCH = datetime(1970, 1, 1)


def format_us(us: int | None) -> str | None:
    """Wire timestamp `YYYY-MM-DDTHH:MM:SS.ffffffZ`. Every event sent to a client carries one:
    built by `isoformat` from an exact integer offset, at less than half the cost of
    `strftime`."""
    if us is None:
        return None
    return (_EPOCH + timedelta(microseconds=us)).isoformat(timespec="microseconds") + "Z"


def format_datetime(value: datetime) -> str:
    """The wire timestamp of an aware datetime."""
    return format_us(datetime_to_us(value))  # type: ignore[return-value]
