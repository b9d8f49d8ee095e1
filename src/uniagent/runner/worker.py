"""`EpisodeWorker`: one model factory and one agent over it, running a run's episodes.

The local backend runs one worker in the driver; the Ray backend runs one inside each actor
(`ray_backend.EpisodeActor`, a thin wrapper that turns task rows and results into plain dicts).
So an episode of `uniagent run` is built the same way on either backend: the model from the
factory (`models.factory`, the one place chat models are made), the agent started once over the
factory's engine (a harness agent's gateway serves every episode of the worker), then
`run_episode`. What happens around it (the concurrency bound, stopping, storing) is the runner's.
"""

from __future__ import annotations

import asyncio

from uniagent.agent.base import Agent, create_agent
from uniagent.agent.result import EpisodeResult
from uniagent.models.factory import ModelFactory
from uniagent.runner.config import RunConfig
from uniagent.sandbox.config import SandboxConfig
from uniagent.tasks.base import Task
from uniagent.tasks.episode import run_episode


class EpisodeWorker:
    """Starts lazily and once (concurrent episodes share the start); `close` releases the agent,
    then the model. Episodes may run concurrently on the worker's event loop."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.factory: ModelFactory | None = None
        self.agent: Agent | None = None
        self._lock = asyncio.Lock()

    async def start_model(self) -> ModelFactory:
        """The started model factory (its engine loaded or connected)."""
        async with self._lock:
            if self.factory is None:
                from uniagent.sandbox.base import Sandbox

                Sandbox.set_start_concurrency(self.config.runner.sandbox_start_concurrency)
                factory = ModelFactory(self.config.model)
                await factory.start()
                self.factory = factory
        return self.factory

    async def start(self) -> Agent:
        """The model, then the agent started over its engine (closed in `close`)."""
        factory = await self.start_model()
        async with self._lock:
            if self.agent is None:
                agent = create_agent(self.config.agent.kind)
                await agent.start(factory.engine, factory.codec)
                self.agent = agent
        return self.agent

    async def preflight(self, sandbox_cfg: SandboxConfig) -> None:
        """The run's preflight (`runner.guard.preflight`: the model answers, a sandbox of
        `sandbox_cfg` runs a command), then the agent starts (a harness agent over a model it
        cannot serve fails here). Raises `PreflightError` / the agent's `UniAgentError`."""
        from uniagent.runner.guard import preflight

        await preflight(await self.start_model(), sandbox_cfg)
        await self.start()

    async def run(self, task: Task, sample: int) -> EpisodeResult:
        """Sample `sample` of `task`: its model from the factory, the worker's agent, the run's
        budgets and sandbox settings. Episode failures come back as exit reasons (`run_episode`)."""
        agent = self.agent if self.agent is not None else await self.start()
        assert self.factory is not None
        model = self.factory.new_model(task.instance_id, sample, self.config.runner.seed)
        return await run_episode(task, model, self.config.agent, self.config.sandbox, agent=agent)

    async def close(self) -> None:
        """Release the agent, then the model (a worker that never started has nothing to release)."""
        agent, self.agent = self.agent, None
        try:
            if agent is not None:
                await agent.close()
        finally:
            factory, self.factory = self.factory, None
            if factory is not None:
                await factory.close()
