"""bench/mismatch.py at a tiny size (one episode, one turn, 8 new tokens): the logprob gap between the
engine that sampled and the trainer's fp32 recompute, with verl's own mismatch metrics. LocalEngine in
bf16 (the train/infer mismatch the bf16 engine brings) and llama-server (built under CI=true)."""

from __future__ import annotations

import pytest

from bench_helpers import figures, run_bench
from conftest import require
from uniagent.models.remote.llama_server import find_binary

TINY = ("--episodes", "1", "--max-turns", "1", "--max-tokens", "8")


def check(rows: list[dict]) -> dict:
    got = figures(rows)
    assert got["model_tokens"] == 8 and got["sequences"] == 1
    assert 0 <= got["logprob_abs_gap_mean"] <= got["logprob_abs_gap_max"] < 5
    assert "verl:rollout_corr/k3_kl" in got and "verl:training/rollout_probs_diff_mean" in got
    return got


@pytest.mark.slow
def test_tiny_bf16_local_engine_run_prints_the_gap_and_verl_s_metrics():
    rows = run_bench("mismatch.py", "--engine", "local", "--dtype", "bfloat16", "--tool-lines", "2", *TINY)
    got = check(rows)
    assert got["logprob_abs_gap_mean"] > 0  # bf16 sampling against the fp32 recompute is not exact
    assert got["engine_tokens_per_s"] > 0 and {r["dtype"] for r in rows} == {"bfloat16"}


@pytest.mark.slow
def test_tiny_llama_server_run_prints_the_gap():
    require("llama-server", find_binary() is not None, "build it with `make llama-server`")
    check(run_bench("mismatch.py", *TINY))
