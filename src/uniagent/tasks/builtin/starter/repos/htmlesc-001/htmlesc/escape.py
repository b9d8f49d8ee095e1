"""Escaping and unescaping of HTML special characters.

``unescape(escape(s)) == s`` holds for every string ``s``.
"""

from __future__ import annotations

import re

_ESCAPES = [
    ("&", "&amp;"),
    ("<", "&lt;"),
    (">", "&gt;"),
    ('"', "&quot;"),
    ("'", "&#x27;"),
]
_NUMERIC = re.compile(r"&#(x[0-9a-fA-F]+|[0-9]+);")


class Markup(str):
    """A string that is already safe HTML and must not be escaped again."""

    def __html__(self) -> str:
        return str(self)


def escape(value: object, *, quote: bool = True) -> Markup:
    """Escape ``&``, ``<``, ``>`` (and quotes unless ``quote=False``)."""
    if hasattr(value, "__html__"):
        return Markup(value.__html__())
    text = str(value)
    for char, entity in _ESCAPES:
        if not quote and char in "\"'":
            continue
        text = text.replace(char, entity)
    return Markup(text)


def _numeric(match: re.Match[str]) -> str:
    ref = match.group(1)
    code = int(ref[1:], 16) if ref[0] in "xX" else int(ref)
    try:
        return chr(code)
    except (ValueError, OverflowError):
        return match.group(0)


def unescape(text: str) -> str:
    """Turn the named entities produced by :func:`escape`, and numeric references, back into text."""
    for char, entity in _ESCAPES:
        text = text.replace(entity, char)
    return _NUMERIC.sub(_numeric, text)
