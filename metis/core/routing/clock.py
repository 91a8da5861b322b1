"""Injectable time source for routing (availability windows, load timestamps).

Durations use the monotonic clock so a wall-clock jump can neither trip nor heal a provider;
the wall clock only stamps what is reported (`since`, `loaded_at`). Tests pass a manual clock.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """The time source routing reads: monotonic for durations, wall for what is reported."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps, for windows and backoffs."""

    def wall(self) -> datetime:
        """Aware UTC now."""
        ...


class SystemClock:
    """The real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return datetime.now(UTC)


SYSTEM_CLOCK = SystemClock()
