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
4. **Update** (train/update.py): AdamW, global grad-norm clip. In `trainer.mode: sync` generation
   and update never overlap: a step starts only after every rollout request has returned (checked
   against the engine's counters). `trainer.mode: async` (train/async_loop.py) overlaps them with a
   separate engine copy, weight sync with partial rollout and a staleness bound.
5. **Filters** (train/filters.py, both modes): DAPO dynamic sampling, overlong filtering, and how
   unfinished episodes count in a group's baseline. Checkpoints: train/checkpoint.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import logging
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import torch

from uniagent.agent.result import check_infra_failures
from uniagent.cpu import release_openmp_team
from uniagent.errors import ConfigError, UniAgentError
from uniagent.models.linear import pack_linears
from uniagent.models.precision import resolve as resolve_precision
from uniagent.models.precision import served_copy
from uniagent.redact import Redactor, setting_secrets, shared_redactor
from uniagent.tasks.base import Task
from uniagent.train import filters
from uniagent.train.config import TrainConfig
from uniagent.train.outputs import (
    CURVE,
    METRICS,
    Writers,
    plot_rewards,
    release_memory,
    rss_mb,
)
from uniagent.train.sample import Sample, staleness_hist

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


class LocalTrainer:
    """Owns the policy, the optimizer, the shared engine and the output directory."""

    def __init__(self, cfg: TrainConfig, resume: bool = False) -> None:
        from uniagent.models.factory import local_weights
        from uniagent.models.kv import use_gqa_attention
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
        # fp32 master weights and optimizer state whatever model.dtype says: a bf16 compute precision
        # runs under autocast (models/precision.py), the engine serves a copy in that precision.
        self.precision = resolve_precision(cfg.model.dtype, cfg.model.device)
        if self.precision.dtype == "float16":
            raise ConfigError("model.dtype float16: the local trainer has no loss scaler; use bfloat16, auto")
        log.info("trainer computes in %s (%s); masters float32", self.precision.dtype, self.precision.why)
        self.policy = load_causal_lm(source, device=cfg.model.device, dtype="float32")
        # The copy-free GQA attention (models/kv.py) for the update and the engine alike: stock sdpa
        # repeats every key/value head 3x whenever rows are padded, which was a third of the engine's
        # forward time in a lookup step. Same logprobs and gradients (tests/test_train_prefix.py).
        use_gqa_attention(self.policy)
        self.ref: torch.nn.Module | None = None
        if cfg.algo.kl_loss_coef > 0:
            self.ref = copy.deepcopy(self.policy).requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(),
            lr=cfg.optim.lr,
            betas=cfg.optim.betas,
            weight_decay=cfg.optim.weight_decay,
        )
        self.step = 0  # = the policy version: every optimizer step makes a new one
        self.rng = random.Random(cfg.trainer.seed)
        torch.manual_seed(cfg.trainer.seed)
        self.async_state: dict[str, Any] = {}  # the async loop's bookkeeping, kept in checkpoints
        if resume and existing:
            self._load(existing[-1])
        elif not resume:
            (self.out / METRICS).unlink(missing_ok=True)
        # sync: the engine serves the trainer's own parameters (an optimizer step is what the next
        # rollout samples from); async: it serves a copy that `update_weights` refreshes between two
        # decode steps, so rollouts never wait for an update and an update never races a forward.
        # A bf16 engine serves a bf16 copy in either mode, refreshed after each update.
        self.shared = cfg.trainer.mode == "sync" and not self.precision.mixed
        served = self.policy if self.shared else served_copy(self.policy, self.precision)
        # The engine's products take weights laid out once where the probe picked it for their dtype
        # (models/linear.py), the shared policy's too: an optimizer step writes a weight in place and
        # the engine lays it out again on its next call, while autograd keeps torch's own product, so
        # the update's forward and backward are unchanged.
        pack_linears(served)
        self.engine = LocalEngine.from_model(
            served, max_batch_size=cfg.model.max_batch_size, version=self.step, threads=self.engine_threads
        )
        self._engine_mark: dict[str, int] = {}  # engine counters at the last step row (`engine_work`)
        self._writers = Writers(self.out, cfg, self.redactor)
        # Updates and saves run on one dedicated thread (both loops use it): a fresh pool thread per
        # step would give each its own malloc arena and OpenMP team (memory fragmentation, slower
        # kernels on few cores).
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer")
        # Loading and laying out weights ran parallel torch work on this thread; from here on the
        # engine's and the update's threads run it, and a third idle team would throttle both.
        release_openmp_team()

    # ------------------------------------------------------------------------------- rollout

    def redactor(self) -> Redactor:
        """The environment's secrets (as they are now) and the sandbox settings' tokens, redacted
        as `uniagent run` redacts what it stores: the same `uniagent.redact`."""
        return shared_redactor(setting_secrets(self.cfg.sandbox), self.codec.tokenizer)

    @property
    def engine_threads(self) -> int | None:
        """async: the engine's torch threads (default half the cores); sync: torch's default."""
        if self.cfg.trainer.mode == "sync":
            return None
        return self.cfg.trainer.engine_threads or max(1, (os.cpu_count() or 2) // 2)

    @property
    def trainer_threads(self) -> int | None:
        """async: the update's torch threads (default: every core). The update is what an async step
        waits for once the engine runs a group's prompt once and attends without copies: measured on
        2 cores (bench/train_async.py, 8 lookup steps), the engine idled 41 % of a step and the update
        on one thread took 45 s a step; on both (3 threads in all) the step took 38.7 s. Before those
        engine changes the engine was the bottleneck and both cores for the update gained nothing."""
        if self.cfg.trainer.mode == "sync":
            return None
        return self.cfg.trainer.trainer_threads or os.cpu_count() or 2

    def pick_tasks(self) -> list[Task]:
        n = min(self.cfg.trainer.tasks_per_step, len(self.tasks))
        return self.rng.sample(self.tasks, n)

    def pick_task(self) -> Task:
        """One task for one async group (drawn with replacement: groups are started one at a time)."""
        return self.rng.choice(self.tasks)

    async def run_group(
        self, task: Task, serial: str, first_sample: int, agent: Any, gate: Any
    ) -> list[Sample]:
        """`group_size` episodes of `task` through `run_episode` (the code `uniagent run` and the verl
        loop use). `serial` names the group (its GRPO index); `first_sample` seeds its episodes."""
        from uniagent.models.factory import ModelFactory
        from uniagent.tasks.episode import run_episode

        cfg = self.cfg
        redactor = self.redactor()
        start = self.step
        models = ModelFactory.over_engine(self.engine, self.codec, cfg.model)  # the policy's own engine

        async def one(k: int) -> Sample:
            rid = f"{task.instance_id}#{serial}#{k}"
            model = models.new_model(task.instance_id, first_sample + k, cfg.trainer.seed, request_id=rid)
            async with gate:
                result = await run_episode(task, model, cfg.agent, cfg.sandbox, agent=agent)
            # an episode whose tokens held a secret is not trained on (the policy would learn to say it)
            result = await asyncio.to_thread(redactor.episode, result)
            return Sample(task, f"{task.instance_id}#{serial}", result, start)

        return list(await asyncio.gather(*(one(k) for k in range(cfg.trainer.group_size))))

    async def rollout(self, tasks: list[Task], batch: int = 0) -> list[Sample]:
        """One sync rollout batch: `group_size` episodes per task, all on the policy's current weights.
        `batch` > 0 numbers the extra batches dynamic sampling asks for (their seeds differ)."""
        from uniagent.agent.base import open_agent

        cfg = self.cfg
        gate = asyncio.Semaphore(cfg.trainer.concurrency)
        first = (self.step + batch * cfg.trainer.steps) * cfg.trainer.group_size
        tag = f"{self.step}" if batch == 0 else f"{self.step}.{batch}"
        # the agent's per-run resources (a harness's gateway) serve the step's episodes
        async with open_agent(cfg.agent.kind, self.engine, self.codec) as agent:
            groups = [self.run_group(t, tag, first, agent, gate) for t in tasks]
            return [s for group in await asyncio.gather(*groups) for s in group]

    def assert_idle(self) -> None:
        """Shared weights (sync) may change only while no generation is queued or running; an async
        engine serves its own copy, refreshed by `update_weights` between two decode steps."""
        if not self.shared:
            return
        busy = self.engine.stats.in_flight
        if busy:
            raise UniAgentError(
                f"engine still has {busy} request(s) in flight; "
                "refusing to update weights under a running generation"
            )

    # ------------------------------------------------------------------------------- update

    def served_state(self) -> dict[str, torch.Tensor] | None:
        """What an update sends the engine: nothing when it serves the policy itself (sync, fp32: the
        version only), else the policy's weights, cast to the served precision as they are copied."""
        if self.shared:
            return None
        return {k: v.detach() for k, v in self.policy.state_dict().items()}

    def update(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step on the trainable samples (train/update.py); returns loss metrics."""
        from uniagent.train.update import policy_update

        try:
            return policy_update(self, samples)
        finally:  # the update's threads would slow the engine's team until the next one (uniagent.cpu)
            release_openmp_team()

    def task_by_id(self, instance_id: str) -> Task:
        for task in self.tasks:
            if task.instance_id == instance_id:
                return task
        raise UniAgentError(f"the checkpoint names task {instance_id!r}, which tasks.spec no longer holds")

    def check_infra(self, samples: list[Sample]) -> None:
        """Stop training (`TrainingError`) when infrastructure failures exceed their allowed share."""
        check_infra_failures(
            [(s.result.exit_reason, s.result.error) for s in samples],
            self.cfg.trainer.max_infra_failure_share,
            "trainer.max_infra_failure_share",
            where=f"step {self.step + 1}",
        )

    def save_due(self) -> bool:
        """A checkpoint every `save_every` steps (0: none) and after the last."""
        every = self.cfg.trainer.save_every
        return bool(every and self.step % every == 0) or self.step == self.cfg.trainer.steps

    def group_dropped_reason(self, group: list[Sample]) -> str | None:
        """DAPO dynamic sampling: `zero_variance` for a group that trains nothing, else None."""
        if self.cfg.algo.filter_groups.enable and not filters.group_has_signal(
            group, self.cfg.algo.filter_groups.metric, self.cfg.algo
        ):
            return "zero_variance"
        return None

    def engine_work(self) -> dict[str, int]:
        """The engine's work since the last call (prompt tokens run, prompt tokens a kept prefix saved,
        decode steps, prefill forwards, rows interrupted by an update): where a step's rollout time went."""
        now = dataclasses.asdict(self.engine.stats)
        last, self._engine_mark = self._engine_mark, now
        keys = ("prefill_tokens", "prefix_reused_tokens", "decode_steps", "prefill_batches", "interrupted")
        return {k: now[k] - last.get(k, 0) for k in keys}

    def step_row(
        self,
        samples: list[Sample],
        losses: dict[str, float],
        *,
        step_s: float,
        rollout_s: float,
        update_s: float,
        generated: int,
        extra: dict[str, Any],
    ) -> dict[str, Any]:
        """The metrics row of a step (sync and async write the same keys; see the module docstring)."""
        trainable = [s for s in samples if s.result.trainable]
        rewards = [s.result.reward.value for s in trainable]
        engine = self.engine_work()
        exits: dict[str, int] = {}
        for s in samples:
            exits[s.result.exit_reason.value] = exits.get(s.result.exit_reason.value, 0) + 1
        return {
            "step": self.step,
            "mode": self.cfg.trainer.mode,
            "dtype": self.precision.dtype,  # the compute precision (masters are fp32)
            "policy_version": self.step,
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "resolved_rate": sum(s.result.resolved for s in trainable) / len(trainable)
            if trainable
            else None,
            "episodes": len(samples),
            "untrainable": len(samples) - len(trainable),
            **losses,
            "generated_tokens": generated,
            "rollout_tokens_per_s": generated / rollout_s if rollout_s > 0 else 0.0,
            "train_tokens_per_s": losses.get("train_tokens", 0.0) / update_s if update_s > 0 else 0.0,
            "rollout_s": rollout_s,
            "update_s": update_s,
            "step_s": step_s,
            "rss_mb": rss_mb(),
            "exit_reasons": exits,
            "engine": engine,
            **extra,
            "time": time.time(),
        }

    def write_row(self, row: dict[str, Any]) -> None:
        self._writers.write(row)
        plot_rewards(self.out / METRICS, self.out / CURVE)

    async def train_step(self, activity: Any = None) -> dict[str, Any]:
        """One sync step: rollout batches (more of them when dynamic sampling drops groups), then the
        update; generation and update never overlap."""
        cfg = self.cfg
        t0 = time.perf_counter()
        before = self.engine.stats.generated_tokens
        sampling: filters.DynamicSampling[Sample] = filters.DynamicSampling(
            cfg.algo, cfg.trainer.tasks_per_step
        )
        seen: list[Sample] = []
        while sampling.need_more():  # one batch, or more while dynamic sampling drops groups
            samples = await self.rollout(self.pick_tasks(), sampling.batches)
            seen.extend(samples)
            self.check_infra(samples)
            sampling.add(samples)
        trained = sampling.take()
        rollout_s = time.perf_counter() - t0
        generated = self.engine.stats.generated_tokens - before
        t1 = time.perf_counter()
        loop = asyncio.get_running_loop()
        losses = await loop.run_in_executor(self.worker, self.update, trained)
        release_memory()
        update_s = time.perf_counter() - t1
        self.step += 1
        await asyncio.wrap_future(self.engine.update_weights(self.served_state(), self.step))
        step_s = time.perf_counter() - t0
        row = self.step_row(
            trained if cfg.algo.filter_groups.enable else seen,
            losses,
            step_s=step_s,
            rollout_s=rollout_s,
            update_s=update_s,
            generated=generated,
            extra={
                "trainer_idle_frac": rollout_s / step_s if step_s > 0 else 0.0,
                "engine_idle_frac": activity.idle_share() if activity is not None else None,
                "interrupted": 0,
                "staleness_hist": staleness_hist(trained, self.step - 1),
                "staleness_max": 0,
                "rollout_batches": sampling.batches,
                "groups_dropped_zero_variance": sampling.groups_dropped,
            },
        )
        self.write_row(row)
        return row

    async def train(self, on_step: Any = None) -> list[dict[str, Any]]:
        """Run until `trainer.steps`; checkpoint every `save_every` and at the end; keep the curve fresh."""
        from uniagent.train.async_loop import Activity, train_async

        try:
            if self.cfg.trainer.mode == "async":
                return await train_async(self, on_step)
            rows: list[dict[str, Any]] = []
            activity = Activity(self.engine).start()
            try:
                while self.step < self.cfg.trainer.steps:
                    row = await self.train_step(activity)
                    rows.append(row)
                    if on_step is not None:
                        on_step(row)
                    if self.save_due():
                        await asyncio.get_running_loop().run_in_executor(self.worker, self.save)
            finally:
                await activity.stop()
            return rows
        finally:
            self._writers.close()

    def close(self) -> None:
        self.engine.close()
        self.worker.shutdown(wait=True)

    # ------------------------------------------------------------------------------- checkpoints

    def save(self) -> Path:
        """Model, optimizer, step, RNG states and the async bookkeeping (train/checkpoint.py)."""
        from uniagent.train.checkpoint import save_checkpoint

        self.assert_idle()
        return save_checkpoint(self)

    def _load(self, path: Path) -> None:
        from uniagent.train.checkpoint import load_checkpoint

        load_checkpoint(self, path)


def run_local(
    cfg: TrainConfig, resume: bool = False, on_step: Any = None, resume_command: str | None = None
) -> list[dict[str, Any]]:
    """Build the trainer, train, close the engine; what `uniagent train --engine local` calls.

    SIGTERM/SIGINT stop it cleanly (runner/interrupt.py): the step in progress is abandoned, its
    sandboxes torn down, and `RunInterruptedError` says to continue from the last checkpoint
    (`resume_command`: the exact line, when the CLI gives it)."""
    from uniagent.runner.interrupt import Stopper

    trainer = LocalTrainer(cfg, resume=resume)

    def message(signum: int) -> str:
        how = f"resume with: {resume_command}" if resume_command else "resume: the same command with --resume"
        return (
            f"training interrupted by {signal.Signals(signum).name} during step {trainer.step + 1}; "
            f"checkpoints are in {cfg.trainer.output / 'checkpoints'}; no sandbox is left behind.\n{how}"
        )

    try:
        return asyncio.run(Stopper(message).run(trainer.train(on_step)))
    finally:
        trainer.close()
