"""The set-up every episode shares, whichever agent acts: sandbox up, task setup, tool scripts
installed, the sandbox always stopped. `run_episode` (uniagent.tasks.episode) runs the agent in it,
and the fresh grading sandbox (uniagent.tasks.grading) is set up by the same code, so the verdict
is made in a sandbox exactly like the one the agent had. Its own module, below both, so neither
imports the other for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from uniagent import sandbox as sandboxes
from uniagent.agent import EpisodeResult, ExitReason
from uniagent.agent.base import TaskView
from uniagent.errors import SandboxError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import SandboxConfig
from uniagent.tasks.base import Task
from uniagent.tools import Tool, build_tools, install_tool_scripts


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
