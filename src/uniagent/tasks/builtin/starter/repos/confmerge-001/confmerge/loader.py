"""Build a configuration dictionary from the defaults and user input.

Every call to :func:`load` returns a fresh, independent dictionary: callers may
modify it freely without affecting the defaults, the overrides they passed in,
or the result of any other call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confmerge.defaults import DEFAULTS

ENV_PREFIX = "APP_"


def deep_merge(base: dict, override: Mapping) -> dict:
    """Recursively merge ``override`` into ``base`` (in place) and return ``base``.

    Nested mappings are merged key by key; any other value in ``override``
    replaces the one in ``base``.
    """
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = value
    return base


def _coerce(raw: str) -> Any:
    lowered = raw.strip().lower()
    if lowered in {"true", "yes", "on"}:
        return True
    if lowered in {"false", "no", "off"}:
        return False
    if lowered in {"null", "none"}:
        return None
    try:
        return int(lowered)
    except ValueError:
        return raw


def _apply_env(config: dict, env: Mapping[str, str]) -> None:
    """Apply ``APP_SECTION__KEY=value`` variables; ``__`` separates nesting levels."""
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        if len(path) < 2 or not all(path):
            continue
        node = config
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = _coerce(raw)


def load(overrides: Mapping | None = None, env: Mapping[str, str] | None = None) -> dict:
    """Return the effective configuration."""
    config = dict(DEFAULTS)
    if overrides:
        deep_merge(config, overrides)
    if env:
        _apply_env(config, env)
    return config
