"""The one retry policy of every adapter; SDK retries are always off.

The sleep function and the random source are injected so tests run the real policy on a fake
clock with seeded jitter and never sleep for real.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from metis.core.providers.errors import ProviderError

SleepFn = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """At most `max_attempts` per logical call, only before the first token.

    `uniform(a, b)` draws the jitter factor; `sleep(seconds)` waits (the stream driver races it
    against the request's cancel event).
    """

    max_attempts: int = 3
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0
    max_retry_after_s: float = 60.0
    jitter_low: float = 0.75
    jitter_high: float = 1.25
    sleep: SleepFn = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)

    def delay_before_retry(self, attempt: int, error: ProviderError) -> float | None:
        """Seconds to wait before attempt `attempt + 1`, or None when the error must be raised now.

        `retry_after_s` is honoured exactly (no jitter) up to `max_retry_after_s`; a longer one
        means the provider wants us gone for a while, so the caller should fail over instead
        (availability takes the model out until then). The answer is also kept on the error
        (`retry_in_s`): the jitter is drawn once, and the attempt's report says the same wait.
        """
        error.retry_in_s = self._delay(attempt, error)
        return error.retry_in_s

    def _delay(self, attempt: int, error: ProviderError) -> float | None:
        if not error.retryable or error.after_first_token or attempt >= self.max_attempts:
            return None
        if error.retry_after_s is not None:
            if error.retry_after_s > self.max_retry_after_s:
                return None
            return error.retry_after_s
        base = min(self.base_delay_s * 2.0 ** (attempt - 1), self.max_delay_s)
        return base * self.rng.uniform(self.jitter_low, self.jitter_high)


DEFAULT_RETRY_POLICY = RetryPolicy()
