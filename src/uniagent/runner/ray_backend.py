"""The same run spread over a Ray cluster: episodes execute in Ray actors, results come back
to the driver, which stores them exactly as the local backend does.

Each actor builds its own model factory once (one engine per actor) and runs several
episodes concurrently on its own event loop. Task rows travel as plain dicts; a row's
`repo_dir` must be readable on the workers (a shared filesystem on multi-node clusters).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uniagent.errors import PreflightError
from uniagent.runner.config import RunConfig
from uniagent.tasks.base import Task

log = logging.getLogger(__name__)


class EpisodeActor:
    """Runs episodes for the driver. Wrapped with `ray.remote` at run time."""

    def __init__(self, config_json: dict[str, Any]) -> None:
        self.config = RunConfig.model_validate(config_json)
        self.factory: Any = None
        self._lock = asyncio.Lock()

    async def _ensure(self) -> Any:
        async with self._lock:
            if self.factory is None:
                from uniagent.models.factory import ModelFactory
                from uniagent.sandbox.base import Sandbox

                Sandbox.set_start_concurrency(self.config.runner.sandbox_start_concurrency)
                self.factory = ModelFactory(self.config.model)
                await self.factory.start()
        return self.factory

    async def run(self, family: str, row: dict[str, Any], source: str | None, sample: int) -> dict[str, Any]:
        from uniagent.tasks.episode import run_episode
        from uniagent.tasks.registry import family_class

        factory = await self._ensure()
        task = family_class(family).from_row(row, source)
        model = factory.new_model(task.instance_id, sample, self.config.runner.seed)
        result = await run_episode(task, model, self.config.agent, self.config.sandbox)
        return result.to_dict()  # the driver marks a text-only model's episodes untrainable

    async def preflight(self, sandbox_cfg: dict[str, Any]) -> str | None:
        """The run's preflight where the episodes run; the error's message, or None when all works."""
        from uniagent.errors import UniAgentError
        from uniagent.runner.guard import preflight

        try:
            await preflight(await self._ensure(), sandbox_cfg)
        except UniAgentError as exc:
            return str(exc)
        return None

    def ping(self) -> str:
        return "ok"


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


async def run_on_ray(
    config: RunConfig,
    todo: list[tuple[Task, int]],
    on_result: Callable[[str, int, dict[str, Any]], None],
    stopped: Callable[[], bool] = lambda: False,
) -> None:
    import ray

    if not ray.is_initialized():
        if config.runner.ray_address:
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
        else:
            ray.init(num_cpus=max(2, config.runner.concurrency), include_dashboard=False, log_to_driver=False)
    n_actors = max(1, min(config.runner.concurrency, len(todo), 8))
    per_actor = max(1, -(-config.runner.concurrency // n_actors))
    actor_cls = ray.remote(num_cpus=0.01, max_concurrency=per_actor)(EpisodeActor)
    cfg_json = config.model_dump(mode="json")
    actors = [actor_cls.remote(cfg_json) for _ in range(n_actors)]
    sem = asyncio.Semaphore(config.runner.concurrency)

    async def one(i: int, task: Task, sample: int) -> None:
        async with sem:
            if stopped():
                return  # the run stops: episodes not started are left for --resume
            actor = actors[i % n_actors]
            result = await actor.run.remote(task.family, task.row, task.source, sample)
            on_result(task.instance_id, sample, result)

    try:
        await asyncio.gather(*(a.ping.remote() for a in actors))
        if config.runner.preflight:
            failed = await actors[0].preflight.remote(todo[0][0].sandbox_config(config.sandbox))
            if failed:
                raise PreflightError(failed)
        await asyncio.gather(*(one(i, t, s) for i, (t, s) in enumerate(todo)))
    finally:
        for a in actors:
            ray.kill(a)


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
