"""One episode end to end: sandbox up, task setup, the agent loop, verification, sandbox down.

This is the single entry shared by `uniagent run`, `uniagent verify`, the verl agent loop and
the local trainer, so an episode means the same thing everywhere.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from uniagent import sandbox as sandboxes
from uniagent.agent import AgentConfig, AgentInteraction, EpisodeResult, ExitReason
from uniagent.errors import SandboxError
from uniagent.models.base import ChatModel
from uniagent.sandbox.base import Sandbox
from uniagent.tasks.base import Task
from uniagent.tools import Tool, build_tools, install_tool_scripts

log = logging.getLogger(__name__)


def failed_result(task: Task, reason: ExitReason, error: str, metrics: dict[str, Any]) -> EpisodeResult:
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
    task: Task, sandbox_cfg: dict[str, Any] | None, metrics: dict[str, Any]
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


async def run_episode(
    task: Task,
    model: ChatModel,
    agent: AgentConfig | None = None,
    sandbox: dict[str, Any] | None = None,
) -> EpisodeResult:
    """Never raises for episode-level failures: they come back as an exit reason."""
    metrics: dict[str, Any] = {"instance_id": task.instance_id}
    t0 = time.perf_counter()
    ready: EpisodeSetup | None = None
    try:
        ready = await setup_episode(task, sandbox, metrics)
        if ready.failure is not None or ready.sandbox is None:
            return ready.failure  # type: ignore[return-value]
        loop = AgentInteraction(model, ready.tools, agent)
        result = await loop.run(ready.task.messages(), ready.sandbox, verifier=ready.task.score)
        result.metrics.update(metrics)
        return result
    except asyncio.CancelledError:
        return failed_result(task, ExitReason.CANCELLED, "cancelled", metrics)
    finally:
        if ready is not None and ready.sandbox is not None:
            await asyncio.shield(ready.sandbox.stop())
        metrics["episode_s"] = time.perf_counter() - t0
