"""bench/train_precision.py without training: the commands it launches, and its summary and goals on
rows shaped as `uniagent train` writes them (the training runs are the bench's job, not a test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # the bench's modules import each other as scripts do

import train_precision  # noqa: E402


def _rows(step_s: float, rewards: list[float], dtype: str) -> list[dict]:
    return [
        {"step": i + 1, "dtype": dtype, "step_s": step_s, "rollout_s": step_s * 0.6, "update_s": step_s * 0.4,
         "generated_tokens": 400, "forward_tokens": 6000, "episodes": 8, "untrainable": 0, "reward_mean": r,
         "training/rollout_logprob_diff_mean": 0.01, "training/rollout_logprob_diff_max": 0.3}
        for i, r in enumerate(rewards)
    ]  # fmt: skip


def test_each_variant_trains_the_same_config_with_its_dtype() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "train_precision.py"), "--print", "--steps", "3"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert len(out) == 3
    assert "model.dtype=float32" in out[0] and "model.dtype=bfloat16" in out[1]
    assert "algo.rollout_correction.rollout_is=token" in out[2]
    assert all("trainer.steps=3" in line and "trainer.mode=sync" in line for line in out)


def test_summary_gates_speed_and_learning(tmp_path: Path) -> None:
    peak = {"fp32_gflops": 300.0, "bf16_gflops": 2400.0, "memory_gbps": 20.0}
    for name, rows in {
        "fp32": _rows(40.0, [0.25, 0.5, 1.0, 1.0], "float32"),
        "bf16": _rows(16.0, [0.25, 0.5, 0.875, 1.0], "bfloat16"),
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = train_precision.argparse.Namespace(warmup=1, window=2)
    fig = train_precision.summarise("bf16", _rows(16.0, [0.25, 0.5, 0.875, 1.0], "bfloat16"), args, peak)
    assert fig["step_s"]["median"] == 16.0 and fig["reward_untrained"] == 0.25
    assert 0 < fig["update_mfu"]["median"] < 1
    done = subprocess.run(
        [sys.executable, str(BENCH / "train_precision.py"), "--dry-run", "--steps", "4", "--window", "2",
         "--variants", "fp32,bf16", "--out", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    lines = [json.loads(x) for x in done.stdout.splitlines()]
    ratio = next(x for x in lines if x["figure"] == "fp32_vs_variant_step")
    assert ratio["value"] == 2.5 and ratio["met"]
    learn = next(x for x in lines if x["figure"] == "reward_last_minus_fp32")
    assert learn["within_noise"] and done.returncode == 0
