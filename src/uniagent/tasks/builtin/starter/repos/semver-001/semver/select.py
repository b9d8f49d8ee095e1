"""Pick versions out of a list of candidates."""

from __future__ import annotations

from collections.abc import Iterable

from semver.version import Version


def _versions(candidates: Iterable[str | Version]) -> list[Version]:
    return [c if isinstance(c, Version) else Version.parse(c) for c in candidates]


def latest(candidates: Iterable[str | Version], *, include_prereleases: bool = False) -> Version | None:
    """The highest version, ignoring pre-releases unless asked to include them."""
    pool = [v for v in _versions(candidates) if include_prereleases or not v.is_prerelease]
    return max(pool, default=None)


def max_satisfying(candidates: Iterable[str | Version], minimum: str, below: str) -> Version | None:
    """Highest candidate ``v`` with ``minimum <= v < below`` (pre-releases included)."""
    lo, hi = Version.parse(minimum), Version.parse(below)
    pool = [v for v in _versions(candidates) if lo <= v < hi]
    return max(pool, default=None)
