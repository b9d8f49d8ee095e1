"""Memoization on top of :class:`LRUCache`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from memokit.cache import LRUCache

_MISSING = object()


def _make_key(args: tuple, kwargs: dict) -> tuple:
    if not kwargs:
        return args
    return (*args, _MISSING, *sorted(kwargs.items()))


def memoize(maxsize: int = 128) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Cache results of a function of hashable arguments in an :class:`LRUCache`."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        cache = LRUCache(maxsize)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = _make_key(args, kwargs)
            result = cache.get(key, _MISSING)
            if result is _MISSING:
                result = fn(*args, **kwargs)
                cache.put(key, result)
            return result

        wrapper.cache = cache  # type: ignore[attr-defined]
        return wrapper

    return decorator
