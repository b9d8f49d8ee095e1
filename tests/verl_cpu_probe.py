"""Test-only verl plugin for tests/test_verl_cpu.py: per-token logprob agreement as a verl metric.

verl's legacy trainer reports how the rollout's logprobs compare with its own recomputed old logprobs
(`verl.utils.debug.metrics.calculate_debug_metrics`, called from `RayPPOTrainer.fit` whenever the
batch has `rollout_log_probs`), but only in probability space. This module, loaded like the CPU plugin
(`VERL_USE_EXTERNAL_MODULES=uniagent.integrations.verl.cpu,verl_cpu_probe`, with tests/ on
PYTHONPATH), wraps that function so the same step metrics also carry the max and mean absolute
difference of the log probabilities over response tokens (`training/rollout_logprob_abs_diff_*`).
`fit` imports the function at call time, so replacing the module attribute is enough. Nothing outside
the test loads it.
"""

from __future__ import annotations

from typing import Any

import verl.utils.debug.metrics as debug_metrics

_original = debug_metrics.calculate_debug_metrics


def calculate_debug_metrics(data: Any) -> dict:
    metrics = _original(data)
    rollout = data.batch["rollout_log_probs"]
    actor = data.batch["old_log_probs"]
    mask = data.batch["response_mask"] if "response_mask" in data.batch else data.batch["attention_mask"]
    mask = mask[:, -rollout.shape[1] :].bool()
    if mask.any():
        diff = (rollout.float() - actor.float()).abs()[mask]
        metrics["training/rollout_logprob_abs_diff_max"] = diff.max().item()
        metrics["training/rollout_logprob_abs_diff_mean"] = diff.mean().item()
        metrics["training/rollout_logprob_tokens"] = int(mask.sum().item())
    return metrics


if not getattr(debug_metrics.calculate_debug_metrics, "_uniagent_probe", False):
    calculate_debug_metrics._uniagent_probe = True  # type: ignore[attr-defined]
    debug_metrics.calculate_debug_metrics = calculate_debug_metrics
