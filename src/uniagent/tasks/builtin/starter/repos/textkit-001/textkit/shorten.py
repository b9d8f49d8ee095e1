"""Collapse and truncate text to fit a given width."""

from __future__ import annotations

from textkit.wrap import wrap


def shorten(text: str, width: int, placeholder: str = " [...]") -> str:
    """Collapse whitespace in ``text`` and truncate it to ``width`` characters.

    Whole words are kept; if anything had to be dropped, ``placeholder`` is
    appended, and the result (placeholder included) never exceeds ``width``.
    """
    collapsed = " ".join(text.split())
    if len(collapsed) <= width:
        return collapsed
    room = width - len(placeholder.lstrip())
    if room <= 0:
        raise ValueError("placeholder too large for the requested width")
    lines = wrap(collapsed, width - len(placeholder), break_long_words=False)
    head = lines[0] if lines else ""
    if len(head) > width - len(placeholder):
        return placeholder.lstrip()
    return head + placeholder
