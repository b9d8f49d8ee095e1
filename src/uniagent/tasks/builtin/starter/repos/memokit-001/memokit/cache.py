"""A size-bounded mapping that evicts the least recently used entry."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class LRUCache:
    """Mapping with at most ``maxsize`` entries.

    Both reading an entry (:meth:`get`) and writing it (:meth:`put`) count as a
    use.  When the cache is full, inserting a new key evicts the entry that was
    used least recently.  :meth:`peek` reads without counting as a use.
    """

    def __init__(self, maxsize: int = 128, on_evict: Callable[[Hashable, Any], None] | None = None):
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self.stats = CacheStats()
        self._on_evict = on_evict
        self._data: OrderedDict[Hashable, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used."""
        return list(self._data)

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self.stats.misses += 1
            return default
        self.stats.hits += 1
        self._data.move_to_end(key)
        return value

    def peek(self, key: Hashable, default: Any = None) -> Any:
        return self._data.get(key, default)

    def put(self, key: Hashable, value: Any) -> None:
        if key in self._data:
            self._data[key] = value
            return
        self._data[key] = value
        while len(self._data) > self.maxsize:
            old_key, old_value = self._data.popitem(last=False)
            self.stats.evictions += 1
            if self._on_evict is not None:
                self._on_evict(old_key, old_value)

    def pop(self, key: Hashable, default: Any = _MISSING) -> Any:
        if default is _MISSING:
            return self._data.pop(key)
        return self._data.pop(key, default)

    def clear(self) -> None:
        self._data.clear()
