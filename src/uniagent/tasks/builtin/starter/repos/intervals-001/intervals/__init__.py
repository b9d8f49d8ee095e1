"""Operations on closed numeric intervals."""

from intervals.core import Interval, gaps, max_disjoint, merge, total_length

__all__ = ["Interval", "gaps", "max_disjoint", "merge", "total_length"]
