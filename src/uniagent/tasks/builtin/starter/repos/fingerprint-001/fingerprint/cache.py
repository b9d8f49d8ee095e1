"""Memoise expensive computations by the fingerprint of their parameters."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fingerprint.keys import fingerprint


class ResultCache:
    def __init__(self) -> None:
        self._results: dict[str, Any] = {}
        self.computed = 0

    def __len__(self) -> int:
        return len(self._results)

    def key(self, params: Mapping[str, Any]) -> str:
        return fingerprint(dict(params))

    def get_or_compute(self, params: Mapping[str, Any], compute: Callable[..., Any]) -> Any:
        """Return the cached result for ``params`` or call ``compute(**params)``."""
        key = self.key(params)
        if key not in self._results:
            self._results[key] = compute(**params)
            self.computed += 1
        return self._results[key]

    def invalidate(self, params: Mapping[str, Any]) -> bool:
        return self._results.pop(self.key(params), None) is not None
