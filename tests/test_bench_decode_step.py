"""bench/decode_step.py at a tiny size: 2 rows over 16 keys, 4 tokens, one repeat of plain against packed
weights in the same real bf16 engine; the figures it prints and its exit status."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import decode_step  # noqa: E402

pytestmark = pytest.mark.slow


def test_tiny_decode_step_bench_prints_both_sides(capsys):
    argv = ["--rows", "2", "--contexts", "16", "--new-tokens", "4", "--repeats", "1", "--goal", "0"]
    assert decode_step.main(argv) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    steps = {r["side"]: r for r in rows if r["figure"] == "decode_step_ms"}
    assert set(steps) == {"plain", "packed"} and all(s["value"]["median"] > 0 for s in steps.values())
    ratio = next(r for r in rows if r["figure"] == "packed_vs_plain")
    assert ratio["value"]["median"] > 0 and ratio["met"] is True and ratio["layers"] == 30 * 7 + 1
    assert all(r["value"]["median"] > 0 for r in rows if r["figure"] == "decode_bandwidth_util")
