"""Parsing and formatting of durations.

A duration is a sequence of ``<integer><unit>`` groups, optionally separated
by whitespace, e.g. ``"2d 4h"``, ``"1h30m"`` or ``"90s"``.  Units: ``w``
(weeks), ``d``, ``h``, ``m``, ``s``; they are case-insensitive and may be
written out (``"2 hours"``, ``"1 min"``).

Every malformed input raises :class:`DurationError`, a subclass of
``ValueError``, so callers validating user input only need to catch one
exception type.
"""

from __future__ import annotations

import re

_UNIT_SECONDS = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}
_ALIASES = {
    "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "min": "m", "mins": "m", "minute": "m", "minutes": "m",
    "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "day": "d", "days": "d",
    "week": "w", "weeks": "w",
}  # fmt: skip
_GROUP = re.compile(r"(\d+)\s*([A-Za-z]+)")


class DurationError(ValueError):
    """Raised for text that is not a valid duration."""


def _unit_seconds(unit: str) -> int:
    unit = unit.lower()
    return _UNIT_SECONDS[_ALIASES.get(unit, unit)]


def parse_duration(text: str) -> int:
    """Return the number of seconds described by ``text``."""
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    text = text.strip()
    total = 0
    pos = 0
    for group in _GROUP.finditer(text):
        if text[pos : group.start()].strip():
            raise DurationError(f"unexpected {text[pos:group.start()].strip()!r} in {text!r}")
        amount, unit = group.groups()
        total += int(amount) * _unit_seconds(unit)
        pos = group.end()
    if text[pos:].strip():
        raise DurationError(f"unexpected {text[pos:].strip()!r} in {text!r}")
    return total


def format_duration(seconds: int) -> str:
    """Format ``seconds`` compactly, largest unit first: ``5400 -> "1h30m"``."""
    if seconds < 0:
        raise ValueError("durations cannot be negative")
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in _UNIT_SECONDS.items():
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
