"""Parser for ``key = value`` files.

Format:

* one ``key = value`` pair per line; blank lines are ignored;
* ``#`` starts a comment that runs to the end of the line, unless it is inside
  a double-quoted value;
* values may be double-quoted, in which case the escapes ``\\n``, ``\\t``,
  ``\\"`` and ``\\\\`` are recognised; unquoted values are taken literally
  (surrounding whitespace removed);
* a later assignment to the same key wins.
"""

from __future__ import annotations

import re

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_ESCAPES = {"\\n": "\n", "\\t": "\t", '\\"': '"', "\\\\": "\\"}


class ParseError(ValueError):
    def __init__(self, lineno: int, message: str) -> None:
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


def _strip_comment(line: str) -> str:
    return line.split("#", 1)[0]


def _unquote(raw: str, lineno: int) -> str:
    if not raw.startswith('"'):
        return raw
    if len(raw) < 2 or not raw.endswith('"') or raw.endswith('\\"') and not raw.endswith('\\\\"'):
        raise ParseError(lineno, "unterminated string")
    body = raw[1:-1]
    for seq, replacement in _ESCAPES.items():
        body = body.replace(seq, replacement)
    return body


def loads(text: str) -> dict[str, str]:
    """Parse settings ``text`` into a dict of strings."""
    result: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = _strip_comment(line).strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep:
            raise ParseError(lineno, f"expected 'key = value', got {line!r}")
        if not _KEY.match(key):
            raise ParseError(lineno, f"invalid key {key!r}")
        result[key] = _unquote(value.strip(), lineno)
    return result
