"""Month arithmetic on :class:`datetime.date`.

Adding months keeps the day of month when possible and clamps it to the last
day of the target month otherwise (Jan 31 + 1 month = Feb 28 or Feb 29).
"""

from __future__ import annotations

import calendar
from datetime import date


def end_of_month(d: date) -> date:
    """The last day of ``d``'s month."""
    return d.replace(day=calendar.monthrange(d.year, d.month)[1])


def add_months(d: date, months: int) -> date:
    """Shift ``d`` by ``months`` calendar months (negative values go back)."""
    index = d.month - 1 + months
    year = d.year + index // 12
    month = index % 12 + 1
    if not 1 <= year <= 9999:
        raise OverflowError(f"year {year} is out of range")
    last_day = calendar.monthrange(d.year, month)[1]
    return d.replace(year=year, month=month, day=min(d.day, last_day))


def months_between(start: date, end: date) -> int:
    """Number of whole months from ``start`` to ``end`` (negative if ``end`` is earlier).

    A month is complete when the day of month is reached again, or when the
    target month is too short to contain that day and its last day is reached.
    """
    if end < start:
        return -months_between(end, start)
    months = (end.year - start.year) * 12 + (end.month - start.month)
    if months and add_months(start, months) > end:
        months -= 1
    return months
