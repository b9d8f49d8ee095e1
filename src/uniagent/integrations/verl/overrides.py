"""Reading hydra override lists (`a.b=1`, `+a.b=1`, `++a.b=1`, `~a.b`): what `launch.py` builds and
`host.py` checks, kept apart so neither imports the other."""

from __future__ import annotations


def override_key(override: str) -> str:
    """The config key an override sets (`+a.b=1`, `++a.b=1`, `~a.b` all set `a.b`)."""
    return override.split("=", 1)[0].lstrip("+~")


def override_value(overrides: list[str], key: str) -> str | None:
    """The value the last override of `key` sets (quotes stripped), or None."""
    found = None
    for item in overrides:
        if override_key(item) == key:
            found = None if item.startswith("~") else item.partition("=")[2].strip().strip("'\"")
    return found
