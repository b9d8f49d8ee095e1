"""Descriptive statistics.

:func:`percentile` uses linear interpolation between closest ranks (the same
definition as spreadsheet ``PERCENTILE.INC`` and NumPy's default): the
0th percentile is the minimum, the 100th is the maximum, and the 50th is the
median.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


def _values(data: Iterable[float]) -> list[float]:
    values = sorted(float(x) for x in data)
    if not values:
        raise ValueError("statistics of an empty sample are undefined")
    if any(math.isnan(v) for v in values):
        raise ValueError("sample contains NaN")
    return values


def mean(data: Iterable[float]) -> float:
    values = _values(data)
    return math.fsum(values) / len(values)


def median(data: Iterable[float]) -> float:
    values = _values(data)
    mid = len(values) // 2
    if len(values) % 2:
        return values[mid]
    return (values[mid - 1] + values[mid]) / 2


def percentile(data: Iterable[float], p: float) -> float:
    """The ``p``-th percentile (``0 <= p <= 100``) of ``data``."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {p}")
    values = _values(data)
    rank = p / 100 * len(values)
    lower = math.floor(rank)
    upper = min(lower + 1, len(values) - 1)
    fraction = rank - lower
    return values[lower] + (values[upper] - values[lower]) * fraction


def iqr(data: Iterable[float]) -> float:
    """Interquartile range: 75th minus 25th percentile."""
    values = _values(data)
    return percentile(values, 75) - percentile(values, 25)


@dataclass(frozen=True)
class Summary:
    count: int
    mean: float
    minimum: float
    q1: float
    median: float
    q3: float
    maximum: float


def summarize(data: Iterable[float]) -> Summary:
    values = _values(data)
    return Summary(
        count=len(values),
        mean=mean(values),
        minimum=values[0],
        q1=percentile(values, 25),
        median=median(values),
        q3=percentile(values, 75),
        maximum=values[-1],
    )
