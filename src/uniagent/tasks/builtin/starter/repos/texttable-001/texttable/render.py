"""Render a list of rows as an aligned table.

Example::

    >>> print(render(["fruit", "qty"], [["apple", 3], ["kiwi", 120]]))
    fruit | qty
    ------+----
    apple |   3
    kiwi  | 120

Numbers are right-aligned, everything else is left-aligned.  Floats are shown
with ``float_digits`` decimals and ``None`` as an empty cell.  Column
separators line up on every line, the header and the rule included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_cell(value: Any, float_digits: int = 2) -> str:
    """The text shown for ``value`` in a cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{float_digits}f}"
    return str(value).replace("\n", " ")


def _is_numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _column_widths(rows: Sequence[Sequence[Any]], columns: int) -> list[int]:
    return [max(len(str(row[i])) for row in rows) for i in range(columns)]


def _check_shape(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    for n, row in enumerate(rows, start=1):
        if len(row) != len(headers):
            raise ValueError(f"row {n} has {len(row)} cells, expected {len(headers)}")


def render(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    float_digits: int = 2,
    separator: str = " | ",
) -> str:
    """Return the table as a single string (no trailing newline)."""
    if not headers:
        raise ValueError("a table needs at least one column")
    _check_shape(headers, rows)
    widths = _column_widths(rows, len(headers))

    def line(cells: Sequence[str], numeric: Sequence[bool]) -> str:
        padded = [
            cell.rjust(w) if num else cell.ljust(w)
            for cell, w, num in zip(cells, widths, numeric)
        ]
        return separator.join(padded).rstrip()

    out = [line(list(headers), [False] * len(headers))]
    rule_joint = separator.replace(" ", "-").replace("|", "+")
    out.append(rule_joint.join("-" * w for w in widths))
    for row in rows:
        cells = [format_cell(v, float_digits) for v in row]
        out.append(line(cells, [_is_numeric(v) for v in row]))
    return "\n".join(out)
