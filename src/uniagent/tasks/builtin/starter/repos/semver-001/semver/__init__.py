"""Semantic versions (https://semver.org): parsing, ordering, selection."""

from semver.select import latest, max_satisfying
from semver.version import Version

__all__ = ["Version", "latest", "max_satisfying"]
