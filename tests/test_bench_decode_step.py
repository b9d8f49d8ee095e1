"""bench/decode_step.py at a tiny size: 2 rows over 16 keys, 4 tokens, one repeat of plain against packed
weights in the same real engine (bf16 where the CPU lays it out, fp32 everywhere); the figures it prints
and its exit status."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import decode_step  # noqa: E402
from uniagent.models import linear  # noqa: E402

pytestmark = pytest.mark.slow


ARGV = ["--rows", "2", "--contexts", "16", "--new-tokens", "4", "--repeats", "1", "--goal", "0"]


def _rows(capsys) -> list[dict]:
    return [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]


def test_a_cpu_that_cannot_lay_out_says_so(capsys, monkeypatch):
    monkeypatch.setattr(linear, "supported", lambda *a: False)
    monkeypatch.setattr(linear, "choice", lambda *a, **k: linear.LinearChoice(why="cannot lay out"))
    assert decode_step.main(ARGV) == 0
    (row,) = _rows(capsys)
    assert row["figure"] == "skipped" and "cannot lay out" in row["reason"]


@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(
            "bfloat16",
            marks=pytest.mark.skipif(
                not linear.supported(), reason="this CPU cannot lay out bf16 weights (no AVX-512)"
            ),
        ),
        "float32",
    ],
)
def test_tiny_decode_step_bench_prints_both_sides(capsys, dtype):
    assert decode_step.main([*ARGV, "--dtype", dtype]) == 0
    rows = _rows(capsys)
    steps = {r["side"]: r for r in rows if r["figure"] == "decode_step_ms"}
    assert set(steps) == {"plain", "packed"} and all(s["value"]["median"] > 0 for s in steps.values())
    ratio = next(r for r in rows if r["figure"] == "packed_vs_plain")
    assert ratio["value"]["median"] > 0 and ratio["met"] is True and ratio["layers"] == 30 * 7 + 1
    assert ratio["dtype"] == dtype
    assert all(r["value"]["median"] > 0 for r in rows if r["figure"] == "decode_bandwidth_util")
