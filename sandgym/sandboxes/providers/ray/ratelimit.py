"""Creation-rate limiting and per-node backoff for the fleet.

Providers and container engines fall over when thousands of creates arrive at once (the
engine's API, image layer locks, a cloud's quota): a fleet spaces its creates with a token
bucket, and a node whose creates fail is left alone for a while (exponential backoff)."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up. `acquire()` waits for a token.
    The clock is injectable so the arithmetic is testable without sleeping."""

    def __init__(self, rate: float, burst: float | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(1.0, rate))
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self._clock = clock
        self._tokens = self.burst
        self._stamp = clock()
        self._lock = anyio.Lock()
        self.waits = 0  # acquisitions that had to wait

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def try_acquire(self) -> float:
        """Take a token and return 0, or return the seconds until one is due."""
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate

    async def acquire(self) -> None:
        async with self._lock:  # first come, first served
            waited = False
            while (delay := self.try_acquire()) > 0:
                waited = True
                await anyio.sleep(delay)
            self.waits += waited


class Backoff:
    """Exponential backoff after consecutive failures: base, 2*base, ... up to `cap`."""

    def __init__(self, base_s: float = 0.5, cap_s: float = 30.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self._clock = clock
        self.failures = 0
        self.until = 0.0

    def fail(self) -> float:
        self.failures += 1
        delay = min(self.cap_s, self.base_s * 2 ** (self.failures - 1))
        self.until = self._clock() + delay
        return delay

    def succeed(self) -> None:
        self.failures = 0
        self.until = 0.0

    def remaining(self) -> float:
        return max(0.0, self.until - self._clock())
