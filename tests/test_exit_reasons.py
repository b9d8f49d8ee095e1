"""The exit reasons no other suite reaches: `timeout_budget` through `agent.wall_time_s`,
`cancelled` and `internal_error`. Scripted model turns (real ReplayEngine), real tools, real
bubblewrap sandboxes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from agent_helpers import call, scripted_model, swe_task
from conftest import needs_bwrap
from uniagent import sandbox as sandboxes
from uniagent.agent import AgentConfig, AgentInteraction, ExitReason
from uniagent.sandbox.base import Sandbox
from uniagent.tasks import run_episode
from uniagent.tasks.swe import SweTask
from uniagent.tokens import ChatCodec
from uniagent.tools import Tool, ToolResult

pytestmark = needs_bwrap


@pytest.fixture
def task(tmp_path: Path) -> SweTask:
    return swe_task(tmp_path)


async def test_wall_time_ends_in_timeout_budget_and_stays_trainable(task: SweTask, codec: ChatCodec) -> None:
    script = [call("bash", command="sleep 1.5"), call("bash", command="echo never"), call("submit")]
    started = time.perf_counter()
    res = await run_episode(task, scripted_model(codec, script), AgentConfig(wall_time_s=1.0))
    assert res.exit_reason == ExitReason.TIMEOUT_BUDGET and res.metrics["budget_hit"] == "wall_time"
    assert res.metrics["turns"] == 1, "no model turn starts after the wall time is spent"
    assert res.trainable and res.reward is not None and res.reward.value == 0.0
    assert time.perf_counter() - started < 60


async def _sleeping_pids(marker: str) -> list[int]:
    proc = await asyncio.create_subprocess_exec("pgrep", "-f", marker, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return [int(p) for p in out.split()]


async def test_cancelling_an_episode_is_cancelled_untrainable_and_stops_its_sandbox(
    task: SweTask, codec: ChatCodec
) -> None:
    marker = "sleep 3117"
    verified: list[bool] = []
    original = task.score

    async def score(sb: Sandbox, result: Any) -> Any:
        verified.append(True)
        return await original(sb, result)

    task.score = score  # type: ignore[method-assign]
    script = [call("bash", command=marker), call("submit")]
    running = asyncio.create_task(run_episode(task, scripted_model(codec, script)))
    deadline = time.monotonic() + 60
    while not await _sleeping_pids(marker):
        assert time.monotonic() < deadline and not running.done(), "the command never started"
        await asyncio.sleep(0.1)
    running.cancel()
    res = await running
    assert res.exit_reason == ExitReason.CANCELLED and res.error == "cancelled"
    assert not res.trainable and res.reward is None and not verified
    assert not await _sleeping_pids(marker), "the sandbox (and its command) was stopped"


class _Args(BaseModel):
    n: int


class BuggyTool(Tool):
    """A tool with a bug of ours (a KeyError inside `run`), as a new tool might have."""

    name: ClassVar[str] = "lookup"
    description: ClassVar[str] = "Look a number up."
    Args: ClassVar[type[BaseModel]] = _Args

    async def run(self, args: BaseModel, sandbox: Sandbox) -> ToolResult:
        return ToolResult({}["missing"])


async def test_a_bug_in_a_tool_is_internal_error_never_trained_on(codec: ChatCodec, tmp_path: Path) -> None:
    model = scripted_model(codec, [call("lookup", n=1), call("submit")])
    async with sandboxes.create({"workspace": str(tmp_path)}) as sb:
        res = await AgentInteraction(model, [BuggyTool()]).run([{"role": "user", "content": "look up 1"}], sb)
    assert res.exit_reason == ExitReason.INTERNAL_ERROR
    assert "KeyError" in (res.error or "") and "Traceback" in (res.error or "")
    assert not res.trainable and res.reward is None


async def test_a_sandbox_config_that_cannot_be_built_is_internal_error(
    task: SweTask, codec: ChatCodec
) -> None:
    res = await run_episode(task, scripted_model(codec, [call("submit")]), sandbox={"type": "nope"})
    assert res.exit_reason == ExitReason.INTERNAL_ERROR and "sandbox config" in (res.error or "")
    assert not res.trainable and res.reward is None and res.messages == []


async def test_a_text_only_models_episode_comes_back_untrainable(task: SweTask, codec: ChatCodec) -> None:
    """`run_episode` decides trainability from the model as well as the exit reason: a model that
    is not `trainable` (a text-level one keeps no token record) makes a trainable exit untrainable,
    with the reason in its metrics, whoever runs the episode (runner, Ray actor, trainer); an exit
    that is untrainable anyway stays as it was."""
    text_only = scripted_model(codec, [call("submit")])
    text_only.trainable = False
    res = await run_episode(task, text_only)
    assert res.exit_reason == ExitReason.FINISHED and res.reward is not None
    assert not res.trainable and res.to_dict()["trainable"] is False
    assert res.metrics["text_only_model"] is True and res.metrics["untrainable_reason"] == "text_only_model"

    failed = scripted_model(codec, [call("submit")])
    failed.trainable = False
    res = await run_episode(task, failed, sandbox={"type": "nope"})
    assert res.exit_reason == ExitReason.INTERNAL_ERROR and not res.trainable
    assert "text_only_model" not in res.metrics and "untrainable_reason" not in res.metrics

    res = await run_episode(task, scripted_model(codec, [call("submit")]))
    assert res.trainable and "untrainable_reason" not in res.metrics, "a token-level model's stays trainable"
