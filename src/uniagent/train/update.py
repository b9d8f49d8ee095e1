"""One optimizer step of the local trainer: verl's objective over a step's episodes.

Kept apart from the loop (local.py, async_loop.py): what an update computes does not depend on how
the episodes were collected. Advantages, policy loss, KL and aggregation are verl's `core_algos` by
name (train/algo.py); one row per segment (train/segments.py); the trainer's recompute of the rollout
tokens gives the mismatch metrics and, when asked, verl's truncated IS weights (train/mismatch.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import torch

from uniagent.models.precision import Precision, autocast
from uniagent.train import algo, filters, mismatch, segments
from uniagent.train.sample import Sample

if TYPE_CHECKING:
    from uniagent.train.config import TrainConfig

log = logging.getLogger(__name__)


class Updated(Protocol):
    """What an update uses of the trainer (`train.local.LocalTrainer` is one; no import, no cycle)."""

    cfg: TrainConfig
    policy: torch.nn.Module
    ref: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    precision: Precision  # the compute dtype: bf16 runs the forward under autocast, masters stay fp32

    @property
    def step(self) -> int: ...

    @property
    def trainer_threads(self) -> int | None: ...

    def assert_idle(self) -> None:
        """Raise when the weights must not change now (a generation still runs on them)."""


def policy_update(trainer: Updated, samples: list[Sample]) -> dict[str, float]:
    """One optimizer step on the trainable samples; returns loss metrics."""
    cfg = trainer.cfg
    if trainer.trainer_threads:
        torch.set_num_threads(trainer.trainer_threads)  # per thread: this is the trainer's own
    # which episodes are in their group's baseline and which get gradient (train/filters.py:
    # infrastructure failures never; overlong / unfinished as algo.overlong_filter / algo.unfinished say)
    plan = filters.plan_step(samples, cfg.algo)
    usable = plan.baseline
    metrics: dict[str, float] = {"episodes_trained": float(plan.num_trained), **plan.counters()}
    if not plan.num_trained:
        return metrics
    rows = segments.segment_rows([s.result for s in usable])  # one row per segment (train/segments.py)
    rewards = [s.result.reward.value for s in usable]
    batch = algo.pack(rows.trajectories)
    advantages = segments.episode_advantages(
        cfg.algo.adv_estimator,
        rows,
        rewards,
        [s.group for s in usable],
        batch.response_mask,
        cfg.algo.norm_adv_by_std_in_grpo,
    )
    kept = filters.drop_untrained(batch, advantages, rows, plan.trained)
    assert kept is not None  # num_trained > 0
    batch, advantages = kept
    metrics["segments_trained"] = float(len(batch))
    total_tokens = int(batch.response_mask.sum())
    actor_cfg = algo.actor_config(
        cfg.algo.loss_mode,
        cfg.algo.clip_ratio_low,
        cfg.algo.clip_ratio_high,
        cfg.algo.clip_ratio_c,
        total_tokens,
        len(batch),
    )
    trainer.assert_idle()
    trainer.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {"pg_loss": 0.0, "kl_loss": 0.0}
    weighted: dict[str, float] = {"pg_clipfrac": 0.0, "ppo_kl": 0.0, "pg_clipfrac_lower": 0.0}
    mb = cfg.trainer.micro_batch_size
    corr = cfg.algo.rollout_correction
    recomputed = torch.zeros_like(batch.old_log_probs)  # the trainer's logprobs of the rollout tokens
    device = next(trainer.policy.parameters()).device  # the batch is packed on the CPU
    work = (0, 0)
    for start in range(0, len(batch), mb):
        rows = slice(start, start + mb)
        micro = batch.select(rows).to(device)
        done = algo.forward_work(micro)
        work = (work[0] + done[0], work[1] + done[1])
        adv = advantages[rows, : micro.response_ids.shape[1]].to(device)
        with autocast(trainer.precision, device.type):
            logp = algo.response_log_probs(trainer.policy, micro)
        recomputed[rows, : logp.shape[1]] = logp.detach().to(recomputed.device)
        old, is_weights = micro.old_log_probs, None
        if corr.rollout_is is not None:
            # verl's decoupled mode: the ratio is against the trainer's own logprobs (pi_old; the
            # weights do not change before the optimizer step, so this forward's detached logprobs
            # are verl's separate recompute) and the truncated IS weight carries pi_old / pi_rollout.
            old = logp.detach()
            is_weights = mismatch.is_weights(
                old, micro.old_log_probs, micro.response_mask, corr.rollout_is, corr.threshold_spec
            )
        pg_loss, pg_metrics = algo.policy_loss(
            cfg.algo.loss_mode,
            old,
            logp,
            adv,
            micro.response_mask,
            cfg.algo.loss_agg_mode,
            actor_cfg,
            is_weights,
        )
        loss = pg_loss
        if trainer.ref is not None:
            with torch.no_grad(), autocast(trainer.precision, device.type):
                ref_logp = algo.response_log_probs(trainer.ref, micro)
            kl = algo.kl_loss(
                logp,
                ref_logp,
                micro.response_mask,
                cfg.algo.kl_loss_type,
                cfg.algo.loss_agg_mode,
                actor_cfg,
            )
            loss = loss + cfg.algo.kl_loss_coef * kl
            sums["kl_loss"] += float(kl.detach())
        loss.backward()
        sums["pg_loss"] += float(pg_loss.detach())
        share = float(micro.response_mask.sum()) / max(total_tokens, 1)
        for key in weighted:
            weighted[key] += share * float(pg_metrics.get(f"actor/{key}", 0.0))
    grad_norm = torch.nn.utils.clip_grad_norm_(trainer.policy.parameters(), cfg.optim.grad_clip)
    if torch.isfinite(grad_norm):
        trainer.optimizer.step()
    else:
        log.warning("step %d: non-finite grad norm, update skipped", trainer.step)
    trainer.optimizer.zero_grad(set_to_none=True)
    metrics.update(sums)
    metrics.update(weighted)
    metrics["loss"] = sums["pg_loss"] + cfg.algo.kl_loss_coef * sums["kl_loss"]
    metrics["grad_norm"] = float(grad_norm)
    metrics["train_tokens"] = float(total_tokens)
    metrics["forward_tokens"] = float(work[0])  # positions through the layers (bench/roofline.py's MFU)
    metrics["logit_tokens"] = float(work[1])  # positions projected to the vocabulary
    metrics["adv_abs_mean"] = float((advantages.abs() * batch.response_mask).sum() / max(total_tokens, 1))
    level = corr.rollout_is or "token"
    gap = mismatch.mismatch_metrics(
        recomputed, batch.old_log_probs, batch.response_mask, level, corr.threshold_spec
    )
    metrics.update(gap)
    return metrics


# ------------------------------------------------------------------------------- loop
