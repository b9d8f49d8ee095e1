"""bench/train_verl.py's reading side: verl's file-logger rows and the rollout server's event log made
into rows of the local trainer's `metrics.jsonl` schema, so that one summary (train_async.summarise_mode)
measures both trainers the same way, plus the per-step spread and the verl / local verdicts.

What each verl figure is made of:

* ``time`` (a step's end): the rollout server's ``update`` event that gave it the step's weights (verl
  syncs after every step, sync and fully async alike, and once before step 1); the local trainer stamps
  its row after its own weight update, so both walls run from the first step's start (the initial sync)
  to the last step's weight sync. Without events, ``timing_s/step`` sums stand in.
* ``generated_tokens``: tokens the rollout server sampled in the step's interval (``generated`` events,
  plus the tokens of requests cut short by a sync, ``aborted``): what the local engine counts.
* ``reward_mean``: ``critic/score/mean`` of the trained batch; ``episodes``: tasks x samples.
* idle shares: sync from the phases (``timing_s/gen`` of ``timing_s/step``, as a sync local row without
  them); fully async verl's own ``fully_async/trainer/idle_ratio`` and ``fully_async/rollouter/idle_ratio``.

verl's fully-async trainer logs a step's metrics one step late, and the last one at the run's end, under
the policy version of the moment: a trained row is taken by its own `training/global_step`.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from uniagent.train.outputs import wall_clock

SCORE = "critic/score/mean"


def verl_step_metrics(rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(step, metrics) of every trained step in verl's file-logger rows (`{"step": N, "data": {...}}`),
    in order. A trained row is one with a score, numbered by its `training/global_step` (fully async
    labels them with the policy version when logged, one late, and the last twice); a row without one
    (the fully-async rollouter's, labelled with the version its sync made) adds its keys to the trained
    step of that number, the first such row only."""
    trained: dict[int, dict[str, Any]] = {}
    other: dict[int, dict[str, Any]] = {}
    for row in rows:
        data = row.get("data") or {}
        if SCORE in data:
            trained[int(data.get("training/global_step", row["step"]))] = dict(data)
        else:
            other.setdefault(int(row["step"]), data)
    for step, data in trained.items():
        for key, value in other.get(step, {}).items():
            data.setdefault(key, value)
    return sorted(trained.items())


def _step_ends(events: list[dict[str, Any]], steps: int) -> list[float] | None:
    """The times of the initial weight sync and of the sync after each step, from the server's
    ``update`` events (one per version, the first the initial sync); None when they are missing."""
    updates = sorted((e for e in events if e.get("event") == "update"), key=lambda e: e["time"])
    if len(updates) < steps + 1:
        return None
    return [float(e["time"]) for e in updates[: steps + 1]]


def _tokens_between(events: list[dict[str, Any]], start: float, end: float) -> int:
    return sum(
        int(e.get("tokens") or 0)
        for e in events
        if e.get("event") in ("generated", "aborted") and start < float(e["time"]) <= end
    )


def verl_rows(
    metrics: list[dict[str, Any]], events: list[dict[str, Any]], mode: str, episodes: int
) -> list[dict[str, Any]]:
    """verl's trained steps as local `metrics.jsonl` rows (see the module docstring)."""
    steps = verl_step_metrics(metrics)
    ends = _step_ends(events, len(steps))
    out: list[dict[str, Any]] = []
    for i, (step, data) in enumerate(steps):
        row: dict[str, Any] = {
            "step": i + 1,
            "verl_step": step,
            "mode": mode,
            "reward_mean": data[SCORE],
            "episodes": episodes,
            "untrainable": 0,
            "episodes_trained": episodes,
            "verl_step_s": data.get("timing_s/step"),
            "step_s": data.get("timing_s/step"),
            "response_length_mean": data.get("response_length/mean"),
        }
        if ends is not None:
            row["time"] = ends[i + 1]
            row["step_s"] = ends[i + 1] - ends[i]
            row["generated_tokens"] = _tokens_between(events, ends[i], ends[i + 1])
        if mode == "async":
            row["trainer_idle_frac"] = data.get("fully_async/trainer/idle_ratio")
            row["engine_idle_frac"] = data.get("fully_async/rollouter/idle_ratio")
        elif data.get("timing_s/gen") is not None and data.get("timing_s/step"):
            row["rollout_s"] = data["timing_s/gen"] * (row["step_s"] or 0.0) / data["timing_s/step"]
        out.append(row)
    return out


def step_walls(rows: list[dict[str, Any]]) -> list[float]:
    """Each step's wall clock: the differences of `wall_clock` (stamps where the rows have them)."""
    wall = wall_clock(rows)
    return [b - a for a, b in zip([0.0, *wall], wall, strict=False)]


def spread(values: list[float]) -> dict[str, float | int | None]:
    """Median, min, max and count of `values` (None figures when empty)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def per_step(rows: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """The per-step figures after `warmup` steps: wall per step's spread, tokens per wall second."""
    walls = step_walls(rows)
    kept = list(range(min(warmup, max(len(rows) - 1, 0)), len(rows)))
    tokens = [rows[i].get("generated_tokens") for i in kept]
    wall = sum(walls[i] for i in kept)
    return {
        "wall_per_step": spread([walls[i] for i in kept]),
        "tokens_per_s_after_warmup": sum(tokens) / wall if None not in tokens and wall > 0 else None,
    }


def _ratio(verl: float | None, local: float | None) -> float | None:
    if verl is None or local is None:
        return None
    return verl / local if local else math.inf


def compare(local: dict[str, Any], verl: dict[str, Any], max_ratio: float | None) -> dict[str, Any]:
    """verl / local for the speed figures (median wall per step after warm-up: `met` when at most
    `max_ratio`), and each side's reward gain against its noise (the curve beats noise: `met`)."""
    wall = _ratio(verl["wall_per_step"]["median"], local["wall_per_step"]["median"])
    out: dict[str, Any] = {
        "verl_vs_local_wall_per_step": {
            "value": wall,
            "local": local["wall_per_step"]["median"],
            "verl": verl["wall_per_step"]["median"],
            **({"goal": max_ratio, "met": wall is not None and wall <= max_ratio} if max_ratio else {}),
        },
    }
    for name in (
        "generated_tokens_per_wall_s",
        "tokens_per_s_after_warmup",
        "train_wall_s",
        "process_wall_s",
    ):
        if local.get(name) is not None and verl.get(name) is not None:
            out[f"verl_vs_local_{name}"] = {
                "value": _ratio(verl[name], local[name]),
                "local": local[name],
                "verl": verl[name],
            }
    for side, figures in (("local", local), ("verl", verl)):
        gain, noise = figures["reward_gain"], figures["reward_gain_noise"]
        out[f"{side}_reward_rises_beyond_noise"] = {
            "value": gain,
            "noise": noise,
            "met": gain is not None and noise is not None and gain > noise,
        }
    return out
