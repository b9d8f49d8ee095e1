"""Slug generation.

A slug is lowercase ASCII letters and digits separated by single hyphens, with
no leading or trailing hyphen.  Accented Latin letters are folded to their
unaccented base letter ("é" -> "e"); characters with no ASCII equivalent are
dropped.
"""

from __future__ import annotations

import re
import unicodedata

_SEPARATORS = re.compile(r"[\s_\-./:]+")
_DISALLOWED = re.compile(r"[^a-z0-9-]+")
_HYPHEN_RUNS = re.compile(r"-{2,}")

# Replacements applied before folding, for things that are words rather than letters.
_SYMBOL_WORDS = {
    "&": " and ",
    "@": " at ",
    "%": " percent ",
    "+": " plus ",
}


def _replace_symbols(text: str) -> str:
    for symbol, word in _SYMBOL_WORDS.items():
        text = text.replace(symbol, word)
    return text


def _ascii_fold(text: str) -> str:
    """Fold ``text`` to ASCII, keeping base letters of accented characters."""
    normalized = unicodedata.normalize("NFC", text)
    return normalized.encode("ascii", "ignore").decode("ascii")


def slugify(text: str, *, separator: str = "-", max_length: int | None = None) -> str:
    """Return a slug for ``text``.

    ``max_length`` truncates the slug at a word boundary when possible.
    ``separator`` replaces the hyphen in the final result.
    """
    if max_length is not None and max_length < 1:
        raise ValueError("max_length must be at least 1")
    slug = _ascii_fold(_replace_symbols(text)).lower()
    slug = _SEPARATORS.sub("-", slug)
    slug = _DISALLOWED.sub("", slug)
    slug = _HYPHEN_RUNS.sub("-", slug).strip("-")
    if max_length is not None and len(slug) > max_length:
        cut = slug[:max_length]
        if "-" in cut and slug[max_length] != "-":
            cut = cut.rsplit("-", 1)[0]
        slug = cut.rstrip("-")
    if separator != "-":
        slug = slug.replace("-", separator)
    return slug
