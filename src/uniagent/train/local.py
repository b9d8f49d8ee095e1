"""`uniagent train --engine local`: GRPO/GSPO on one machine (CPU is enough for the toy suite).

Recipe
------
::

    uniagent train --engine local --config configs/train_local.yaml            # learn
    uniagent train --engine local --config configs/train_local.yaml --resume   # continue
    uniagent train --engine local --config configs/train_local.yaml \\
        --set algo.loss_mode=gspo --set algo.loss_agg_mode=seq-mean-token-mean  # GSPO
    uniagent train --engine verl --config RECIPE --print                         # the cluster command

Outputs in `trainer.output`: `metrics.jsonl` (one row per step), `reward_curve.png`,
`checkpoints/step_N.pt` (model, optimizer, step, RNG states), `tensorboard/` when TensorBoard is
installed, and W&B when `trainer.wandb_project` is set and wandb is installed.

How a step works, and why
-------------------------
1. **Rollout** through `run_episode`, the code `uniagent run` and the verl agent loop use, so an
   episode means the same thing in evaluation and training. The engine is
   `LocalEngine.from_model(policy)`: it serves the trainer's own parameters, so an optimizer step
   is what the very next rollout samples from (no weight sync, no copy).
2. **Groups**: `tasks_per_step` tasks, `group_size` samples each. Episodes whose exit reason is
   not trainable (sandbox died, engine failed, verifier crashed) are dropped before grouping:
   an infrastructure failure is not a zero reward. When more than
   `trainer.max_infra_failure_share` of a step's episodes failed that way, training stops with a
   `TrainingError` naming the counts per exit reason: the rest is no honest sample of the policy.
   Every episode first goes through `uniagent.redact` (the environment's secrets, the sandbox
   settings' tokens): one whose tokens held a secret is not trained on (`secret_redacted`), and the
   config snapshot (checkpoints, W&B) and `metrics.jsonl` rows are redacted as `uniagent run`'s are.
3. **Advantages, policy loss, KL, aggregation** come from verl's `core_algos` by name
   (`algo.adv_estimator`, `algo.loss_mode`, `algo.loss_agg_mode`, `algo.kl_loss_type`), so the
   objective is verl's. Old logprobs are the engine's (`Trajectory.response_logprobs`); current
   logprobs come from one teacher-forced forward over prompt + response. The loss mask is the
   Trajectory's response mask, so context tokens (tool results, turn glue) get no gradient.
   **Segments** (`train/segments.py`): every segment of an episode that holds model tokens is one
   row (its own prompt, mask and logprobs); the advantage is computed per episode (one sample per
   episode in its group) and broadcast to its segments; GSPO's sequence ratio is per segment.
   The engine's logprobs are the raw temperature-1 distribution, and so is the recompute: with
   `model.temperature` below 1 the rollouts are mildly off-policy for the policy being optimised
   (the PPO ratio still starts at 1; the clip bounds the drift). verl's GRPO gives a group of one
   (its siblings all failed for infrastructure reasons) mean 0 and std 1, i.e. advantage = reward.
   **Train/inference mismatch**: the forward's logprobs are also the trainer's recompute of the
   rollout tokens; every step reports their gap to the engine's (`training/rollout_logprob_diff_mean`
   and `_max` over model tokens, verl's `rollout_corr/*` and `training/rollout_probs_diff_*`; see
   `train/mismatch.py`). `algo.rollout_correction.rollout_is` (off by default: this engine serves
   the trainer's own weights, so the gap is float noise) switches to verl's decoupled mode with
   truncated importance-sampling weights in the policy loss, for rollouts from another engine.
4. **Update**: AdamW, global grad-norm clip. Generation and update never overlap: a step starts
   only after every rollout request has returned (checked against the engine's counters).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from uniagent.agent.result import EpisodeResult, check_infra_failures
from uniagent.errors import ConfigError, UniAgentError
from uniagent.redact import Redactor, setting_secrets, shared_redactor
from uniagent.tasks.base import Task
from uniagent.train import algo, mismatch, segments
from uniagent.train.config import TrainConfig
from uniagent.train.outputs import (
    CURVE,
    METRICS,
    Writers,
    plot_rewards,
    release_memory,
    rss_mb,
    truncate_metrics,
)

log = logging.getLogger(__name__)


def load_train_tasks(cfg: TrainConfig) -> list[Task]:
    """`toy` / `toy:FILE` are this package's toy family; anything else goes to the task registry."""
    spec = cfg.tasks.spec
    if spec == "toy" or spec.startswith("toy:"):
        from uniagent.train.toy import load_toy_tasks

        tasks = load_toy_tasks(spec[4:] or None, cfg.tasks.limit)
        if cfg.tasks.ids:
            tasks = [t for t in tasks if t.instance_id in cfg.tasks.ids]
    else:
        from uniagent.tasks import load_tasks

        tasks = load_tasks(spec, cfg.tasks.family, cfg.tasks.limit, cfg.tasks.ids)
    if not tasks:
        raise ConfigError(f"tasks.spec {spec!r} gave no tasks")
    return tasks


@dataclass
class Sample:
    """One episode of a step and the group it belongs to."""

    task: Task
    group: str
    result: EpisodeResult


class LocalTrainer:
    """Owns the policy, the optimizer, the shared engine and the output directory."""

    def __init__(self, cfg: TrainConfig, resume: bool = False) -> None:
        from uniagent.models.factory import local_weights
        from uniagent.models.loading import load_causal_lm, load_tokenizer, resolve_model
        from uniagent.models.local import LocalEngine
        from uniagent.tokens import ChatCodec

        self.cfg = cfg
        self.out = Path(cfg.trainer.output)
        self.ckpt_dir = self.out / "checkpoints"
        existing = sorted(self.ckpt_dir.glob("step_*.pt")) if self.ckpt_dir.exists() else []
        if existing and not resume:
            raise ConfigError(
                f"{self.out} already holds checkpoints ({existing[-1].name}): pass --resume to continue, "
                "or choose another trainer.output"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        self.tasks = load_train_tasks(cfg)
        source = resolve_model(local_weights(cfg.model.spec))
        self.codec = ChatCodec(load_tokenizer(source))
        self.policy = load_causal_lm(source, device=cfg.model.device, dtype=cfg.model.dtype)
        self.ref: torch.nn.Module | None = None
        if cfg.algo.kl_loss_coef > 0:
            self.ref = copy.deepcopy(self.policy).requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(),
            lr=cfg.optim.lr,
            betas=cfg.optim.betas,
            weight_decay=cfg.optim.weight_decay,
        )
        self.engine = LocalEngine.from_model(self.policy, max_batch_size=cfg.model.max_batch_size)
        self.step = 0
        self.rng = random.Random(cfg.trainer.seed)
        torch.manual_seed(cfg.trainer.seed)
        if resume and existing:
            self._load(existing[-1])
        elif not resume:
            (self.out / METRICS).unlink(missing_ok=True)
        self._writers = Writers(self.out, cfg, self.redactor)
        # Updates and saves run on one dedicated thread: a fresh pool thread per step would give each
        # its own malloc arena and OpenMP team (memory fragmentation, slower kernels on few cores).
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer")

    # ------------------------------------------------------------------------------- rollout

    def redactor(self) -> Redactor:
        """The environment's secrets (as they are now) and the sandbox settings' tokens, redacted
        as `uniagent run` redacts what it stores: the same `uniagent.redact`."""
        return shared_redactor(setting_secrets(self.cfg.sandbox), self.codec.tokenizer)

    def pick_tasks(self) -> list[Task]:
        n = min(self.cfg.trainer.tasks_per_step, len(self.tasks))
        return self.rng.sample(self.tasks, n)

    async def rollout(self, tasks: list[Task]) -> list[Sample]:
        """`group_size` episodes per task through `run_episode`, all sharing the policy's weights."""
        from uniagent.agent.base import Agent
        from uniagent.agent.registry import open_agent
        from uniagent.models.base import SamplingParams
        from uniagent.models.factory import episode_seed
        from uniagent.models.token_chat import TokenChatModel
        from uniagent.parsers import get_parser
        from uniagent.tasks.episode import run_episode

        cfg = self.cfg
        gate = asyncio.Semaphore(cfg.trainer.concurrency)
        redactor = self.redactor()

        async def one(task: Task, k: int, agent: Agent) -> Sample:
            sample = self.step * cfg.trainer.group_size + k
            sampling = SamplingParams(
                temperature=cfg.model.temperature,
                top_p=cfg.model.top_p,
                max_tokens=cfg.model.max_tokens,
                seed=episode_seed(cfg.trainer.seed, task.instance_id, sample),
            )
            rid = f"{task.instance_id}#{self.step}#{k}"
            model = TokenChatModel(self.engine, self.codec, get_parser(cfg.model.parser), sampling, rid)
            async with gate:
                result = await run_episode(task, model, cfg.agent, cfg.sandbox, agent=agent)
            # an episode whose tokens held a secret is not trained on (the policy would learn to say it)
            result = await asyncio.to_thread(redactor.episode, result)
            return Sample(task, task.instance_id, result)

        # the agent's per-run resources (a harness's gateway) serve the step's episodes
        async with open_agent(cfg.agent_kind, self.engine, self.codec) as agent:
            jobs = [one(t, k, agent) for t in tasks for k in range(cfg.trainer.group_size)]
            return list(await asyncio.gather(*jobs))

    def _assert_idle(self) -> None:
        """Weights may change only while no generation is queued or running."""
        s = self.engine.stats
        if s.requests != s.completed + s.failed + s.cancelled:
            raise UniAgentError(
                f"engine still has {s.requests - s.completed - s.failed - s.cancelled} request(s) in flight; "
                "refusing to update weights under a running generation"
            )

    # ------------------------------------------------------------------------------- update

    def update(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step on the trainable samples; returns loss metrics."""
        cfg = self.cfg
        usable = [s for s in samples if s.result.trainable and segments.trained_segments(s.result)]
        metrics: dict[str, float] = {"episodes_trained": float(len(usable))}
        if not usable:
            return metrics
        rows = segments.segment_rows([s.result for s in usable])  # one row per segment (train/segments.py)
        metrics["segments_trained"] = float(len(rows.trajectories))
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
        total_tokens = int(batch.response_mask.sum())
        actor_cfg = algo.actor_config(
            cfg.algo.loss_mode,
            cfg.algo.clip_ratio_low,
            cfg.algo.clip_ratio_high,
            cfg.algo.clip_ratio_c,
            total_tokens,
            len(batch),
        )
        self._assert_idle()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {"pg_loss": 0.0, "kl_loss": 0.0}
        weighted: dict[str, float] = {"pg_clipfrac": 0.0, "ppo_kl": 0.0, "pg_clipfrac_lower": 0.0}
        mb = cfg.trainer.micro_batch_size
        corr = cfg.algo.rollout_correction
        recomputed = torch.zeros_like(batch.old_log_probs)  # the trainer's logprobs of the rollout tokens
        for start in range(0, len(batch), mb):
            rows = slice(start, start + mb)
            micro = batch.select(rows)
            adv = advantages[rows, : micro.response_ids.shape[1]]
            logp = algo.response_log_probs(self.policy, micro)
            recomputed[rows, : logp.shape[1]] = logp.detach()
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
            if self.ref is not None:
                with torch.no_grad():
                    ref_logp = algo.response_log_probs(self.ref, micro)
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
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.optim.grad_clip)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            log.warning("step %d: non-finite grad norm, update skipped", self.step)
        self.optimizer.zero_grad(set_to_none=True)
        metrics.update(sums)
        metrics.update(weighted)
        metrics["loss"] = sums["pg_loss"] + cfg.algo.kl_loss_coef * sums["kl_loss"]
        metrics["grad_norm"] = float(grad_norm)
        metrics["train_tokens"] = float(total_tokens)
        metrics["adv_abs_mean"] = float((advantages.abs() * batch.response_mask).sum() / max(total_tokens, 1))
        level = corr.rollout_is or "token"
        gap = mismatch.mismatch_metrics(
            recomputed, batch.old_log_probs, batch.response_mask, level, corr.threshold_spec
        )
        metrics.update(gap)
        return metrics

    # ------------------------------------------------------------------------------- loop

    async def train_step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        before = self.engine.stats.generated_tokens
        samples = await self.rollout(self.pick_tasks())
        check_infra_failures(
            [(s.result.exit_reason, s.result.error) for s in samples],
            self.cfg.trainer.max_infra_failure_share,
            "trainer.max_infra_failure_share",
            where=f"step {self.step + 1}",
        )
        rollout_s = time.perf_counter() - t0
        generated = self.engine.stats.generated_tokens - before
        t1 = time.perf_counter()
        loop = asyncio.get_running_loop()
        losses = await loop.run_in_executor(self._worker, self.update, samples)
        release_memory()
        update_s = time.perf_counter() - t1
        self.step += 1
        trainable = [s for s in samples if s.result.trainable]
        rewards = [s.result.reward.value for s in trainable]
        exits: dict[str, int] = {}
        for s in samples:
            exits[s.result.exit_reason.value] = exits.get(s.result.exit_reason.value, 0) + 1
        row: dict[str, Any] = {
            "step": self.step,
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "resolved_rate": sum(s.result.resolved for s in trainable) / len(trainable)
            if trainable
            else None,
            "episodes": len(samples),
            "untrainable": len(samples) - len(trainable),
            **losses,
            "rollout_tokens_per_s": generated / rollout_s if rollout_s > 0 else 0.0,
            "train_tokens_per_s": losses.get("train_tokens", 0.0) / update_s if update_s > 0 else 0.0,
            "rollout_s": rollout_s,
            "update_s": update_s,
            "step_s": time.perf_counter() - t0,
            "rss_mb": rss_mb(),
            "exit_reasons": exits,
            "time": time.time(),
        }
        self._writers.write(row)
        return row

    async def train(self, on_step: Any = None) -> list[dict[str, Any]]:
        """Run until `trainer.steps`; checkpoint every `save_every` and at the end; keep the curve fresh."""
        rows: list[dict[str, Any]] = []
        every = self.cfg.trainer.save_every
        try:
            while self.step < self.cfg.trainer.steps:
                row = await self.train_step()
                rows.append(row)
                plot_rewards(self.out / METRICS, self.out / CURVE)
                if on_step is not None:
                    on_step(row)
                if (every and self.step % every == 0) or self.step == self.cfg.trainer.steps:
                    await asyncio.get_running_loop().run_in_executor(self._worker, self.save)
        finally:
            self._writers.close()
        return rows

    def close(self) -> None:
        self.engine.close()
        self._worker.shutdown(wait=True)

    # ------------------------------------------------------------------------------- checkpoints

    def save(self) -> Path:
        """Model, optimizer, step and every RNG the run draws from, written atomically."""
        self._assert_idle()
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        path = self.ckpt_dir / f"step_{self.step:06d}.pt"
        state = {
            "step": self.step,
            "model": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": {
                "trainer": self.rng.getstate(),
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            },
            "config": self.redactor().data(self.cfg.model_dump(mode="json")),
        }
        tmp = path.with_suffix(".pt.tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        for old in sorted(self.ckpt_dir.glob("step_*.pt"))[: -self.cfg.trainer.keep_checkpoints]:
            old.unlink(missing_ok=True)
        return path

    def _load(self, path: Path) -> None:
        state = torch.load(path, map_location=self.cfg.model.device, weights_only=False)
        self.policy.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        rng = state["rng"]
        self.rng.setstate(rng["trainer"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        truncate_metrics(self.out / METRICS, self.step)
        log.info("resumed from %s at step %d", path, self.step)


def run_local(cfg: TrainConfig, resume: bool = False, on_step: Any = None) -> list[dict[str, Any]]:
    """Build the trainer, train, close the engine; what `uniagent train --engine local` calls."""
    trainer = LocalTrainer(cfg, resume=resume)
    try:
        return asyncio.run(trainer.train(on_step))
    finally:
        trainer.close()
