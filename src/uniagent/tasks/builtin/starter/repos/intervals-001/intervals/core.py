"""Closed intervals ``[start, end]`` and a few classic algorithms on them.

Two intervals that share an endpoint (``[1, 3]`` and ``[3, 5]``) overlap,
because both are closed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class Interval(NamedTuple):
    start: float
    end: float

    @classmethod
    def of(cls, start: float, end: float) -> Interval:
        if end < start:
            raise ValueError(f"interval end {end} is before its start {start}")
        return cls(start, end)

    @property
    def length(self) -> float:
        return self.end - self.start

    def overlaps(self, other: Interval) -> bool:
        return self.start <= other.end and other.start <= self.end


def _coerce(items: Iterable[Interval | tuple[float, float]]) -> list[Interval]:
    return [Interval.of(*item) for item in items]


def _ordered(items: list[Interval]) -> list[Interval]:
    """Sort intervals by where they finish (ties: by where they start)."""
    return sorted(items, key=lambda iv: (iv.end, iv.start))


def max_disjoint(items: Iterable[Interval | tuple[float, float]]) -> list[Interval]:
    """Pick a largest set of pairwise non-overlapping intervals.

    Greedy interval scheduling: always keep the interval that finishes first.
    """
    chosen: list[Interval] = []
    for iv in _ordered(_coerce(items)):
        if not chosen or iv.start > chosen[-1].end:
            chosen.append(iv)
    return chosen


def merge(items: Iterable[Interval | tuple[float, float]]) -> list[Interval]:
    """Merge overlapping intervals; the result is sorted and pairwise disjoint."""
    merged: list[Interval] = []
    for iv in _ordered(_coerce(items)):
        if merged and iv.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, iv.end))
        else:
            merged.append(iv)
    return merged


def total_length(items: Iterable[Interval | tuple[float, float]]) -> float:
    """Length of the union of ``items`` (overlaps are counted once)."""
    return sum(iv.length for iv in merge(items))


def gaps(
    items: Iterable[Interval | tuple[float, float]], lo: float, hi: float
) -> list[Interval]:
    """Parts of ``[lo, hi]`` not covered by any of ``items``."""
    if hi < lo:
        raise ValueError("hi must not be smaller than lo")
    result: list[Interval] = []
    cursor = lo
    for iv in merge(items):
        if iv.end < lo or iv.start > hi:
            continue
        if iv.start > cursor:
            result.append(Interval(cursor, iv.start))
        cursor = max(cursor, iv.end)
    if cursor < hi:
        result.append(Interval(cursor, hi))
    return result
