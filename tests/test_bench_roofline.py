"""bench/roofline.py at a tiny size: the peaks it measures, the fractions other benches report with
them, and the FLOP count of the packaged model checked against its parameter count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # the bench's modules import each other as scripts do

import roofline  # noqa: E402


def test_script_prints_a_peak_per_dtype_and_the_bandwidth():
    out = subprocess.run(
        [sys.executable, str(BENCH / "roofline.py"), "--seconds", "0.02"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines()]
    peaks = {r.get("dtype", r["figure"]): r for r in rows}
    assert peaks["fp32"]["value"] > 1 and peaks["bf16"]["value"] > 1
    assert peaks["memory_gbps"]["value"] > 0.1
    assert all(r["bench"] == "roofline" and r["threads"] >= 1 for r in rows)


def test_fractions_divide_by_the_matching_peak():
    peak = {"fp32_gflops": 100.0, "bf16_gflops": 800.0, "memory_gbps": 10.0}
    assert roofline.mfu(50e9, 1.0, "float32", peak) == 0.5
    assert roofline.mfu(400e9, 1.0, "bfloat16", peak) == 0.5
    assert roofline.bandwidth_util(5e9, 1.0, peak) == 0.5
    assert roofline.mfu(1.0, 1.0, "int4", peak) is None
    # bf16 emulated (AVX2-only): widened operands run at the fp32 rate, so that is bf16's ceiling
    slow = {"fp32_gflops": 100.0, "bf16_gflops": 1.0}
    assert roofline.mfu(50e9, 1.0, "bfloat16", slow) == 0.5 and roofline.ceiling(slow, "bf16") == 100.0


def test_a_dtype_far_slower_than_the_first_shape_allows_skips_the_large_shape(monkeypatch):
    timed = []
    monkeypatch.setattr(roofline, "_rate", lambda fn, work, seconds: timed.append(work) or 1.0)
    rate, shape = roofline.matmul_gflops("fp32", 0.02, shapes=((8, 8, 8), (4096, 2048, 2048)))
    assert (rate, shape, len(timed)) == (1.0, [8, 8, 8], 1)


def test_flops_of_the_packaged_model_are_two_per_weight_per_token():
    from transformers import AutoConfig

    from uniagent.models.loading import smollm2_hf_dirs

    config = AutoConfig.from_pretrained(smollm2_hf_dirs()[0])
    per_token = roofline.transformer_flops(config, 1)
    # SmolLM2-135M: ~135M weights with the tied embedding counted once as the lm head.
    assert per_token == pytest.approx(2 * 135e6, rel=0.05)
    assert roofline.transformer_flops(config, 1, train=True) == 3 * per_token
    assert roofline.transformer_flops(config, 10, context=100) > 10 * per_token
