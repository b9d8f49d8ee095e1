"""`trainer.mode: async`: rollouts never wait for the trainer (verl's fully-async mode, on one machine).

How it works, and why
---------------------
- **Two copies of the weights.** The engine serves its own copy of the policy on its own thread and
  core budget (`trainer.engine_threads`, half the cores); the trainer updates the policy on its own
  thread (`trainer.trainer_threads`, every core: the update is what a step waits for, and the
  engine idles part of it). After each optimizer step the new weights go to the engine with
  `LocalEngine.update_weights`, applied between two decode steps. With `trainer.partial_rollout`
  (the default) generations in flight are interrupted there and resumed under the new weights: the
  interrupted prefix's keys/values are recomputed (stale ones would give logprobs of no policy), and
  every token keeps the logprob and the policy version it was sampled with; `trainer.kv_on_update:
  keep` lets the running rows go on with the old keys/values instead (nothing is prefilled again).
  Without partial rollout the update waits for the running generations to finish.
- **Producer.** `Rollouts` keeps groups (`group_size` episodes of one task) in flight up to
  `trainer.concurrency` episodes. A group may start only while
  `groups started - groups dropped < (version + max_staleness + 1) * tasks_per_step` (AReaL's
  bound): with oldest-first consumption no group is trained more than `max_staleness` versions
  after it started. Dropped groups (zero variance under dynamic sampling, or stale) free their slot,
  so a filter can never starve the trainer.
- **Consumer.** Each step takes the `tasks_per_step` oldest finished groups, drops a group whose
  oldest token is more than `max_staleness` versions behind (counted, never trained), trains, and
  publishes the weights. The staleness of every trained episode goes into the step's histogram.
- **Checkpoint/resume.** A checkpoint holds the version, the producer's counters, the cumulative
  staleness histogram, the finished groups not yet trained (their episodes, so nothing is lost) and
  the groups in flight (task, serial, start version). On resume the finished groups are trained
  first and the in-flight ones start again with the same seeds, so the run continues its curve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from uniagent.errors import TrainingError
from uniagent.train.sample import Sample, staleness_hist

if TYPE_CHECKING:
    import concurrent.futures
    from pathlib import Path

    import torch

    from uniagent.models.local import LocalEngine
    from uniagent.tasks.base import Task
    from uniagent.tokens import ChatCodec
    from uniagent.train.config import TrainConfig

log = logging.getLogger(__name__)


class AsyncTrainer(Protocol):
    """What the async loop uses of the trainer (`train.local.LocalTrainer` is one; no import, no
    cycle): its state, the engine it publishes weights to, and the steps it shares with the sync
    loop (rollout of a group, the update, the metrics row, checkpoints)."""

    cfg: TrainConfig
    tasks: list[Task]
    step: int
    async_state: dict[str, Any]
    engine: LocalEngine
    codec: ChatCodec
    policy: torch.nn.Module
    worker: concurrent.futures.Executor  # the one thread updates and saves run on

    def pick_task(self) -> Task: ...

    def task_by_id(self, instance_id: str) -> Task: ...

    async def run_group(
        self, task: Task, serial: str, first_sample: int, agent: Any, gate: Any
    ) -> list[Sample]: ...

    def group_dropped_reason(self, group: list[Sample]) -> str | None: ...

    def check_infra(self, samples: list[Sample]) -> None: ...

    def update(self, samples: list[Sample]) -> dict[str, float]: ...

    def served_state(self) -> dict[str, torch.Tensor] | None: ...

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
    ) -> dict[str, Any]: ...

    def write_row(self, row: dict[str, Any]) -> None: ...

    def save_due(self) -> bool: ...

    def save(self) -> Path: ...


class Activity:
    """Samples whether the engine has a generation queued or running; `idle_share()` is the share of
    wall time since the last call when it had none (the engine-idle fraction of a step)."""

    def __init__(self, engine: Any, period_s: float = 0.02) -> None:
        self.engine = engine
        self.period_s = period_s
        self.idle_s = 0.0
        self.since = time.perf_counter()
        self._task: asyncio.Task[None] | None = None

    def busy(self) -> bool:
        return self.engine.stats.in_flight > 0

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(self.period_s)
            now = time.perf_counter()
            if not self.busy():
                self.idle_s += now - last
            last = now

    def start(self) -> Activity:
        self._task = asyncio.create_task(self._run())
        return self

    def idle_share(self) -> float:
        now = time.perf_counter()
        wall = now - self.since
        share = min(1.0, self.idle_s / wall) if wall > 0 else 0.0
        self.idle_s, self.since = 0.0, now
        return share

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass
class Group:
    """One task's `group_size` episodes, started together at `start_version`."""

    serial: int
    task_id: str
    start_version: int
    samples: list[Sample] = field(default_factory=list)

    @property
    def oldest_version(self) -> int:
        return min((s.oldest_version for s in self.samples), default=self.start_version)


class Rollouts:
    """The producer: starts groups under the staleness bound and collects the finished ones."""

    def __init__(self, trainer: AsyncTrainer, agent: Any) -> None:
        self.trainer = trainer
        self.agent = agent
        cfg = trainer.cfg.trainer
        self.batch = min(cfg.tasks_per_step, len(trainer.tasks))
        self.gate = asyncio.Semaphore(cfg.concurrency)
        state = trainer.async_state
        self.started: int = state.get("groups_started", 0)
        self.dropped: int = state.get("groups_dropped", 0)
        self.finished: list[Group] = [Group(**g) for g in state.get("finished", [])]
        self.restart: list[dict[str, Any]] = list(state.get("in_flight", []))
        self.in_flight: dict[int, tuple[Group, asyncio.Task[list[Sample]]]] = {}
        self.changed = asyncio.Condition()
        self.error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    # -- the bound ------------------------------------------------------------------------
    def allowed(self) -> int:
        """How many groups may have started by now (AReaL's staleness bound, dropped ones refunded)."""
        version = self.trainer.step
        return (version + self.trainer.cfg.trainer.max_staleness + 1) * self.batch + self.dropped

    def episodes_in_flight(self) -> int:
        return len(self.in_flight) * self.trainer.cfg.trainer.group_size

    def _can_start(self) -> bool:
        cfg = self.trainer.cfg.trainer
        room = self.episodes_in_flight() + cfg.group_size <= max(cfg.concurrency, cfg.group_size)
        return self.started < self.allowed() and room

    # -- producing ------------------------------------------------------------------------
    def start(self) -> Rollouts:
        self._task = asyncio.create_task(self._produce())
        return self

    async def _produce(self) -> None:
        try:
            for spec in self.restart:  # groups a checkpoint saw in flight: again, same seeds
                self._launch(self.trainer.task_by_id(spec["task_id"]), spec["serial"], spec["start_version"])
            self.restart = []
            while True:
                async with self.changed:
                    await self.changed.wait_for(self._can_start)
                serial = self.started
                self.started += 1
                self._launch(self.trainer.pick_task(), serial, self.trainer.step)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the consumer must hear of it, not wait forever
            self.error = exc
            async with self.changed:
                self.changed.notify_all()

    def _launch(self, task: Any, serial: int, start_version: int) -> None:
        group = Group(serial, task.instance_id, start_version)
        self.in_flight[serial] = (group, asyncio.create_task(self._run(group, task)))

    async def _run(self, group: Group, task: Any) -> list[Sample]:
        """One group from start to the finished list (or to `error`, which the consumer raises)."""
        size = self.trainer.cfg.trainer.group_size
        try:
            group.samples = await self.trainer.run_group(
                task, f"g{group.serial}", group.serial * size, self.agent, self.gate
            )
        except asyncio.CancelledError:
            self.in_flight.pop(group.serial, None)
            raise
        except BaseException as exc:
            self.error = exc
        else:
            self.finished.append(group)
        self.in_flight.pop(group.serial, None)
        async with self.changed:
            self.changed.notify_all()
        return group.samples

    # -- consuming ------------------------------------------------------------------------
    async def take(self, keep: Any, max_drops: int = 0) -> tuple[list[Group], dict[str, int]]:
        """The step's `tasks_per_step` groups, oldest first. `keep(group) -> reason | None` drops a
        group (stale, zero variance); dropped groups refund their slot to the producer. More than
        `max_drops` zero-variance drops in one step (0: no cap) raise `TrainingError`, as the sync
        loop does after `filter_groups.max_num_gen_batches` batches."""
        chosen: list[Group] = []
        counts: dict[str, int] = {}
        while len(chosen) < self.batch:
            async with self.changed:
                await self.changed.wait_for(lambda: bool(self.finished) or self.error is not None)
            if self.error is not None:
                raise self.error
            self.finished.sort(key=lambda g: g.serial)
            group = self.finished.pop(0)
            reason = keep(group)
            if reason is None:
                chosen.append(group)
                continue
            counts[reason] = counts.get(reason, 0) + 1
            self.dropped += 1
            if max_drops and counts.get("zero_variance", 0) > max_drops:
                raise TrainingError(
                    f"{counts['zero_variance']} groups in a row had no reward variance (dynamic sampling "
                    f"dropped them); the tasks are too easy or too hard for the policy: raise "
                    "algo.filter_groups.max_num_gen_batches (0: no cap) or change the tasks"
                )
            async with self.changed:
                self.changed.notify_all()
        return chosen, counts

    async def version_changed(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def snapshot(self) -> dict[str, Any]:
        """What a checkpoint keeps: counters, finished groups (episodes and all), groups in flight."""
        return {
            "groups_started": self.started,
            "groups_dropped": self.dropped,
            "finished": [
                {
                    "serial": g.serial,
                    "task_id": g.task_id,
                    "start_version": g.start_version,
                    "samples": g.samples,
                }
                for g in self.finished
            ],
            "in_flight": [
                {"serial": g.serial, "task_id": g.task_id, "start_version": g.start_version}
                for g, _ in self.in_flight.values()
            ]
            + self.restart,
        }

    async def stop(self) -> None:
        """Cancel the producer and every group in flight (their sandboxes stop, their requests end)."""
        tasks = [job for _, job in self.in_flight.values()]
        if self._task is not None:
            tasks.append(self._task)
        for job in tasks:
            job.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def train_async(trainer: AsyncTrainer, on_step: Any = None) -> list[dict[str, Any]]:
    """The async loop: consume finished groups, train, publish weights; until `trainer.steps`."""
    from uniagent.agent.base import open_agent

    cfg = trainer.cfg
    rows: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    hist: dict[str, int] = dict(trainer.async_state.get("staleness_hist_total", {}))
    async with open_agent(cfg.agent.kind, trainer.engine, trainer.codec) as agent:
        rollouts = Rollouts(trainer, agent).start()
        activity = Activity(trainer.engine).start()
        try:
            while trainer.step < cfg.trainer.steps:
                t0 = time.perf_counter()
                tokens0 = trainer.engine.stats.generated_tokens
                version = trainer.step

                def keep(group: Group, version: int = version) -> str | None:
                    if version - group.oldest_version > cfg.trainer.max_staleness:
                        return "stale"
                    return trainer.group_dropped_reason(group.samples)

                cap = cfg.algo.filter_groups.max_num_gen_batches * rollouts.batch
                groups, dropped = await rollouts.take(keep, cap)
                wait_s = time.perf_counter() - t0
                samples = [s for g in groups for s in g.samples]
                trainer.check_infra(samples)
                t1 = time.perf_counter()
                losses = await loop.run_in_executor(trainer.worker, trainer.update, samples)
                update_s = time.perf_counter() - t1
                t2 = time.perf_counter()
                sync = trainer.engine.update_weights(
                    trainer.served_state(),
                    trainer.step + 1,
                    interrupt=cfg.trainer.partial_rollout,
                    keep_kv=cfg.trainer.partial_rollout and cfg.trainer.kv_on_update == "keep",
                )
                synced = await asyncio.wrap_future(sync)
                sync_s = time.perf_counter() - t2
                trainer.step += 1
                await rollouts.version_changed()
                step_hist = staleness_hist(samples, version)
                for lag, n in step_hist.items():
                    hist[lag] = hist.get(lag, 0) + n
                step_s = time.perf_counter() - t0
                generated = trainer.engine.stats.generated_tokens - tokens0
                row = trainer.step_row(
                    samples,
                    losses,
                    step_s=step_s,
                    rollout_s=step_s,
                    update_s=update_s,
                    generated=generated,
                    extra={
                        "wait_s": wait_s,
                        "sync_s": sync_s,
                        "trainer_idle_frac": min(1.0, wait_s / step_s) if step_s > 0 else 0.0,
                        "engine_idle_frac": activity.idle_share(),
                        "interrupted": int(synced.get("interrupted", 0)),
                        "staleness_hist": step_hist,
                        "staleness_max": max((int(k) for k in step_hist), default=0),
                        "episodes_stale_dropped": dropped.get("stale", 0) * cfg.trainer.group_size,
                        "groups_dropped_zero_variance": dropped.get("zero_variance", 0),
                        "groups_in_flight": len(rollouts.in_flight),
                    },
                )
                trainer.write_row(row)
                rows.append(row)
                if on_step is not None:
                    on_step(row)
                trainer.async_state = {**rollouts.snapshot(), "staleness_hist_total": hist}
                if trainer.save_due():
                    await loop.run_in_executor(trainer.worker, trainer.save)
        finally:
            await activity.stop()
            await rollouts.stop()
    return rows
