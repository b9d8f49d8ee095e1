"""Conversions between user-facing amounts and integer cents.

All arithmetic in this package is done on integer cents.  Amounts coming from
users (strings such as ``"1,299.95"`` or ``"$4.20"``, or floats from a JSON
payload) are converted exactly once, at the boundary, by :func:`to_cents`.
Rounding is commercial rounding: halves go away from zero.
"""

from __future__ import annotations

import re

_AMOUNT = re.compile(r"^(-)?\$?(\d+(?:\.\d*)?|\.\d+)$")


def _normalize(text: str) -> str:
    text = text.strip().replace(",", "").replace(" ", "")
    if text.startswith("-$"):
        text = "-" + text[2:]
    return text


def to_cents(amount: str | int | float) -> int:
    """Convert ``amount`` (in currency units) to integer cents.

    Strings may carry a leading ``$`` and thousands separators.  More than two
    decimal places are rounded to the nearest cent.
    """
    if isinstance(amount, bool):
        raise TypeError("booleans are not amounts")
    if isinstance(amount, int):
        return amount * 100
    if isinstance(amount, str):
        normalized = _normalize(amount)
        if not _AMOUNT.match(normalized):
            raise ValueError(f"not a valid amount: {amount!r}")
        amount = float(normalized.replace("$", ""))
    return int(round_amount(amount) * 100)


def round_amount(value: float, places: int = 2) -> float:
    """Round ``value`` to ``places`` decimals, halves away from zero."""
    if places < 0:
        raise ValueError("places must be non-negative")
    return round(value, places)


def format_cents(cents: int, symbol: str = "$") -> str:
    """Format integer cents as e.g. ``-$1,234.05``."""
    sign = "-" if cents < 0 else ""
    units, rest = divmod(abs(cents), 100)
    return f"{sign}{symbol}{units:,}.{rest:02d}"
