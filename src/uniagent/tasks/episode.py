"""One episode end to end: sandbox up, task setup, the agent loop, verification, sandbox down.

This is the single entry shared by `uniagent run`, `uniagent verify`, the verl agent loop and
the local trainer, so an episode means the same thing everywhere.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from typing import Any

from uniagent import sandbox as sandboxes
from uniagent.agent import AgentConfig, AgentInteraction, EpisodeResult, ExitReason
from uniagent.errors import SandboxError
from uniagent.models.base import ChatModel
from uniagent.tasks.base import Task
from uniagent.tools import build_tools, install_tool_scripts

log = logging.getLogger(__name__)


def _failed(task: Task, reason: ExitReason, error: str, metrics: dict[str, Any]) -> EpisodeResult:
    return EpisodeResult(
        task.messages() if reason != ExitReason.INTERNAL_ERROR else [],
        None,
        reason,
        None,
        metrics,
        error=error,
    )


async def run_episode(
    task: Task,
    model: ChatModel,
    agent: AgentConfig | None = None,
    sandbox: dict[str, Any] | None = None,
) -> EpisodeResult:
    """Never raises for episode-level failures: they come back as an exit reason."""
    # Setup records per-sandbox state on the task (its base commit, hidden files); samples of
    # one task run concurrently, so each episode works on its own copy.
    task = copy.copy(task)
    metrics: dict[str, Any] = {"instance_id": task.instance_id}
    t0 = time.perf_counter()
    try:
        sb = sandboxes.create(task.sandbox_config(sandbox))
    except Exception as exc:
        return _failed(task, ExitReason.INTERNAL_ERROR, f"sandbox config: {exc}", metrics)
    try:
        try:
            await sb.start()
            metrics["sandbox_start_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            await task.setup(sb)
            tools = build_tools(task.tools())
            await install_tool_scripts(sb, tools)
            metrics["setup_s"] = time.perf_counter() - t1
        except (SandboxError, OSError, TimeoutError) as exc:
            return _failed(task, ExitReason.SANDBOX_DEAD, f"sandbox start/setup: {exc}", metrics)
        result = await AgentInteraction(model, tools, agent).run(task.messages(), sb, verifier=task.score)
        result.metrics.update(metrics)
        return result
    except asyncio.CancelledError:
        return _failed(task, ExitReason.CANCELLED, "cancelled", metrics)
    finally:
        await asyncio.shield(sb.stop())
        metrics["episode_s"] = time.perf_counter() - t0
