"""A policy that breaks its own sandbox does not escape its reward (issue 25 part 5).

What the agent's commands did to its own sandbox (killed its processes, exhausted its own pids or
memory limit, destroyed its repository) is the policy's outcome: reward 0, trainable, an exit
reason that names it. A sandbox killed from outside (its bwrap process, as the host's OOM killer or
an operator would) stays `sandbox_dead`, masked. Scripted model turns (real ReplayEngine) on the
starter suite's first task, real tools, real bubblewrap sandboxes with their real cgroups.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from agent_helpers import call, scripted_model
from conftest import needs_bwrap
from uniagent.agent import AgentConfig, ExitReason
from uniagent.sandbox.base import Sandbox
from uniagent.tasks import load_tasks, run_episode
from uniagent.tasks.swe import SweTask
from uniagent.tokens import ChatCodec

pytestmark = needs_bwrap

SMALL = {"type": "local", "limits": {"pids": 64, "memory_mb": 256}}
# Takes every pid the limit allows and keeps them: a daemon forks sleepers until a fork fails,
# then tells the command it is full and takes back any pid that frees (the command's own first).
HOG = """python3 - <<'EOF'
import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    told = False
    while True:
        try:
            if os.fork() == 0:
                time.sleep(3203)
                os._exit(0)
        except OSError:
            if not told:
                os.write(w, b"full")
                told = True
            time.sleep(0.01)
os.read(r, 4)
EOF"""


class Recorded(SweTask):
    """The starter task, recording the sandbox each episode (and grading) sets it up in."""

    seen: list[Sandbox]

    async def setup(self, sandbox: Sandbox) -> None:
        self.seen.append(sandbox)
        await super().setup(sandbox)


@pytest.fixture
def task() -> Recorded:
    t = load_tasks("builtin:starter")[0]
    assert isinstance(t, SweTask)
    t.__class__ = Recorded
    t.seen = []
    return t  # type: ignore[return-value]


async def _episode(
    task: SweTask, codec: ChatCodec, command: str, sandbox: dict[str, Any] | None = None, *, then: bool = True
) -> Any:
    """`command`, then (unless `then` is False) an `ls` that meets what it left, then submit."""
    script = [call("bash", command=command), *([call("bash", command="ls")] if then else []), call("submit")]
    return await run_episode(task, scripted_model(codec, script), AgentConfig(max_turns=4), sandbox)


def _policy_zero(res: Any, reason: ExitReason) -> None:
    tools = [m["content"][-300:] for m in res.messages if m.get("role") == "tool"]
    assert res.exit_reason == reason, (res.exit_reason, res.error, tools)
    assert res.trainable and res.reward is not None and res.reward.value == 0.0 and not res.resolved
    assert res.reward.details["broken"] == res.error


async def test_kill_minus_one_is_sandbox_broken_trained_on_at_zero(task: SweTask, codec: ChatCodec) -> None:
    res = await _episode(task, codec, "kill -9 -1")
    _policy_zero(res, ExitReason.SANDBOX_BROKEN)
    assert "killed from inside" in (res.error or "")


async def test_every_pid_held_by_the_agent_is_sandbox_broken(task: SweTask, codec: ChatCodec) -> None:
    """The pids limit exhausted and held (nothing frees a pid): the final state cannot be taken,
    and the limit the agent hit is why. (No `ls` between: each fork bash retries for ~15 s.)"""
    res = await _episode(task, codec, HOG, SMALL, then=False)
    _policy_zero(res, ExitReason.SANDBOX_BROKEN)
    assert "process limit" in (res.error or "")


async def test_a_fork_bomb_held_by_the_pids_limit_is_trained_on_at_zero(
    task: SweTask, codec: ChatCodec
) -> None:
    """A fork bomb churns: its processes die as forks fail and others take their pids, so the
    agent's next commands and the final state get a pid, or not, by chance. Either way it is the
    policy's outcome, trained on at 0: `sandbox_broken` naming the limit when the final state could
    not be taken, else graded as any episode (`finished`) with the hit in its metrics."""
    res = await _episode(task, codec, ":(){ :|:& };:", SMALL)
    if res.exit_reason == ExitReason.SANDBOX_BROKEN:
        _policy_zero(res, ExitReason.SANDBOX_BROKEN)
        assert "process limit" in (res.error or "")
    else:
        assert res.exit_reason == ExitReason.FINISHED, (res.exit_reason, res.error)
        assert res.trainable and res.reward is not None and res.reward.value == 0.0
        assert res.metrics["sandbox_limits_hit"]["pids_max"] >= 1


async def test_rm_rf_of_the_repository_is_workspace_destroyed(task: SweTask, codec: ChatCodec) -> None:
    res = await _episode(task, codec, "rm -rf ./* .git")
    _policy_zero(res, ExitReason.WORKSPACE_DESTROYED)
    assert "base commit" in (res.error or "")


async def test_a_shell_oom_killed_by_its_memory_limit_is_the_policys_outcome(
    task: SweTask, codec: ChatCodec
) -> None:
    res = await _episode(task, codec, "a=x; while true; do a=$a$a; done", SMALL)
    # The shell died of its own limit; the next command got a new shell and the episode went on.
    assert res.exit_reason == ExitReason.FINISHED and res.trainable
    assert res.reward is not None and res.reward.value == 0.0
    assert res.metrics["sandbox_limits_hit"]["oom_kill"] >= 1
    assert "exited" in next(m for m in res.messages if m.get("role") == "tool")["content"]


async def test_a_sandbox_killed_from_outside_stays_sandbox_dead_untrainable(
    task: Recorded, codec: ChatCodec
) -> None:
    marker = "sleep 3119"
    running = asyncio.ensure_future(_episode(task, codec, marker))
    deadline = time.monotonic() + 120
    while not (task.seen and await _running(marker)):
        assert time.monotonic() < deadline and not running.done(), "the command never started"
        await asyncio.sleep(0.1)
    os.kill(task.seen[0]._proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    res = await asyncio.wait_for(running, 120)
    assert res.exit_reason == ExitReason.SANDBOX_DEAD, (res.exit_reason, res.error)
    assert not res.trainable and res.reward is None
    assert len(task.seen) == 1, "a dead sandbox is not graded anywhere"


async def _running(marker: str) -> bool:
    proc = await asyncio.create_subprocess_exec("pgrep", "-f", marker, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return bool(out.split())
