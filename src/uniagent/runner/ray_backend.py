"""The same run spread over a Ray cluster: episodes execute in Ray actors, results come back
to the driver, which stores them exactly as the local backend does.

Each actor holds one `EpisodeWorker` (runner/worker.py), the local backend's: its own model
factory (one engine per actor) and its own agent over it (a harness agent's gateway is one per
actor), running several episodes concurrently on the actor's event loop. Task rows travel as
plain dicts; a row's `repo_dir` must be readable on the workers (a shared filesystem on
multi-node clusters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniagent.errors import PreflightError
from uniagent.runner.config import RunConfig
from uniagent.runner.worker import EpisodeWorker
from uniagent.sandbox import procs
from uniagent.sandbox.config import SandboxConfig
from uniagent.tasks.base import Task

log = logging.getLogger(__name__)
# An episode is redone at most this many times after its actor died; then it is stored as an
# infrastructure failure.
MAX_REDOS = 3


ACTOR_TMP_PREFIX = "uniagent-actor-"


def claim_actor_tmp(root: str | None = None) -> Path:
    """A temporary folder for this actor process, made the process's default (sandbox workspaces
    and control folders go under it), after removing the folders of dead actors on this node.

    Why: an actor killed with SIGKILL (or lost with its node) cleans nothing; its sandboxes die
    with it (bwrap --die-with-parent) but their workspaces stay. The next actor started on the
    node sweeps them: a folder is named after its actor's pid, and a pid that is gone is dead.
    """
    base = Path(root or tempfile.gettempdir())
    for old in base.glob(f"{ACTOR_TMP_PREFIX}*"):
        pid = old.name.removeprefix(ACTOR_TMP_PREFIX).partition("-")[0]
        if pid.isdigit() and not procs.alive(int(pid)):
            log.info("removing %s, left by a dead episode actor", old)
            shutil.rmtree(old, ignore_errors=True)
    mine = Path(tempfile.mkdtemp(prefix=f"{ACTOR_TMP_PREFIX}{os.getpid()}-", dir=base))
    tempfile.tempdir = str(mine)
    return mine


class EpisodeActor:
    """The run's `EpisodeWorker` in a Ray actor: task rows in, result dicts out, and a temporary
    folder of its own. Wrapped with `ray.remote` at run time."""

    def __init__(self, config_json: dict[str, Any]) -> None:
        self.config = RunConfig.model_validate(config_json)
        self.worker = EpisodeWorker(self.config)
        self.tmp = claim_actor_tmp()

    async def run(self, family: str, row: dict[str, Any], source: str | None, sample: int) -> dict[str, Any]:
        from uniagent.tasks.registry import family_class

        task = family_class(family).from_row(row, source)
        return (await self.worker.run(task, sample)).to_dict()

    async def preflight(self, sandbox_cfg: SandboxConfig) -> str | None:
        """The run's preflight where the episodes run; the error's message, or None when all works."""
        from uniagent.errors import UniAgentError

        try:
            await self.worker.preflight(sandbox_cfg)
        except UniAgentError as exc:
            return str(exc)
        return None

    def ping(self) -> str:
        return "ok"

    async def close(self) -> None:
        """The run is over: release the agent, the model and this actor's temporary folder."""
        try:
            await self.worker.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def check_address(address: str, timeout_s: float = 10.0) -> None:
    """A `HOST:PORT` or `ray://HOST:PORT` cluster answers a TCP connection. `ray.init` against an
    address where nothing listens waits for minutes; the preflight says so in seconds."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # `auto`, `local`: Ray resolves these itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise PreflightError(
            f"preflight: no Ray cluster answers at {address} ({exc.strerror or exc}); check --ray-address"
        ) from None


class ActorPool:
    """The run's episode actors, spread over the cluster's nodes (SPREAD), one per slot.

    An actor that dies (its worker killed, its node lost) is replaced in its slot by a fresh one,
    once however many of its episodes noticed. Ray's own restarts and task retries stay off: a
    retried task would rerun the episode inside Ray, invisible to the driver, which could then
    neither count the redo nor stop an episode that kills every worker it runs on.
    """

    def __init__(self, actor_cls: Any, cfg_json: dict[str, Any], n: int) -> None:
        self.actor_cls = actor_cls
        self.cfg_json = cfg_json
        self.actors = [self._new() for _ in range(n)]
        self.replaced = 0

    def _new(self) -> Any:
        return self.actor_cls.options(scheduling_strategy="SPREAD").remote(self.cfg_json)

    def replace(self, slot: int, dead: Any) -> None:
        """Put a fresh actor in `slot` unless another episode of the same dead actor already did."""
        import ray

        if self.actors[slot] is not dead:
            return
        with contextlib.suppress(Exception):  # already gone
            ray.kill(dead, no_restart=True)  # an unreachable one may still hold a node's resources
        self.actors[slot] = self._new()
        self.replaced += 1

    async def ready(self) -> None:
        """Every slot answers a ping; a slot whose actor died starting gets one fresh actor."""
        import ray

        async def ping(slot: int) -> None:
            for _ in range(2):
                actor = self.actors[slot]
                try:
                    await actor.ping.remote()
                    return
                except ray.exceptions.RayActorError:
                    self.replace(slot, actor)
            await self.actors[slot].ping.remote()

        await asyncio.gather(*(ping(i) for i in range(len(self.actors))))

    async def close(self, timeout_s: float = 30.0) -> None:
        """Each actor releases its model and folder (bounded: a hung one is killed all the same)."""
        import ray

        closing = asyncio.gather(*(a.close.remote() for a in self.actors), return_exceptions=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(closing, timeout_s)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)


def lost_episode(deaths: int, error: str) -> dict[str, Any]:
    """What is stored for an episode whose actor died `deaths` times: an infrastructure failure
    (never trained on; `--resume` reruns it), not an endless redo of an episode that kills its worker."""
    from uniagent.agent.result import EpisodeResult, ExitReason

    message = f"the Ray actor running this episode died {deaths} times; last: {error}"
    metrics = {"ray_actor_deaths": deaths}
    return EpisodeResult([], None, ExitReason.INTERNAL_ERROR, None, metrics, error=message).to_dict()


def init_ray(config: RunConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    if not config.runner.ray_address:
        ray.init(num_cpus=max(2, config.runner.concurrency), include_dashboard=False, log_to_driver=False)
        return
    check_address(config.runner.ray_address)
    try:
        ray.init(address=config.runner.ray_address, log_to_driver=False)
    except ConnectionError as exc:
        # Ray never turns token authentication on for an explicit address by itself.
        raise PreflightError(
            f"preflight: the Ray cluster at {config.runner.ray_address} did not accept the "
            f"connection ({exc}); a cluster with token authentication needs RAY_AUTH_MODE=token "
            "and its token (RAY_AUTH_TOKEN or ~/.ray/auth_token)"
        ) from None


async def run_on_ray(
    config: RunConfig,
    todo: list[tuple[Task, int]],
    on_result: Callable[[str, int, dict[str, Any]], None],
    stopped: Callable[[], bool] = lambda: False,
    actor: type[EpisodeActor] = EpisodeActor,
) -> None:
    """Run `todo` in actors (`actor`: the class, a subclass in tests); `on_result` (the driver's
    store) sees each pair once, complete.

    An episode whose actor dies is redone from scratch on the slot's replacement actor: a
    partly run episode left nothing behind but its sandbox (bwrap dies with its parent), and
    only finished episodes reach the driver, so a redo can never be stored twice.
    """
    import ray

    init_ray(config)
    n_actors = max(1, min(config.runner.ray_actors or min(config.runner.concurrency, 8), len(todo)))
    per_actor = max(1, -(-config.runner.concurrency // n_actors))
    actor_cls = ray.remote(num_cpus=0.01, max_concurrency=per_actor, max_restarts=0)(actor)
    pool = ActorPool(actor_cls, config.model_dump(mode="json"), n_actors)
    sem = asyncio.Semaphore(config.runner.concurrency)

    async def one(i: int, task: Task, sample: int) -> None:
        slot = i % n_actors
        error = ""
        async with sem:
            for deaths in range(MAX_REDOS + 1):
                if stopped():
                    return  # the run stops: episodes not started are left for --resume
                handle = pool.actors[slot]
                try:
                    result = await handle.run.remote(task.family, task.row, task.source, sample)
                except ray.exceptions.RayActorError as exc:
                    error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    log.warning("%s#%d: its Ray actor died (%s); redoing it", task.instance_id, sample, error)
                    pool.replace(slot, handle)
                    continue
                if deaths:
                    result["metrics"]["ray_actor_deaths"] = deaths
                on_result(task.instance_id, sample, result)
                return
            on_result(task.instance_id, sample, lost_episode(MAX_REDOS + 1, error))

    try:
        await pool.ready()
        if config.runner.preflight:
            failed = await pool.actors[0].preflight.remote(todo[0][0].sandbox_config(config.sandbox))
            if failed:
                raise PreflightError(failed)
        await asyncio.gather(*(one(i, t, s) for i, (t, s) in enumerate(todo)))
    finally:
        if pool.replaced:
            log.warning("ray: %d actors died and were replaced; their episodes were redone", pool.replaced)
        await pool.close()


async def doctor_check() -> list[tuple[str, bool | None, str]]:
    """`uniagent doctor`: Ray imports and its version is one the installed verl accepts
    (verl's own `ray` requirement). Ray is optional (`--backend ray`): not installed is `None`."""
    import importlib.metadata as md
    import importlib.util

    name = "runner backend ray"
    if importlib.util.find_spec("ray") is None:
        return [(name, None, "not installed: pip install ray (or uniagent[verl])")]
    try:
        ray = await asyncio.to_thread(importlib.import_module, "ray")
        version = str(ray.__version__)
    except Exception as exc:
        return [(name, False, f"import failed: {type(exc).__name__}: {str(exc)[:160]}")]
    try:
        from packaging.requirements import Requirement

        wanted = [Requirement(r) for r in md.requires("verl") or []]
    except md.PackageNotFoundError:
        wanted = []
    for req in wanted:
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra of verl's, not what it needs to run
        if req.name == "ray" and not req.specifier.contains(version, prereleases=True):
            return [(name, False, f"ray {version} installed; verl needs ray{req.specifier}")]
    return [(name, True, f"ray {version}")]
