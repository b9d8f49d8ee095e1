"""In-process sliding-window rate limiting."""

from ratelimit.window import SlidingWindowLimiter

__all__ = ["SlidingWindowLimiter"]
