"""Billing periods built on top of month arithmetic."""

from __future__ import annotations

from datetime import date, timedelta

from datespan.months import add_months


def quarter_of(d: date) -> int:
    """Calendar quarter (1-4) that ``d`` falls in."""
    return (d.month - 1) // 3 + 1


def billing_periods(anchor: date, count: int, every: int = 1) -> list[tuple[date, date]]:
    """``count`` consecutive billing periods starting at ``anchor``.

    Each period is ``(first_day, last_day)`` inclusive and lasts ``every``
    months.  Renewal dates are always computed from the anchor, so a
    subscription that started on the 31st renews on the last day of short
    months and goes back to the 31st afterwards.
    """
    if count < 0 or every < 1:
        raise ValueError("count must be >= 0 and every >= 1")
    periods = []
    for i in range(count):
        first = add_months(anchor, i * every)
        last = add_months(anchor, (i + 1) * every) - timedelta(days=1)
        periods.append((first, last))
    return periods
