"""Canonical serialisation and hashing.

Two values that compare equal must get the same fingerprint, in this process
and in any other one (fingerprints are stored on disk and shared between
workers).  Supported values: ``None``, ``bool``, ``int``, ``float``, ``str``,
lists/tuples, sets/frozensets of those scalars, and dicts with string keys.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return {"__set__": list(value)}
    raise TypeError(f"cannot fingerprint values of type {type(value).__name__}")


def _check(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("non-finite floats have no canonical form")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"dict keys must be str, got {type(key).__name__}")
            _check(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _check(item)


def canonical_json(value: Any) -> str:
    """The canonical JSON text for ``value`` (compact, ASCII-only)."""
    _check(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, default=_default)


def fingerprint(value: Any, *, length: int = 16) -> str:
    """A hex digest of ``value``'s canonical form, truncated to ``length`` characters."""
    if not 8 <= length <= 64:
        raise ValueError("length must be between 8 and 64")
    digest = hashlib.sha256(canonical_json(value).encode("ascii")).hexdigest()
    return digest[:length]
