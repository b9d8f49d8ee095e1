"""Hand out unique slugs, e.g. for blog posts that share a title."""

from __future__ import annotations

from slugger.core import slugify


class SlugRegistry:
    """Remember issued slugs and disambiguate collisions with a numeric suffix."""

    def __init__(self, *, separator: str = "-", max_length: int | None = None) -> None:
        self._separator = separator
        self._max_length = max_length
        self._taken: set[str] = set()

    def __contains__(self, slug: str) -> bool:
        return slug in self._taken

    def __len__(self) -> int:
        return len(self._taken)

    def claim(self, title: str) -> str:
        """Return a slug for ``title`` that has not been handed out before."""
        base = slugify(title, separator=self._separator, max_length=self._max_length) or "item"
        candidate = base
        n = 2
        while candidate in self._taken:
            candidate = f"{base}{self._separator}{n}"
            n += 1
        self._taken.add(candidate)
        return candidate

    def release(self, slug: str) -> None:
        """Make ``slug`` available again; unknown slugs are ignored."""
        self._taken.discard(slug)
