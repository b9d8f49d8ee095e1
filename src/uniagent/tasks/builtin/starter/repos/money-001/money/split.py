"""Split an amount of cents without losing or inventing a cent."""

from __future__ import annotations

from collections.abc import Sequence


def split_evenly(cents: int, parts: int) -> list[int]:
    """Split ``cents`` into ``parts`` shares that differ by at most one cent.

    The larger shares come first, and the shares always add up to ``cents``.
    """
    if parts < 1:
        raise ValueError("parts must be at least 1")
    base, extra = divmod(abs(cents), parts)
    shares = [base + 1] * extra + [base] * (parts - extra)
    return [-s for s in shares] if cents < 0 else shares


def allocate(cents: int, weights: Sequence[int]) -> list[int]:
    """Split ``cents`` proportionally to integer ``weights`` (largest remainder)."""
    if not weights or any(w < 0 for w in weights) or sum(weights) == 0:
        raise ValueError("weights must be non-negative and not all zero")
    total = sum(weights)
    raw = [cents * w for w in weights]
    shares = [r // total for r in raw]
    leftover = cents - sum(shares)
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(raw[i] % total), i))
    for i in by_remainder[:leftover]:
        shares[i] += 1
    return shares
