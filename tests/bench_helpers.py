"""Run a bench script as `make bench` does, at a tiny size, and read the figures it prints.

Why shared: every bench smoke test (tests/test_bench_*.py) runs the real script and checks its JSON
lines the same way; a broken bench then fails CI, not the next person who runs `make bench`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run_bench(script: str, *args: str, timeout: float = 180) -> list[dict[str, Any]]:
    """Run `bench/<script>` with `args`; its figures, after checking it exited 0 and printed only
    well-formed figure lines of its own bench on stdout."""
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}: {done.stderr[-2000:]}"
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert rows, f"{script} printed no figures: {done.stderr[-2000:]}"
    name = Path(script).stem
    assert all(r["bench"] == name and "figure" in r and "value" in r for r in rows), rows
    return rows


def figures(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    """figure -> value, of the rows whose fields equal `match` (the last one wins)."""
    return {r["figure"]: r["value"] for r in rows if all(r.get(k) == v for k, v in match.items())}
