"""Greedy word wrapping.

The algorithm is the classic first-fit: words are appended to the current line
while they fit, and a new line is started otherwise.  Runs of whitespace in the
input collapse to a single space in the output.
"""

from __future__ import annotations


def _chop(word: str, width: int) -> list[str]:
    """Break ``word`` into pieces of at most ``width`` characters."""
    return [word[i : i + width] for i in range(0, len(word), width)]


def _pieces(words: list[str], width: int, break_long_words: bool) -> list[str]:
    out: list[str] = []
    for word in words:
        if break_long_words and len(word) > width:
            out.extend(_chop(word, width))
        else:
            out.append(word)
    return out


def wrap(text: str, width: int = 70, *, break_long_words: bool = True) -> list[str]:
    """Wrap ``text`` into a list of lines, each at most ``width`` characters long.

    Words longer than ``width`` are chopped into pieces when ``break_long_words``
    is true; otherwise they are put on a line of their own (which is then the
    only kind of line allowed to exceed ``width``).
    """
    if width <= 0:
        raise ValueError(f"width must be positive, got {width!r}")

    lines: list[str] = []
    current: list[str] = []
    current_len = 0
    for piece in _pieces(text.split(), width, break_long_words):
        if not current:
            current, current_len = [piece], len(piece)
            continue
        candidate = current_len + 1 + len(piece)
        if candidate >= width:
            lines.append(" ".join(current))
            current, current_len = [piece], len(piece)
        else:
            current.append(piece)
            current_len = candidate
    if current:
        lines.append(" ".join(current))
    return lines


def fill(text: str, width: int = 70, *, break_long_words: bool = True) -> str:
    """Like :func:`wrap` but return a single string with newline separators."""
    return "\n".join(wrap(text, width, break_long_words=break_long_words))
