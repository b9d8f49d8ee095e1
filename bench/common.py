"""What every bench shares: one JSON line per figure, and the median and spread of repeats.

Why one place: each bench prints the same line shape (`bench`, `figure`, `value`, `unit`, context) that
the docs' tables and the smoke tests read, and each reports repeats the same way (median, min, max,
every run), so a reader compares figures across benches without learning each script's format.
"""

from __future__ import annotations

import json
import statistics
from typing import Any


def emit(bench: str, figure: str, value: Any, unit: str | None = None, **context: Any) -> dict[str, Any]:
    """Print one figure as a JSON line on stdout (logs go to stderr) and return it."""
    row = {"bench": bench, "figure": figure, "value": value, "unit": unit, **context}
    print(json.dumps(row), flush=True)
    return row


def spread(runs: list[float], digits: int = 3) -> dict[str, Any]:
    """The median of repeats with their spread: `{"median", "min", "max", "runs"}`."""
    if not runs:
        raise ValueError("no runs to summarise")
    return {
        "median": round(statistics.median(runs), digits),
        "min": round(min(runs), digits),
        "max": round(max(runs), digits),
        "runs": [round(r, digits) for r in runs],
    }
