"""Compact page navigation such as ``1 ... 4 5 [6] 7 8 ... 20``."""

from __future__ import annotations

from pager.paginate import Page


def page_links(page: Page, window: int = 2) -> list[int | None]:
    """Page numbers to show around ``page``; ``None`` marks an ellipsis.

    The first and last pages are always shown, plus ``window`` pages on either
    side of the current one.
    """
    last = page.total_pages
    wanted = {1, last, *range(page.number - window, page.number + window + 1)}
    numbers = sorted(n for n in wanted if 1 <= n <= last)
    links: list[int | None] = []
    for n in numbers:
        if links and n - links[-1] > 1:  # type: ignore[operator]
            links.append(None)
        links.append(n)
    return links
