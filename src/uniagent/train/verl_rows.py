"""verl's metrics rows read as the local trainer's: one training page and one progress line for both.

`uniagent train --engine verl` with a local config has verl's file logger write its metrics to
`trainer.output/metrics.jsonl`, the file `uniagent train --engine local` writes there. verl's rows
are `{"step": N, "data": {...}}` (`verl.utils.tracking.FileLogger`), one per log call, so a step
can have several rows (the fully-async trainer logs its timings, then the step's aggregate, then
validation, all under one step): `merge_verl_rows` joins them in order. `page_row` gives the
merged data the local trainer's names for what both log (`RENAMES`: `reward_mean` is verl's
`critic/score/mean`, `step_s` its `timing_s/step`, ...), derives what verl logs in other terms
(tokens/s of the rollout, exit reasons from uniagent's `uniagent/exit/*` keys, the fully-async
staleness), and keeps every verl key as logged. The uniagent keys are written by
`integrations/verl/metrics.py` inside verl's trainer; their prefixes are defined here, where both
sides read them. No verl import: the dashboard reads these files without verl installed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

EARLIER = "metrics.earlier.jsonl"
"""Beside `metrics.jsonl`: the rows of the steps a resumed verl run had already trained (verl's file
logger truncates its file when it opens it; `integrations/verl/progress.keep_trained_rows`)."""
PREFIX = "uniagent/"
EXIT = PREFIX + "exit/"
POLICY_MIN = PREFIX + "policy_version/min"
ASYNC_VERSION = "fully_async/count/current_param_version"

RENAMES = {
    "reward_mean": "critic/score/mean",
    "resolved_rate": PREFIX + "resolved_rate",
    "episodes": PREFIX + "episodes",
    "untrainable": PREFIX + "untrainable",
    "episodes_no_gradient": PREFIX + "no_gradient",
    "step_s": "timing_s/step",
    "rollout_s": "timing_s/gen",
    "update_s": "timing_s/update_actor",
    "train_tokens_per_s": "perf/throughput",
    "loss": "actor/pg_loss",
    "pg_loss": "actor/pg_loss",
    "pg_clipfrac": "actor/pg_clipfrac",
    "ppo_kl": "actor/ppo_kl",
    "grad_norm": "actor/grad_norm",
    "trainer_idle_frac": "fully_async/trainer/idle_ratio",
    "interrupted": "fully_async/partial/total_partial_num",
}
"""The training page's key <- verl's key for the same figure."""


def is_verl_row(row: Any) -> bool:
    """A row of verl's file logger: exactly a step and a `data` mapping."""
    return isinstance(row, dict) and set(row) == {"step", "data"} and isinstance(row["data"], dict)


def merge_verl_rows(rows: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """verl's rows by step, the rows of one step merged in order (a later value wins)."""
    merged: dict[int, dict[str, Any]] = {}
    for row in rows:
        merged.setdefault(int(row["step"]), {}).update(row["data"])
    return merged


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def exit_counts(data: dict[str, Any]) -> dict[str, int]:
    """The exit reasons of a logged step (`uniagent/exit/REASON` keys) as `{reason: count}`."""
    counts = {key.removeprefix(EXIT): _number(value) for key, value in data.items() if key.startswith(EXIT)}
    return {reason: int(n) for reason, n in sorted(counts.items()) if n}


def page_row(step: int, data: dict[str, Any]) -> dict[str, Any]:
    """One verl step as the training page's row: verl's keys as logged, plus the page's names."""
    row: dict[str, Any] = {**data, "step": step, "engine": "verl"}
    for ours, theirs in RENAMES.items():
        if theirs in data:
            row[ours] = data[theirs]
    row["mode"] = "async" if any(k.startswith("fully_async/") for k in data) else "sync"
    row["policy_version"] = step
    exits = exit_counts(data)
    if exits:
        row["exit_reasons"] = exits
    length, episodes, gen = (
        _number(data.get(k)) for k in ("response_length/mean", PREFIX + "episodes", "timing_s/gen")
    )
    if length is not None and episodes and gen:
        row["rollout_tokens_per_s"] = length * episodes / gen
    version, oldest = _number(data.get(ASYNC_VERSION)), _number(data.get(POLICY_MIN))
    if version is not None and oldest is not None:
        row["staleness_max"] = max(0, int(version - oldest))
    return row
