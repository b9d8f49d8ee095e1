"""Sliding-window rate limiter.

At most ``limit`` requests per key are allowed in any window of ``window``
seconds.  A request stops counting against the limit exactly ``window``
seconds after it was allowed: with ``limit=1, window=1.0``, requests at
``t=0.0`` and ``t=1.0`` are both allowed.  Denied requests never count.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable


class SlidingWindowLimiter:
    def __init__(self, limit: int, window: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if window <= 0:
            raise ValueError("window must be positive")
        self.limit = limit
        self.window = window
        self._clock = clock
        self._hits: dict[Hashable, deque[float]] = {}

    def _prune(self, key: Hashable, now: float) -> deque[float]:
        hits = self._hits.setdefault(key, deque())
        horizon = now - self.window
        while hits and hits[0] < horizon:
            hits.popleft()
        return hits

    def allow(self, key: Hashable = "default") -> bool:
        """Record a request for ``key`` and say whether it is within the limit."""
        now = self._clock()
        hits = self._prune(key, now)
        if len(hits) >= self.limit:
            return False
        hits.append(now)
        return True

    def remaining(self, key: Hashable = "default") -> int:
        """How many more requests ``key`` may make right now."""
        return self.limit - len(self._prune(key, self._clock()))

    def retry_after(self, key: Hashable = "default") -> float:
        """Seconds until ``key`` may make another request (0.0 if it may now)."""
        now = self._clock()
        hits = self._prune(key, now)
        if len(hits) < self.limit:
            return 0.0
        return max(0.0, hits[0] + self.window - now)

    def reset(self, key: Hashable | None = None) -> None:
        if key is None:
            self._hits.clear()
        else:
            self._hits.pop(key, None)
