"""Wildcard matching.

Supported syntax (the whole name must match):

* ``*``      any run of characters, including none
* ``?``      exactly one character
* ``[abc]``  one character from the set; ranges like ``[a-z]`` are allowed
* ``[!abc]`` one character not in the set
* ``\\x``    the character ``x`` literally

Matching is case-sensitive unless ``ignore_case`` is given.
"""

from __future__ import annotations

from collections.abc import Iterable


def _parse_class(pattern: str, start: int) -> tuple[set[str], bool, int] | None:
    """Parse ``[...]`` at ``pattern[start]``; return (chars, negated, index after ``]``)."""
    i = start + 1
    negated = i < len(pattern) and pattern[i] == "!"
    if negated:
        i += 1
    chars: set[str] = set()
    first = True
    while i < len(pattern) and (pattern[i] != "]" or first):
        first = False
        if i + 2 < len(pattern) and pattern[i + 1] == "-" and pattern[i + 2] != "]":
            lo, hi = pattern[i], pattern[i + 2]
            chars.update(chr(c) for c in range(ord(lo), ord(hi) + 1))
            i += 3
        else:
            chars.add(pattern[i])
            i += 1
    if i >= len(pattern):
        return None  # no closing bracket: treat "[" literally
    return chars, negated, i + 1


def _match(pattern: str, text: str) -> bool:
    if not pattern:
        return not text
    if not text:
        return False
    head = pattern[0]
    if head == "*":
        rest = pattern.lstrip("*")
        return any(_match(rest, text[k:]) for k in range(len(text) + 1))
    if head == "?":
        return _match(pattern[1:], text[1:])
    if head == "[":
        parsed = _parse_class(pattern, 0)
        if parsed is not None:
            chars, negated, after = parsed
            if (text[0] in chars) == negated:
                return False
            return _match(pattern[after:], text[1:])
    if head == "\\" and len(pattern) > 1:
        return text[0] == pattern[1] and _match(pattern[2:], text[1:])
    return text[0] == head and _match(pattern[1:], text[1:])


def match(pattern: str, name: str, *, ignore_case: bool = False) -> bool:
    """Return True if ``name`` matches the wildcard ``pattern``."""
    if ignore_case:
        pattern, name = pattern.casefold(), name.casefold()
    return _match(pattern, name)


def match_any(patterns: Iterable[str], name: str, *, ignore_case: bool = False) -> bool:
    """True if ``name`` matches at least one of ``patterns``."""
    return any(match(p, name, ignore_case=ignore_case) for p in patterns)


def filter_names(names: Iterable[str], pattern: str, *, ignore_case: bool = False) -> list[str]:
    """The elements of ``names`` that match ``pattern``, in their original order."""
    return [n for n in names if match(pattern, n, ignore_case=ignore_case)]
