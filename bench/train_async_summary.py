"""bench/train_async.py's figures from trainer rows: per run, per mode across pairs, per pair ratios.

Kept apart from the script (which trains): everything here reads `metrics.jsonl` rows only, so the
summary, the pairing, the ratios and the gates are tested on crafted rows, and `--from`/`--dry-run`
summarise finished runs without a model.

Why pairs: one sync/async pair is one sample of a machine whose speed drifts between runs (the same
sync step took 59 s in one run and 67 s in the next), so every ratio is taken within a pair (sync and
async back to back) and reported as the median and spread over pairs. Why the untrained run: the
first reward window of a run already holds steps sampled after an update, so learning is measured
against the initial policy's reward on the same tasks (a sync run whose learning rate is ~0).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from common import spread
from roofline import mfu, transformer_flops, update_flops
from uniagent.train.outputs import staleness_totals, wall_clock

BENCH = "train_async"
GOAL = 1.5  # issue 17: async >= 1.5x sync wall-clock per step on 2 cores
MODES = ("sync", "async")
# per-mode figures also given as median and spread over the pairs
ACROSS_PAIRS = (
    "wall_per_step_s",
    "wall_per_step_after_warmup_s",
    "step_s_median",
    "generated_tokens",
    "generated_tokens_per_wall_s",
    "process_wall_s",
    "update_gflops_per_s",
    "update_mfu",
    "reward_last",
    "reward_gain_over_untrained",
)
# per-pair ratios (sync's cost over async's: > 1 means async is faster), the first one gated
RATIOS = {
    "sync_vs_async_wall_per_step": "wall_per_step_s",
    "sync_vs_async_wall_per_step_after_warmup": "wall_per_step_after_warmup_s",
    "sync_vs_async_wall_per_generated_token": "wall_per_generated_token_s",
    "sync_vs_async_wall_per_generated_token_after_warmup": "wall_per_generated_token_after_warmup_s",
    "sync_vs_async_process_wall": "process_wall_s",
}


@dataclass
class Run:
    """One trainer output: its mode, its pair (1-based), its rows and the child's whole wall clock."""

    mode: str
    pair: int
    rows: list[dict[str, Any]]
    process_wall_s: float | None = None


@dataclass
class Costing:
    """What turns tokens and seconds into utilisation: the model's HF config, the trainer's dtype
    and this machine's measured peaks (bench/roofline.py)."""

    hf_config: Any
    dtype: str
    peak: dict[str, Any] = field(default_factory=dict)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def reward_window(rows: list[dict[str, Any]]) -> tuple[float | None, int]:
    """(mean reward, episodes) over `rows`, each step weighted by its trainable episodes."""
    weighted = [
        (r["reward_mean"], max(int(r.get("episodes", 1)) - int(r.get("untrainable", 0)), 1))
        for r in rows
        if r.get("reward_mean") is not None
    ]
    episodes = sum(n for _, n in weighted)
    return (sum(v * n for v, n in weighted) / episodes if episodes else None), episodes


def diff_noise(p1: float, n1: int, p2: float, n2: int) -> float:
    """Two standard errors of the difference of two window means under "no difference": a reward in
    [0, 1] with mean p has variance at most p(1 - p) (equal for 0/1 rewards), p pooled over both
    windows (a window that scored all 0 or all 1 still has noise)."""
    if not n1 or not n2:
        return math.nan
    pooled = (p1 * n1 + p2 * n2) / (n1 + n2)
    return 2 * math.sqrt(max(pooled * (1 - pooled), 0.0) * (1 / n1 + 1 / n2))


def summarise_untrained(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The initial policy's reward: every episode of the untrained run, with its own noise (2
    standard errors of a mean of rewards in [0, 1])."""
    reward, episodes = reward_window(rows)
    if reward is None:
        raise SystemExit("the untrained run holds no rewarded step")
    return {
        "reward": reward,
        "episodes": episodes,
        "noise": 2 * math.sqrt(max(reward * (1 - reward), 0.0) / episodes),
        "per_step": [r.get("reward_mean") for r in rows],
        "generated_tokens": [r.get("generated_tokens") for r in rows],
    }


def idle_fracs(row: dict[str, Any]) -> tuple[float | None, float | None]:
    """(trainer idle, engine idle) shares of the step. A sync row that lacks one (from before the
    async trainer, or run without the engine's activity probe) gets it from its phases, which never
    overlap: the trainer waits through `rollout_s`, the engine at least through the rest."""
    trainer, engine = row.get("trainer_idle_frac"), row.get("engine_idle_frac")
    step, rollout = row.get("step_s"), row.get("rollout_s")
    if row.get("mode", "sync") == "sync" and step and rollout is not None:
        busy = min(rollout / step, 1.0)
        trainer = busy if trainer is None else trainer
        engine = 1.0 - busy if engine is None else engine
    return trainer, engine


def utilisation(rows: list[dict[str, Any]], costing: Costing | None) -> dict[str, Any]:
    """The update's model FLOPs utilisation (forward + backward FLOPs of the trained tokens over the
    update seconds, against the trainer dtype's peak and both peaks), and the rollout's prefill MFU
    where the rows time the prefill."""
    if costing is None:
        return {}
    tokens = sum(float(r.get("forward_tokens") or r.get("train_tokens") or 0) for r in rows)
    seconds = sum(float(r.get("update_s") or 0) for r in rows)
    out: dict[str, Any] = {"trainer_dtype": costing.dtype, "update_tokens_counted": int(tokens)}
    flops = sum(update_flops(costing.hf_config, r) for r in rows)
    if flops and seconds:
        out["update_gflops_per_s"] = flops / seconds / 1e9
        out["update_mfu"] = mfu(flops, seconds, costing.dtype, costing.peak)
        out["update_mfu_of_fp32_peak"] = mfu(flops, seconds, "float32", costing.peak)
        out["update_mfu_of_bf16_peak"] = mfu(flops, seconds, "bfloat16", costing.peak)
    engines = [r.get("engine") or {} for r in rows]
    prefill_s = sum(float(e.get("prefill_s") or 0) for e in engines)
    prefill_tokens = sum(int(e.get("prefill_tokens") or 0) for e in engines)
    out["rollout_prefill_tokens"] = prefill_tokens
    if prefill_s and prefill_tokens:
        flops = transformer_flops(costing.hf_config, prefill_tokens)
        out["rollout_prefill_mfu"] = mfu(flops, prefill_s, costing.dtype, costing.peak)
    else:
        out["rollout_prefill_mfu"] = None  # the rows count prefill tokens but do not time the prefill
    return out


def summarise_run(
    rows: list[dict[str, Any]],
    window: int | None = None,
    warmup: int = 0,
    untrained: dict[str, Any] | None = None,
    costing: Costing | None = None,
) -> dict[str, Any]:
    """Every figure of one run's metrics rows (`warmup`: steps left out of a second wall per step,
    for a first step slowed by what only happens once; `untrained`: the initial policy's reward)."""
    rewarded = [r for r in rows if r.get("reward_mean") is not None]
    k = window or max(1, len(rewarded) // 4)
    k = min(k, max(1, len(rewarded) // 2))
    wall = wall_clock(rows)
    idle = [idle_fracs(r) for r in rows]
    tps = [r["rollout_tokens_per_s"] for r in rows if r.get("rollout_tokens_per_s") is not None]
    generated = [r["generated_tokens"] for r in rows if r.get("generated_tokens") is not None]
    all_generated = len(generated) == len(rows)
    trained = int(sum(float(r.get("episodes_trained") or 0) for r in rows))
    first, first_n = reward_window(rewarded[:k])
    last, last_n = reward_window(rewarded[-k:])
    # learning: over the untrained policy's reward where it was measured, else over the first window
    base, base_n, base_from = (
        (untrained["reward"], untrained["episodes"], "untrained") if untrained else (first, first_n, "first")
    )
    gain = last - base if base is not None and last is not None else None
    noise = diff_noise(base, base_n, last, last_n) if gain is not None else None
    hist = staleness_totals(rows)
    return {
        "steps": len(rows),
        "wall_per_step_s": wall[-1] / len(rows),
        "train_wall_s": wall[-1],
        "wall_per_step_after_warmup_s": (wall[-1] - wall[warmup - 1]) / (len(rows) - warmup)
        if 0 < warmup < len(rows)
        else None,
        "step_s_median": statistics.median(float(r.get("step_s") or 0.0) for r in rows),
        "rollout_tokens_per_s_median": statistics.median(tps) if tps else None,
        "generated_tokens": sum(generated) if all_generated else None,
        "generated_tokens_per_wall_s": sum(generated) / wall[-1] if all_generated and wall[-1] else None,
        "wall_per_generated_token_s": wall[-1] / sum(generated) if all_generated and sum(generated) else None,
        "wall_per_generated_token_after_warmup_s": (wall[-1] - wall[warmup - 1]) / sum(generated[warmup:])
        if all_generated and 0 < warmup < len(rows) and sum(generated[warmup:])
        else None,
        "trainer_idle_frac_mean": _mean([t for t, _ in idle if t is not None]),
        "engine_idle_frac_mean": _mean([e for _, e in idle if e is not None]),
        "window": k,
        "reward_first": first,
        "reward_last": last,
        "reward_last_episodes": last_n,
        "reward_untrained": untrained["reward"] if untrained else None,
        "gain_from": base_from,
        "reward_gain_over_untrained" if untrained else "reward_gain": gain,
        "reward_gain_noise": noise,
        "learned": gain is not None and noise is not None and gain > noise,
        "episodes_trained": trained,
        "reward_gain_per_100_episodes": 100 * gain / trained if gain is not None and trained else None,
        "reward_gain_per_100_episodes_noise": 100 * noise / trained
        if noise is not None and trained
        else None,
        "staleness_hist": {str(lag): n for lag, n in hist.items()},
        "staleness_max": max(hist) if hist else None,
        **utilisation(rows, costing),
        "reward_curve": [r["reward_mean"] for r in rewarded],
    }


def compare_pair(sync: dict[str, Any], asyn: dict[str, Any]) -> dict[str, Any]:
    """One pair's verdicts: the ratios (sync's cost over async's), the same final reward within
    noise, async learning no worse per episode trained."""
    out: dict[str, Any] = {}
    for name, key in RATIOS.items():
        if sync.get(key) and asyn.get(key):
            out[name] = {"value": sync[key] / asyn[key]}
    if sync["reward_last"] is not None and asyn["reward_last"] is not None:
        diff = asyn["reward_last"] - sync["reward_last"]
        noise = diff_noise(
            sync["reward_last"],
            sync["reward_last_episodes"],
            asyn["reward_last"],
            asyn["reward_last_episodes"],
        )
        out["async_minus_sync_reward_last"] = {
            "value": diff,
            "noise": noise,
            "within_noise": abs(diff) <= noise,
        }
    per_sample = [m["reward_gain_per_100_episodes"] for m in (sync, asyn)]
    if None not in per_sample:
        diff = per_sample[1] - per_sample[0]
        # two gains: their noises (2 standard errors each) add in quadrature
        noise = math.hypot(
            sync["reward_gain_per_100_episodes_noise"], asyn["reward_gain_per_100_episodes_noise"]
        )
        out["async_minus_sync_gain_per_100_episodes"] = {
            "value": diff,
            "noise": noise,
            "not_worse": diff >= -noise,
        }
    return out


def across_pairs(
    runs: list[dict[str, Any]], pairs: list[dict[str, Any]], gated: str = "sync_vs_async_wall_per_step"
) -> dict[str, Any]:
    """Median and spread over pairs: each mode's figures, each ratio; the goals (`gated`: the ratio
    whose median must reach GOAL) and whether all hold."""
    modes: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue
        figures = {}
        for name in ACROSS_PAIRS:
            values = [r["figures"][name] for r in mine if isinstance(r["figures"].get(name), int | float)]
            if values:
                figures[name] = spread([float(v) for v in values], 4)
        figures["learned"] = {"value": all(r["figures"]["learned"] for r in mine), "runs": len(mine)}
        modes[mode] = figures
    ratios: dict[str, Any] = {}
    for name in RATIOS:
        values = [p["comparison"][name]["value"] for p in pairs if name in p["comparison"]]
        if values:
            ratios[name] = spread(values, 4)
    goals: dict[str, bool] = {}
    if gated in ratios:
        goals[gated] = ratios[gated]["median"] >= GOAL
        ratios[gated].update(goal=GOAL, met=goals[gated])
    for mode, figures in modes.items():
        goals[f"{mode}_learns"] = figures["learned"]["value"]
    return {
        "modes": modes,
        "ratios": ratios,
        "goals": goals,
        "goals_met": bool(goals) and all(goals.values()),
    }


def pair_runs(runs: list[Run]) -> list[tuple[Run | None, Run | None]]:
    """Runs grouped by pair number: (sync, async), either None when that pair lacks it."""
    by_pair: dict[int, dict[str, Run]] = {}
    for run in runs:
        if run.mode in by_pair.setdefault(run.pair, {}):
            raise SystemExit(
                f"pair {run.pair} holds two {run.mode!r} runs: pass each pair's sync and async once"
            )
        by_pair[run.pair][run.mode] = run
    return [(p.get("sync"), p.get("async")) for _, p in sorted(by_pair.items())]


def summarise_runs(
    runs: list[Run],
    untrained_rows: list[dict[str, Any]] | None = None,
    window: int | None = None,
    warmup: int = 0,
    costing: Costing | None = None,
) -> dict[str, Any]:
    """The whole summary: the untrained reward, each run's figures, each pair's verdicts, the
    medians and spread over pairs and the goals."""
    untrained = summarise_untrained(untrained_rows) if untrained_rows else None
    out_runs, pairs = [], []
    for sync, asyn in pair_runs(runs):
        done = {}
        for run in (sync, asyn):
            if run is None:
                continue
            figures = summarise_run(run.rows, window, warmup, untrained, costing)
            if run.process_wall_s is not None:
                figures["process_wall_s"] = run.process_wall_s
            done[run.mode] = figures
            out_runs.append({"mode": run.mode, "pair": run.pair, "figures": figures})
        if sync and asyn:
            pairs.append({"pair": sync.pair, "comparison": compare_pair(done["sync"], done["async"])})
    if untrained and untrained_rows:
        first_sync = next((r for r in runs if r.mode == "sync"), None)
        if first_sync:  # before any update a sync run samples what the untrained run sampled
            keys = ("generated_tokens", "reward_mean")
            same = all(first_sync.rows[0].get(k) == untrained_rows[0].get(k) for k in keys)
            untrained["same_first_step_as_sync"] = same
    # the goal on the steps after the warm-up where there is one: a first step slowed by what happens
    # once (it is in the whole-process ratio) must not carry the per-step verdict
    gated = "sync_vs_async_wall_per_step" + ("_after_warmup" if warmup else "")
    return {"untrained": untrained, "runs": out_runs, "pairs": pairs, **across_pairs(out_runs, pairs, gated)}
