"""Pagination of in-memory sequences.

Pages are numbered from 1.  An empty sequence still has exactly one (empty)
page, so that listing views can always render page 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class PageNotFound(LookupError):
    """Requested page number is outside ``1..total_pages``."""


@dataclass(frozen=True)
class Page:
    items: list[Any]
    number: int
    per_page: int
    total_items: int
    total_pages: int

    @property
    def has_next(self) -> bool:
        return self.number < self.total_pages

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def start_index(self) -> int:
        """1-based index of the first item on this page (0 if the page is empty)."""
        return (self.number - 1) * self.per_page + 1 if self.items else 0

    @property
    def end_index(self) -> int:
        """1-based index of the last item on this page (0 if the page is empty)."""
        return self.start_index + len(self.items) - 1 if self.items else 0


def _total_pages(total_items: int, per_page: int) -> int:
    return total_items // per_page + 1


def paginate(items: Sequence[Any], page: int = 1, per_page: int = 20) -> Page:
    """Return page ``page`` of ``items``."""
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    total_pages = _total_pages(len(items), per_page)
    if not 1 <= page <= total_pages:
        raise PageNotFound(f"page {page} not in 1..{total_pages}")
    offset = (page - 1) * per_page
    return Page(
        items=list(items[offset : offset + per_page]),
        number=page,
        per_page=per_page,
        total_items=len(items),
        total_pages=total_pages,
    )
