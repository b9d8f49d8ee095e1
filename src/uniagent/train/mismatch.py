"""Train/inference mismatch: the rollout engine's logprobs against the trainer's recompute.

A real cluster samples with an inference engine (vLLM, SGLang, llama.cpp: other kernels, other
precision) and trains with torch, so the logprobs the rollout recorded are not quite the ones the
trainer computes for the same tokens. That gap biases the policy gradient; verl measures it and
corrects it with truncated importance sampling (TIS). This module delegates both to verl:

- the metrics are verl's `rollout_corr_helper.compute_rollout_correction_and_rejection_mask`
  (`rollout_corr/kl`, `rollout_corr/k3_kl`, `rollout_corr/chi2_token`, perplexities, IS-weight
  statistics) and `verl.utils.debug.metrics.calculate_debug_metrics`
  (`training/rollout_probs_diff_*`, the gap in probability space), plus the logprob gap
  itself, `training/rollout_logprob_diff_mean|max` (verl's `calculate_log_prob_diff` over model
  tokens; verl has no name for it, so it is named after its probability-space sibling);
- the weights are verl's `compute_rollout_correction_weights`, passed to verl's policy loss as
  `rollout_is_weights` (every loss in `core_algos.POLICY_LOSS_REGISTRY` multiplies its per-token
  loss by them), as verl's decoupled mode does.

`recompute_log_probs` is the trainer's side of the gap for any token stream: what
`bench/mismatch.py` compares an inference server's logprobs with.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from uniagent.tokens import Trajectory
from uniagent.train import algo


def is_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    threshold: float | str,
) -> torch.Tensor:
    """verl's truncated IS weights pi_trainer / pi_rollout, `[batch, response_len]`, detached,
    zero on context tokens and padding. Each weight depends on its own row only, so a micro-batch
    gets the same weights as the whole batch would."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    weights, _metrics = compute_rollout_correction_weights(
        log_ratio=old_log_probs - rollout_log_probs,
        response_mask=response_mask,
        rollout_is=level,
        rollout_is_threshold=threshold,
    )
    return weights


def mismatch_metrics(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    threshold: float | str = 2.0,
) -> dict[str, float]:
    """The gap over model tokens (mask 1), in verl's names; see the module docstring.

    The IS-weight statistics (`rollout_corr/rollout_is_*`) are those of `level`/`threshold`
    whether or not the weights are applied: a user sees what the correction would do before
    turning it on. Needs at least one model token (verl asserts it).
    """
    from verl.protocol import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
    from verl.utils.debug.metrics import calculate_debug_metrics, calculate_log_prob_diff

    old, rollout, mask = old_log_probs.detach().float(), rollout_log_probs.float(), response_mask.float()
    _weights, _mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=old,
        rollout_log_prob=rollout,
        response_mask=mask,
        rollout_is=level,
        rollout_is_threshold=threshold,
    )
    data = DataProto.from_dict(
        tensors={
            "rollout_log_probs": rollout,
            "old_log_probs": old,
            "response_mask": mask,
            "responses": torch.zeros_like(mask, dtype=torch.long),
        }
    )
    metrics.update(calculate_debug_metrics(data))
    gap = calculate_log_prob_diff(old, rollout, mask.bool())
    metrics["training/rollout_logprob_diff_mean"] = float(gap.mean())
    metrics["training/rollout_logprob_diff_max"] = float(gap.max())
    return {key: float(value) for key, value in metrics.items()}


def recompute_log_probs(
    model: torch.nn.Module,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    micro_batch_size: int = 4,
) -> list[list[float]]:
    """The trainer's logprob of every response token of each `(prompt_ids, response_ids)`.

    The same teacher-forced fp32 forward the local trainer's loss uses (`algo.response_log_probs`
    over `algo.pack`), without gradients: the torch side of the train/inference gap for tokens an
    inference server generated.
    """
    out: list[list[float]] = []
    for start in range(0, len(sequences), micro_batch_size):
        trajs = []
        for prompt_ids, response_ids in sequences[start : start + micro_batch_size]:
            t = Trajectory(prompt_ids=list(prompt_ids))
            if response_ids:
                t.add_generation(list(response_ids), [0.0] * len(response_ids))
            trajs.append(t)
        batch = algo.pack(trajs).to(next(model.parameters()).device)
        with torch.no_grad():
            logp = algo.response_log_probs(model, batch)
        out.extend(logp[i, : len(t.response_ids)].tolist() for i, t in enumerate(trajs))
    return out
