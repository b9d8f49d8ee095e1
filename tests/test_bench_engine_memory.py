"""bench/engine_memory.py at a tiny size: one level (2 starter tasks, concurrency 2, one short turn)
through a real `uniagent run` with the local model; the figures it prints and its exit status. The
4 / 18 / 64 levels are the bench's job, not a test's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import needs_bwrap

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import engine_memory  # noqa: E402


def test_budget_is_read_from_the_engine_start_line():
    line = (
        "local engine memory budget 5.40 GiB (50% of 10.80 GiB (MemAvailable)); kept prefixes up to 1.35 GiB"
    )
    assert engine_memory._budget_bytes(line) == int(5.40 * 1024**3)
    assert engine_memory._budget_bytes("no such line") is None
    argv = engine_memory.command(64, engine_memory.build_parser().parse_args([]), Path("out"))
    assert argv[argv.index("--concurrency") + 1] == "64" and argv[argv.index("--samples") + 1] == "4"


@pytest.mark.slow
@needs_bwrap
def test_tiny_level_completes_within_the_budget(tmp_path, capsys):
    argv = [
        "--levels",
        "2",
        "--limit",
        "2",
        "--max-tokens",
        "4",
        "--max-turns",
        "1",
        "--output",
        str(tmp_path),
    ]
    assert engine_memory.main(argv) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    got = {f["figure"]: f for f in lines if f.get("concurrency") == 2}
    assert got["episodes"]["value"] == got["episodes"]["planned"] == 2
    assert got["exit_code"]["value"] == 0 and got["within_budget"]["value"] is True
    assert got["peak_rss_mb"]["value"] > 0 and got["peak_rss_mb"]["budget_mb"] > 0
    assert got["tokens_per_s"]["value"] > 0 and got["wall_s"]["value"] > 0
    assert "memory budget" in got["memory_budget"]["value"]
