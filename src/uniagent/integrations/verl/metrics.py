"""uniagent's per-step figures in verl's metrics: what the episodes of a trained batch did.

`UniAgentLoop` returns each sample's facts in `AgentLoopOutput.extra_fields` (exit reason, whether
it is trainable, drift, segments, the policy versions its tokens came from; `loop.py`). verl 0.9's
agent-loop worker turns every extra field into a `non_tensor_batch` column of the generated batch
(`AgentLoopWorker._postprocess`), and that batch, one row per sample, is what both the legacy
trainer (`RayPPOTrainer.fit`) and the fully-async one (`SeparateRayPPOTrainer._fit_collect_metrics`)
hand to `compute_data_metrics` when they build the step's metrics. verl reduces none of those
columns into training metrics (only validation reduces `reward_extra_info`), so `step_metrics`
does, and `cpu/compat.py:log_uniagent_step_metrics` adds its result to `compute_data_metrics`'s:
every logger (console, file, wandb, tensorboard) then carries them on the step they belong to.

Keys (all numbers, so every verl logger takes them; a column the batch lacks gives no key):
`uniagent/episodes`; `uniagent/exit/REASON` (count per exit reason); `uniagent/trainable_frac`
(share of samples that are trainable), `uniagent/untrainable`, `uniagent/no_gradient` (trainable but
masked out: overlong, unfinished); `uniagent/resolved_rate` (over trainable samples);
`uniagent/drift` (samples whose tokens drifted from a fresh render); `uniagent/segments/mean|max`,
`uniagent/segments_dropped` and `uniagent/dropped_model_tokens` (what the one-output trainers left
out of multi-segment episodes); `uniagent/resumed_turns` (turns resumed after an abort); and, where
the rollout reported them, `uniagent/policy_version/min|max` (the oldest and newest policy version
that produced a token of the batch). Staleness is the trainer's version minus the oldest: the
fully-async trainer logs its version on the same step (`fully_async/count/current_param_version`),
and `train/verl_rows.py` derives `staleness_max` from the two.

Pure Python over the columns (numpy object arrays or lists): no verl import, tested without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from uniagent.train.verl_rows import EXIT, PREFIX


def _column(batch: Mapping[str, Any], key: str) -> list[Any] | None:
    values = batch.get(key)
    if values is None:
        return None
    return list(values.tolist() if hasattr(values, "tolist") else values)


def _ints(values: Sequence[Any] | None) -> list[int]:
    return [int(v) for v in values or [] if isinstance(v, int | float) and not isinstance(v, bool)]


def step_metrics(batch: Mapping[str, Any]) -> dict[str, float]:
    """The `uniagent/*` figures of one trained batch's `non_tensor_batch` (module docstring); empty
    when the batch did not come from `UniAgentLoop` (no `exit_reason` column)."""
    exits = _column(batch, "exit_reason")
    if not exits:
        return {}
    n = len(exits)
    out: dict[str, float] = {PREFIX + "episodes": float(n)}
    for reason in sorted({str(r) for r in exits}):
        out[EXIT + reason] = float(sum(str(r) == reason for r in exits))
    trainable = [bool(t) for t in _column(batch, "trainable") or []]
    if trainable:
        out[PREFIX + "trainable_frac"] = sum(trainable) / len(trainable)
        out[PREFIX + "untrainable"] = float(len(trainable) - sum(trainable))
        resolved = _column(batch, "resolved")
        if resolved is not None and any(trainable):
            hits = [float(r) for r, t in zip(resolved, trainable, strict=True) if t]
            out[PREFIX + "resolved_rate"] = sum(hits) / len(hits)
    no_gradient = _column(batch, "no_gradient")
    if no_gradient is not None:
        out[PREFIX + "no_gradient"] = float(sum(bool(v) for v in no_gradient))
    drift = _column(batch, "drift")
    if drift is not None:
        out[PREFIX + "drift"] = float(sum(v is not None for v in drift))
    segments = _ints(_column(batch, "segments"))
    if segments:
        out[PREFIX + "segments/mean"] = sum(segments) / len(segments)
        out[PREFIX + "segments/max"] = float(max(segments))
    for key in ("segments_dropped", "dropped_model_tokens", "resumed_turns"):
        values = _ints(_column(batch, key))
        if values:
            out[PREFIX + key] = float(sum(values))
    low = _ints(_column(batch, "min_global_steps"))
    high = _ints(_column(batch, "max_global_steps"))
    if low:
        out[PREFIX + "policy_version/min"] = float(min(low))
    if high:
        out[PREFIX + "policy_version/max"] = float(max(high))
    return out
