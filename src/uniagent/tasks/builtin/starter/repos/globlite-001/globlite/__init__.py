"""Shell-style wildcard matching for single file names."""

from globlite.match import filter_names, match, match_any

__all__ = ["filter_names", "match", "match_any"]
