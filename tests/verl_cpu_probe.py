"""Test-only verl plugin for tests/test_verl_cpu.py: per-token logprob agreement as a verl metric.

verl's legacy trainer reports how the rollout's logprobs compare with its own recomputed old logprobs
(`verl.utils.debug.metrics.calculate_debug_metrics`, called from `RayPPOTrainer.fit` whenever the
batch has `rollout_log_probs`), but only in probability space. This module, loaded like the CPU plugin
(`VERL_USE_EXTERNAL_MODULES=uniagent.integrations.verl.cpu,verl_cpu_probe`, with tests/ on
PYTHONPATH), wraps that function so the same step metrics also carry the max and mean absolute
difference of the log probabilities over response tokens (`training/rollout_logprob_abs_diff_*`).
`fit` imports the function at call time, so replacing the module attribute is enough. Nothing outside
the test loads it.

It also counts, in the batch verl trains on, the response tokens of tool and user messages (from a
`<|im_start|>` whose role is not `assistant` to its `<|im_end|>`: SmolLM2's ChatML) and how many of
them carry mask 1 (`training/context_tokens`, `training/context_tokens_trained`: the latter must be 0;
the tokenizer is the one at `UNIAGENT_PROBE_TOKENIZER`).
"""

from __future__ import annotations

import os
from functools import lru_cache
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
    if os.environ.get("UNIAGENT_PROBE_TOKENIZER"):
        metrics.update(_context_tokens(data.batch["responses"], mask))
    return metrics


@lru_cache(maxsize=1)
def _chatml() -> tuple[int, int, int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.environ["UNIAGENT_PROBE_TOKENIZER"])
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    return start, end, tok.encode("assistant", add_special_tokens=False)[0]


def _context_tokens(responses: Any, mask: Any) -> dict[str, int]:
    """Tokens inside non-assistant messages of each response, and how many of them are trained."""
    start, end, assistant = _chatml()
    seen = trained = 0
    for ids, row in zip(responses.tolist(), mask.tolist(), strict=True):
        inside = False
        for i, token in enumerate(ids):
            if token == start:
                inside = i + 1 < len(ids) and ids[i + 1] != assistant
            if inside:
                seen += 1
                trained += int(row[i])
            if token == end:
                inside = False
    return {"training/context_tokens": seen, "training/context_tokens_trained": trained}


if not getattr(debug_metrics.calculate_debug_metrics, "_uniagent_probe", False):
    calculate_debug_metrics._uniagent_probe = True  # type: ignore[attr-defined]
    debug_metrics.calculate_debug_metrics = calculate_debug_metrics
