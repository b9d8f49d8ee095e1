"""Small text helpers shared by the tool-call formats."""

from __future__ import annotations

SNIPPET = 80


def snippet(text: str) -> str:
    """A short quoted excerpt of model output for error messages (the model reads these)."""
    text = text.strip()
    return repr(text if len(text) <= SNIPPET else text[:SNIPPET] + "…")


def skip_ws(text: str, pos: int) -> int:
    """Index of the first non-whitespace character at or after `pos`."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
