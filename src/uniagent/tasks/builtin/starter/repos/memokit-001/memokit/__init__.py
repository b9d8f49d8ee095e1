"""Bounded least-recently-used caching."""

from memokit.cache import CacheStats, LRUCache
from memokit.decorators import memoize

__all__ = ["CacheStats", "LRUCache", "memoize"]
