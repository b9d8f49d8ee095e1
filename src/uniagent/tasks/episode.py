"""One episode end to end: sandbox up, task setup, the agent, its final state, sandbox down, then
grading (by default in a fresh sandbox of the task: `uniagent.tasks.grading`).

`run_episode` is the single entry shared by `uniagent run` (local and Ray), `uniagent verify`, the
verl agent loop and the local trainer, so an episode means the same thing everywhere, whichever
agent acts (`react`, `mini-swe-agent`, any agent of the registry, agent/registry.py).
`episode_sandbox` is the set-up every agent shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from uniagent import sandbox as sandboxes
from uniagent.agent import AgentConfig, EpisodeResult, ExitReason
from uniagent.agent.base import Agent, Episode, TaskView
from uniagent.agent.react import ReactAgent
from uniagent.errors import SandboxError
from uniagent.models.base import ChatModel
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import SandboxConfig
from uniagent.tasks import grading
from uniagent.tasks.base import Task
from uniagent.tools import Tool, build_tools, install_tool_scripts

log = logging.getLogger(__name__)


def failed_result(task: TaskView, reason: ExitReason, error: str, metrics: dict[str, Any]) -> EpisodeResult:
    """An episode that ended before (or outside) the agent loop."""
    messages = task.messages() if reason != ExitReason.INTERNAL_ERROR else []
    return EpisodeResult(messages, None, reason, None, metrics, error=error)


@dataclass
class EpisodeSetup:
    """A started, prepared sandbox for one episode, or the result that says why there is none.
    The caller stops `sandbox` when it is not None, whatever happens."""

    task: Task
    sandbox: Sandbox | None
    tools: list[Tool] = field(default_factory=list)
    failure: EpisodeResult | None = None


async def setup_episode(
    task: Task, sandbox_cfg: SandboxConfig | None, metrics: dict[str, Any]
) -> EpisodeSetup:
    """Sandbox up, task setup, tool scripts installed: the part every kind of agent shares."""
    # Setup records per-sandbox state on the task (its base commit, hidden files); samples of
    # one task run concurrently, so each episode works on its own copy.
    task = copy.copy(task)
    t0 = time.perf_counter()
    try:
        sb = sandboxes.create(task.sandbox_config(sandbox_cfg))
    except Exception as exc:
        return EpisodeSetup(
            task,
            None,
            failure=failed_result(task, ExitReason.INTERNAL_ERROR, f"sandbox config: {exc}", metrics),
        )
    try:
        await sb.start()
        metrics["sandbox_start_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        await task.setup(sb)
        tools = build_tools(task.tools())
        await install_tool_scripts(sb, tools)
        metrics["setup_s"] = time.perf_counter() - t1
    except (SandboxError, OSError, TimeoutError) as exc:
        failure = failed_result(task, ExitReason.SANDBOX_DEAD, f"sandbox start/setup: {exc}", metrics)
        return EpisodeSetup(task, sb, failure=failure)
    except BaseException:
        # Cancelled or an unexpected error: the caller never gets `sb`, so it is stopped here.
        await asyncio.shield(sb.stop())
        raise
    return EpisodeSetup(task, sb, tools)


@contextlib.asynccontextmanager
async def episode_sandbox(
    task: Task, sandbox_cfg: SandboxConfig | None, metrics: dict[str, Any]
) -> AsyncIterator[EpisodeSetup]:
    """`setup_episode` for the block, the sandbox stopped after it however the block ends
    (shielded: a cancelled episode still tears its sandbox down). The one set-up every agent
    gets; `failure` set means there is no sandbox to act in."""
    ready = await setup_episode(task, sandbox_cfg, metrics)
    try:
        yield ready
    finally:
        if ready.sandbox is not None:
            await asyncio.shield(ready.sandbox.stop())


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
    config = config or AgentConfig()
    grade_cfg = sandbox  # a grading sandbox is the task's, without what the agent binds in
    metrics: dict[str, Any] = {"instance_id": task.instance_id, "agent_kind": agent.name}
    t0 = time.perf_counter()
    result: EpisodeResult | None = None
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
                fresh = await grading.settle(ready.task, ready.sandbox, result, config)
        if fresh and result is not None:  # the agent's sandbox is stopped by now
            await grading.grade_fresh(task, grade_cfg, result, config)
    except asyncio.CancelledError:
        result = failed_result(task, ExitReason.CANCELLED, "cancelled", metrics)
    assert result is not None
    result.metrics["episode_s"] = time.perf_counter() - t0
    if result.trainable and not model.trainable:
        result.metrics.update(text_only_model=True, untrainable_reason="text_only_model")
    return result
