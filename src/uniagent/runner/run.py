"""The main job: many episodes at once, each stored the moment it ends, resumable.

Work is the list of (instance, sample) pairs not yet in the store. Episodes run concurrently
(asyncio here, or Ray actors with the same code inside), sandbox starts are bounded
separately, and every finished episode is committed to the store before it counts as done,
so a killed run resumes exactly where it stopped.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from uniagent.agent.result import ExitReason
from uniagent.errors import ConfigError, RunInterruptedError, RunStoppedError
from uniagent.runner.config import RUN_BACKENDS, RunConfig
from uniagent.runner.guard import InfraGuard
from uniagent.runner.interrupt import Stopper
from uniagent.runner.pidfd import use_pidfd_child_watcher
from uniagent.runner.redact import run_redactor
from uniagent.runner.store import RunStore, episode_row
from uniagent.runner.summary import export
from uniagent.runner.worker import EpisodeWorker
from uniagent.sandbox.config import SandboxConfig
from uniagent.tasks import load_tasks
from uniagent.tasks.base import Task

log = logging.getLogger(__name__)
STORE_NAME = "run.db"


@dataclass
class Progress:
    total: int
    done: int = 0
    resolved: int = 0
    skipped: int = 0
    tokens: int = 0
    exits: collections.Counter[str] = field(default_factory=collections.Counter)
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def episodes_per_min(self) -> float:
        """Episodes finished by this invocation (not the ones a resumed run found stored)."""
        return (self.done - self.skipped) / self.elapsed * 60 if self.elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        ran = self.done - self.skipped
        if ran <= 0:
            return None
        return self.elapsed / ran * (self.total - self.done)


class Runner:
    def __init__(
        self,
        config: RunConfig,
        on_progress: Callable[[Progress], None] | None = None,
        resume_command: str | None = None,
    ) -> None:
        self.config = config
        self.out = Path(config.runner.output)
        self.on_progress = on_progress
        self.redactor = run_redactor(config)
        self.progress: Progress | None = None
        self.guard = InfraGuard(config.runner.stop_after_infra_failures)
        self.stopped: str | None = None  # set when the guard trips or a signal comes: no new episode starts
        self.resume_command = resume_command  # the CLI's exact line; printed when a signal stops the run
        self.signum: int | None = None  # SIGTERM / SIGINT received (runner/interrupt.py)
        self.interrupted = 0  # episodes cut short by it, stored as interrupted

    # -- setup ---------------------------------------------------------------------------
    def open_store(self) -> RunStore:
        path = self.out / STORE_NAME
        existing = path.exists()
        store = RunStore(path)
        if existing and store.count() and not self.config.runner.resume:
            n = store.count()
            store.close()
            raise ConfigError(
                f"{self.out} already holds a run with {n} episodes: pass --resume to continue it, "
                "or choose another --output"
            )
        return store

    def pending(self, tasks: list[Task], store: RunStore) -> list[tuple[Task, int]]:
        done = store.done_pairs(include_untrainable_failures=not self.config.runner.retry_failed)
        pairs = [(t, s) for t in tasks for s in range(self.config.runner.samples)]
        return [(t, s) for t, s in pairs if (t.instance_id, s) not in done]

    def _save_config(self, store: RunStore) -> None:
        data = self.redactor.data(self.config.model_dump(mode="json"))
        (self.out / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        store.set_meta("config", data)

    # -- run -----------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        """The run; SIGTERM/SIGINT stop it cleanly (`_on_signal`) and raise `RunInterruptedError`."""
        return await Stopper(self.interrupt_message, self._on_signal).run(self._run())

    def _on_signal(self, signum: int) -> None:
        self.signum = signum
        self.stopped = self.stopped or f"interrupted by {signal.Signals(signum).name}"

    def interrupt_message(self, signum: int) -> str:
        """What the user reads when a signal stopped the run: what is stored, what resume redoes,
        and the exact command."""
        p = self.progress
        done, total = (p.done, p.total) if p is not None else (0, 0)
        left = max(total - done - self.interrupted, 0)
        how = (
            f"resume with: {self.resume_command}"
            if self.resume_command
            else f"resume: the same run with --resume --output {self.out}"
        )
        return (
            f"interrupted by {signal.Signals(signum).name}: {done} of {total} episodes are done and "
            f"stored in {self.out}; {self.interrupted} cut short (stored as interrupted) and {left} not "
            f"started run on resume; no sandbox is left behind.\n{how}"
        )

    async def _run(self) -> dict[str, Any]:
        cfg = self.config
        tasks = load_tasks(cfg.tasks.spec, cfg.tasks.family, cfg.tasks.limit, cfg.tasks.ids)
        if not tasks:
            raise ConfigError(f"no tasks in {cfg.tasks.spec}")
        self.out.mkdir(parents=True, exist_ok=True)
        store = self.open_store()
        try:
            self._save_config(store)
            planned = len(tasks) * cfg.runner.samples
            store.set_meta("planned", planned)
            todo = self.pending(tasks, store)
            check_sandbox_configs([t for t, _ in todo], cfg.sandbox)
            self.progress = Progress(total=planned, skipped=planned - len(todo))
            self.progress.done = planned - len(todo)
            self._notify()
            started = time.monotonic()
            prior = float(store.meta("wall_s", 0.0) or 0.0)
            try:
                if todo and cfg.runner.backend != "local":  # another line of RUN_BACKENDS runs them
                    run_on = RUN_BACKENDS.load(cfg.runner.backend)
                    await run_on(
                        cfg, todo, lambda t, s, r: self._record(store, t, s, r), lambda: bool(self.stopped)
                    )
                elif todo:
                    await self._run_local(todo, store)
            finally:  # a run stopped early still counts its time
                wall = prior + time.monotonic() - started
                store.set_meta("wall_s", wall)
            if self.signum is not None:  # the work ended before the signal's cancellation reached it
                raise RunInterruptedError(self.interrupt_message(self.signum), self.signum)
            if self.stopped:
                raise RunStoppedError(
                    f"{self.stopped}; {store.count()} episodes are stored in {self.out}: fix the cause, "
                    f"then continue with --resume --output {self.out}"
                )
            return export(store, self.out, cfg.model.name or cfg.model.spec, wall)
        finally:
            store.close()

    async def _run_local(self, todo: list[tuple[Task, int]], store: RunStore) -> None:
        cfg = self.config
        use_pidfd_child_watcher()
        worker = EpisodeWorker(cfg)
        sem = asyncio.Semaphore(cfg.runner.concurrency)

        async def one(task: Task, sample: int) -> None:
            async with sem:
                if self.stopped:
                    return  # left for --resume
                result = await worker.run(task, sample)
                # Serialising, redacting (token-level redaction decodes whole trajectories) and
                # committing an episode are CPU and disk work: off the event loop.
                iid = task.instance_id
                row = await asyncio.to_thread(lambda: self._store_row(store, iid, sample, result.to_dict()))
                if row is not None:
                    self._count(row)

        try:
            if cfg.runner.preflight:
                await worker.preflight(todo[0][0].sandbox_config(cfg.sandbox))
            # the agent's per-run resources (a harness's gateway) serve every episode of the run
            await worker.start()
            freeze_startup_objects()
            await gather_all([one(t, s) for t, s in todo])
        finally:
            await worker.close()

    def _record(self, store: RunStore, instance_id: str, sample: int, result: dict[str, Any]) -> None:
        """Store and count one episode (the Ray backend's callback, on the event loop)."""
        row = self._store_row(store, instance_id, sample, result)
        if row is not None:
            self._count(row)

    def _store_row(
        self, store: RunStore, instance_id: str, sample: int, result: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Redact and commit one finished episode; the stored row, or None when it is not stored.
        Thread-safe (the store serialises its writes): the local runner calls it off the loop.
        (A text-only model's episode comes untrainable from `run_episode` already.)

        A cancelled episode is not an outcome: a resumed run does it again. One that a signal cut
        short is stored, as `cancelled` with the signal in `error` (`interrupted`), so the store
        shows what the stop interrupted; so is any infrastructure failure after the signal (a
        Ctrl-C reaches the terminal's whole process group: a sandbox may die of it first)."""
        if self.signum is not None and not ExitReason(result["exit_reason"]).trainable:
            name = signal.Signals(self.signum).name
            was = result["exit_reason"]
            result["exit_reason"], result["trainable"] = ExitReason.CANCELLED.value, False
            cause = "" if was == ExitReason.CANCELLED.value else f" ({was}: {result['error']})"
            result["error"] = f"interrupted by {name}{cause}"
            result["metrics"]["interrupted"] = name
        elif result["exit_reason"] == ExitReason.CANCELLED.value:
            return None  # not stored: a resumed run does it again
        row = episode_row(instance_id, sample, self.redactor.result(result))
        store.put(row)
        return row

    def _count(self, row: dict[str, Any]) -> None:
        """Progress and the infrastructure guard, on the event loop."""
        if row["exit_reason"] == ExitReason.CANCELLED.value:  # interrupted: not done, resume redoes it
            self.interrupted += 1
            return
        p = self.progress
        if p is not None:
            p.done += 1
            p.resolved += int(row["resolved"])
            p.tokens += row["completion_tokens"]
            p.exits[row["exit_reason"]] += 1
            self._notify()
        self.stopped = self.stopped or self.guard.observe(row["exit_reason"], row["error"])

    def _notify(self) -> None:
        if self.on_progress and self.progress:
            self.on_progress(self.progress)


async def gather_all(coros: list[Coroutine[Any, Any, None]]) -> None:
    """`asyncio.gather`, except that a cancellation (a signal stopping the run) returns only once
    every task has ended: gather passes on the first child that ends cancelled (one still waiting
    for its turn) at once, while the running episodes still store their rows and stop their
    sandboxes, and the store would be closed under them."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        # Each task was cancelled once by gather; a second cancel would cut a task's own cleanup
        # short (a shielded sandbox stop left to run alone, then cancelled by asyncio.run's exit).
        await asyncio.wait(tasks)
        raise


def check_sandbox_configs(tasks: list[Task], base: SandboxConfig) -> None:
    """Every pending task's sandbox (a row's image on the run's settings) is valid before the
    first episode: a setting an image row's backend cannot honour is one error at start, not
    an `internal_error` per episode."""
    seen: set[str] = set()
    for task in tasks:
        if task.instance_id in seen:
            continue
        seen.add(task.instance_id)
        try:
            task.sandbox_config(base)
        except ConfigError as exc:
            msg = str(exc)
            raise ConfigError(msg if task.instance_id in msg else f"{task.instance_id}: {msg}") from None


async def run(config: RunConfig, on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    return await Runner(config, on_progress).run()


def freeze_startup_objects() -> None:
    """Move what exists once the run is set up (modules, tokenizer, codec, config: ~500,000
    objects, all alive until the end) out of the garbage collector's sight (`gc.freeze`).

    Every full collection during the run traversed them again (~90 ms each, a visible share of
    the framework's CPU per step); they hold no garbage, being alive for the run. Collected
    first, so no garbage is frozen with them."""
    gc.collect()
    gc.freeze()
