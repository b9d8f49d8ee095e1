"""fp32 vs bf16 local training: the same experiment, steps and seed, on this machine's matrix units.

Runs `uniagent train --engine local --config CONFIG --set trainer.mode=sync` once per variant (child
processes, one after the other, each with the whole machine; outputs in OUT/VARIANT, console in
OUT/VARIANT.log):

* ``fp32``     -- ``model.dtype=float32``: the engine serves the trainer's own fp32 weights (exact);
* ``bf16``     -- ``model.dtype=bfloat16``: fp32 master weights and optimizer state, the update under
  bf16 autocast, the engine serving a bf16 copy refreshed after every update;
* ``bf16_tis`` -- the same with ``algo.rollout_correction.rollout_is=token`` (truncated importance
  sampling against the bf16 sampler's logprobs: the correction the field applies to this mismatch).

Per variant (one JSON line per figure, `bench: train_precision`): ``step_s``, ``rollout_s``,
``update_s`` (median, min, max over the steps after ``--warmup``), ``generated_tokens_per_s`` (over
the rollouts), ``update_mfu`` (model FLOPs of the update's forward and backward over every position it
ran, `roofline.transformer_flops(train=True)`, per second, over the measured matmul peak of the
variant's compute dtype), ``rollout_prefill_mfu`` is left to bench/engine.py; ``reward_untrained``
(step 1: its rollout ran before any update), ``reward_last`` (mean of the last ``--window`` steps) and
``reward_gain`` with its noise (2 standard errors, p(1-p) bound), the rollout/recompute logprob gap
(``logprob_gap_mean`` / ``_max``) and ``rollout_is_mean``.

Then: ``fp32_vs_bf16_step`` (fp32 step time / bf16's; goal >= 2, issue 28), and for each bf16 variant
``reward_last_minus_fp32`` with its noise and ``within_noise`` (goal: learning as the fp32 run does).
Exits 1 when a goal is missed or a run fails.

    .venv/bin/python bench/train_precision.py                       # configs/train_multiturn.yaml, 8 steps
    .venv/bin/python bench/train_precision.py --steps 4 --variants fp32,bf16
    .venv/bin/python bench/train_precision.py --dry-run             # summarise OUT again
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import emit, spread
from uniagent.train.outputs import METRICS, read_metrics

BENCH = "train_precision"
GOAL_SPEEDUP = 2.0
REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "train_multiturn.yaml"
VARIANTS: dict[str, list[str]] = {
    "fp32": ["model.dtype=float32"],
    "bf16": ["model.dtype=bfloat16"],
    "bf16_tis": ["model.dtype=bfloat16", "algo.rollout_correction.rollout_is=token"],
}


def command(args: argparse.Namespace, variant: str, out: Path) -> list[str]:
    sets = ["trainer.mode=sync", f"trainer.output={out}", f"trainer.steps={args.steps}",
            f"trainer.seed={args.seed}", "trainer.save_every=0", *VARIANTS[variant], *args.sets]  # fmt: skip
    argv = [
        str(Path(sys.executable).parent / "uniagent"),
        "train",
        "--engine",
        "local",
        "--config",
        str(args.config),
    ]
    for item in sets:
        argv += ["--set", item]
    return argv


def noise(a: list[float], b: list[float]) -> float:
    """2 standard errors of the difference of two reward means (rewards in [0, 1], p(1-p) bounded)."""
    n_a, n_b = max(len(a), 1), max(len(b), 1)
    p = (sum(a) + sum(b)) / max(len(a) + len(b), 1)
    return 2 * math.sqrt(max(p * (1 - p), 0.0625) * (1 / n_a + 1 / n_b))


def episode_rewards(rows: list[dict[str, Any]]) -> list[float]:
    """Per-episode 0/1 rewards rebuilt from each row's mean and episode count (what the noise needs)."""
    out: list[float] = []
    for r in rows:
        n = int(r.get("episodes") or 0) - int(r.get("untrainable") or 0)
        mean = r.get("reward_mean")
        if n and mean is not None:
            hits = round(mean * n)
            out += [1.0] * hits + [0.0] * (n - hits)
    return out


def summarise(variant: str, rows: list[dict[str, Any]], args: argparse.Namespace, peak: dict) -> dict:
    from transformers import AutoConfig

    import roofline
    from uniagent.models.loading import smollm2_hf_dirs

    config = AutoConfig.from_pretrained(smollm2_hf_dirs()[0])
    timed = rows[args.warmup :] or rows
    fig: dict[str, Any] = {"variant": variant, "steps": len(rows), "dtype": rows[0].get("dtype")}
    for key in ("step_s", "rollout_s", "update_s"):
        fig[key] = spread([float(r[key]) for r in timed])
    gen = sum(float(r.get("generated_tokens") or 0) for r in timed)
    fig["generated_tokens_per_s"] = round(gen / max(sum(float(r["rollout_s"]) for r in timed), 1e-9), 2)
    mfus = []
    for r in timed:
        flops = roofline.update_flops(config, r)
        value = roofline.mfu(flops, float(r["update_s"]), fig["dtype"] or "float32", peak)
        if value is not None and flops:
            mfus.append(value)
    fig["update_mfu"] = spread(mfus, 4) if mfus else None
    rewards = [r.get("reward_mean") for r in rows]
    fig["rewards"] = [None if x is None else round(x, 3) for x in rewards]
    first, last = rows[:1], rows[-args.window :]
    fig["reward_untrained"] = rows[0].get("reward_mean")
    a, b = episode_rewards(first), episode_rewards(last)
    fig["reward_last"] = round(statistics.mean(b), 3) if b else None
    fig["reward_gain"] = round(statistics.mean(b) - statistics.mean(a), 3) if a and b else None
    fig["reward_gain_noise"] = round(noise(a, b), 3)
    fig["last_episodes"] = b
    gaps = [r.get("training/rollout_logprob_diff_mean") for r in rows]
    maxes = [r.get("training/rollout_logprob_diff_max") for r in rows]
    fig["logprob_gap_mean"] = (
        round(statistics.mean(g for g in gaps if g is not None), 6) if any(gaps) else None
    )
    fig["logprob_gap_max"] = round(max(m for m in maxes if m is not None), 6) if any(maxes) else None
    is_means = [r.get("rollout_corr/rollout_is_mean") for r in rows if r.get("rollout_corr/rollout_is_mean")]
    fig["rollout_is_mean"] = round(statistics.mean(is_means), 4) if is_means else None
    return fig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=1, help="steps left out of the timing figures")
    parser.add_argument("--window", type=int, default=3, help="last steps whose reward is compared")
    parser.add_argument("--variants", default="fp32,bf16,bf16_tis")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE for every variant")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_train_precision"))
    parser.add_argument("--dry-run", action="store_true", help="train nothing: summarise OUT again")
    parser.add_argument("--print", action="store_true", help="print the commands and exit")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}: one of {', '.join(VARIANTS)}")
    if args.print:
        for v in variants:
            print(" ".join(command(args, v, args.out / v)))
        return 0
    import roofline

    peak = roofline.peaks()
    failed = False
    figures: dict[str, dict] = {}
    for v in variants:
        out = args.out / v
        if not args.dry_run:
            if out.exists():
                shutil.rmtree(out)  # the trainer refuses an output with checkpoints: a bench starts fresh
            out.parent.mkdir(parents=True, exist_ok=True)
            began = time.perf_counter()
            with open(args.out / f"{v}.log", "w") as log:
                rc = subprocess.call(command(args, v, out), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
            print(f"[{BENCH}] {v}: exit {rc} in {time.perf_counter() - began:.0f} s", file=sys.stderr)
            if rc != 0:
                emit(BENCH, "run_failed", rc, None, variant=v, log=str(args.out / f"{v}.log"))
                failed = True
                continue
        rows = read_metrics(out / METRICS) if (out / METRICS).exists() else []
        if len(rows) < args.steps:
            emit(BENCH, "run_incomplete", len(rows), "steps", variant=v, wanted=args.steps)
            failed = True
            continue
        figures[v] = summarise(v, rows, args, peak)
        for key, value in figures[v].items():
            if key not in ("variant", "last_episodes"):
                emit(BENCH, key, value, None, variant=v)
    if "fp32" in figures:
        base = figures["fp32"]
        for v in (v for v in figures if v != "fp32"):
            ratio = base["step_s"]["median"] / figures[v]["step_s"]["median"]
            met = ratio >= GOAL_SPEEDUP
            emit(BENCH, "fp32_vs_variant_step", round(ratio, 2), "x", variant=v, goal=GOAL_SPEEDUP, met=met)
            diff = figures[v]["reward_last"] - base["reward_last"]
            n = noise(base["last_episodes"], figures[v]["last_episodes"])
            within = diff >= -n
            emit(BENCH, "reward_last_minus_fp32", round(diff, 3), None, variant=v, noise=round(n, 3),
                 within_noise=within)  # fmt: skip
            failed = failed or not met or not within
    (args.out / "summary.json").write_text(json.dumps(figures, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
