"""One episode end to end: sandbox up, task setup, the agent, its final state, sandbox down, then
grading (by default in a fresh sandbox of the task: `uniagent.tasks.grading`).

`run_episode` is the single entry shared by `uniagent run` (local and Ray), `uniagent verify`, the
verl agent loop and the local trainer, so an episode means the same thing everywhere, whichever
agent acts (`react`, `mini-swe-agent`, any agent of the registry, agent/registry.py).
`episode_sandbox` (`uniagent.tasks.episode_setup`) is the set-up every agent shares.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from uniagent.agent import AgentConfig, EpisodeResult, ExitReason
from uniagent.agent.base import Agent, Episode
from uniagent.agent.react import ReactAgent
from uniagent.models.base import ChatModel
from uniagent.sandbox.config import SandboxConfig
from uniagent.tasks.base import Task
from uniagent.tasks.episode_setup import episode_sandbox, failed_result
from uniagent.tasks.grading import grade_fresh, settle

log = logging.getLogger(__name__)


REACT: Agent = ReactAgent()
"""The default agent; it needs no per-run resources, so it is never started or closed."""


async def run_episode(
    task: Task,
    model: ChatModel,
    config: AgentConfig | None = None,
    sandbox: SandboxConfig | None = None,
    *,
    agent: Agent | None = None,
) -> EpisodeResult:
    """`task` with `model` acted by `agent` (a started one, see `agent.base.open_agent`;
    default: the ReAct loop) under the budgets in `config`, in a sandbox from `sandbox` (the run's
    settings; the task completes them). Never raises for episode-level failures: they come back
    as an exit reason. Grading happens here, for every agent (`uniagent.tasks.grading`): the final
    state in the agent's sandbox, then the verdict where `config.grade_in` and the task say.
    Trainability is decided here too: the exit reason's, and a model that is not `trainable` (a
    text-level one keeps no token record) makes an otherwise trainable episode untrainable
    (`metrics.untrainable_reason: text_only_model`, `metrics.text_only_model`), wherever it runs."""
    agent = agent or REACT
    grade_cfg = sandbox  # a grading sandbox is the task's, without what the agent binds in
    metrics: dict[str, Any] = {"instance_id": task.instance_id, "agent_kind": agent.name}
    t0 = time.perf_counter()
    result: EpisodeResult | None = None
    try:  # a task setting the agent cannot honour is this episode's error, never a reward
        config = task.agent_config(config or AgentConfig())
    except Exception as exc:
        return failed_result(task, ExitReason.INTERNAL_ERROR, f"agent config: {exc}", metrics)
    try:  # the agent's hook (`Agent.prepare_sandbox`): one that runs inside the sandbox binds in
        sandbox = agent.prepare_sandbox(task.sandbox_config(sandbox))
    except Exception as exc:
        return failed_result(task, ExitReason.INTERNAL_ERROR, f"sandbox config: {exc}", metrics)
    fresh = False
    try:
        async with episode_sandbox(task, sandbox, metrics) as ready:
            if ready.failure is not None or ready.sandbox is None:
                result = ready.failure
            else:
                episode = Episode(ready.task, ready.sandbox, ready.tools, model, config, metrics)
                result = await agent.run(episode)
                for key, value in metrics.items():  # the set-up's figures; the agent's own win
                    result.metrics.setdefault(key, value)
                fresh = await settle(ready.task, ready.sandbox, result, config)
        if fresh and result is not None:  # the agent's sandbox is stopped by now
            await grade_fresh(task, grade_cfg, result, config)
    except asyncio.CancelledError:
        result = failed_result(task, ExitReason.CANCELLED, "cancelled", metrics)
    assert result is not None
    result.metrics["episode_s"] = time.perf_counter() - t0
    if result.trainable and not model.trainable:
        result.metrics.update(text_only_model=True, untrainable_reason="text_only_model")
    return result
