"""Grading an episode: what carries over from the agent's sandbox, where the verdict is made, and
whose failure a failed grading is. The one place that decides, for every kind of agent (the ReAct
loop and the harness agents alike): `run_episode` calls `settle` in the agent's sandbox before it
stops, then `grade_fresh` when the task's patch is to be graded where the agent cannot reach.

Where (`agent.grade_in`, the task's `carries`, see tasks/base.py):

- a patch-graded task under `fresh` (the default): `final_state` takes the patch out of the agent's
  sandbox, that sandbox is stopped (its processes, its /tmp, its shell go with it), and `score`
  runs in a new sandbox of the task set up exactly as for an episode (`tasks.episode_setup`), the
  patch its only input. Under `same`, `score` runs in the agent's sandbox, as before;
- an answer-graded task: `score(None, result)`, no sandbox at all;
- a task that reads the agent's sandbox (`carries = "sandbox"`): `score` there.

Whose failure (`uniagent.agent.result`): a sandbox that died, or a workspace that cannot be graded,
because of what the agent ran is the policy's outcome: reward 0, trainable, `sandbox_broken` (its
processes killed from inside, its own memory or pids limit exhausted: `Sandbox.breakage`) or
`workspace_destroyed` (its repository's base commit gone). Everything else stays masked: the
sandbox killed from outside or a grading sandbox that fails (`sandbox_dead`), a verifier that
crashes or runs past `agent.verifier_timeout_s` (`verifier_error`), a run cancelled meanwhile
(`cancelled`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from uniagent.agent import AgentConfig, EpisodeResult, ExitReason, Reward
from uniagent.errors import SandboxDeadError, SandboxError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import SandboxConfig
from uniagent.tasks.base import Task, WorkspaceDestroyedError
from uniagent.tasks.episode_setup import episode_sandbox

log = logging.getLogger(__name__)


def _policy_outcome(result: EpisodeResult, reason: ExitReason, why: str) -> None:
    """The agent's own wreckage: graded 0 and trained on, the cause kept."""
    result.exit_reason, result.error = reason, why
    result.reward = Reward(0.0, False, {"broken": why})


async def _blame(sandbox: Sandbox, result: EpisodeResult) -> bool:
    """Turn a failure in the agent's sandbox into `sandbox_broken` when the sandbox says the
    agent's commands caused it; False (the failure stands) otherwise."""
    why = await sandbox.breakage()
    if why is None:
        return False
    _policy_outcome(result, ExitReason.SANDBOX_BROKEN, f"the agent's commands broke its sandbox: {why}")
    return True


async def _bounded(
    step: Callable[[], Awaitable[Any]], result: EpisodeResult, timeout: float, what: str
) -> tuple[bool, Any]:
    """`step()` within `timeout`, with the verifier's failure semantics: (True, its value), or
    (False, None) with the exit reason set (cancelled, sandbox_dead, verifier_error). A
    `WorkspaceDestroyedError` goes on to the caller."""
    try:
        return True, await asyncio.wait_for(step(), timeout)
    except asyncio.CancelledError:
        result.exit_reason, result.error = ExitReason.CANCELLED, f"cancelled during {what}"
    except WorkspaceDestroyedError:
        raise
    except SandboxDeadError as exc:
        result.exit_reason, result.error = ExitReason.SANDBOX_DEAD, f"during {what}: {exc}"
    except TimeoutError:
        result.exit_reason = ExitReason.VERIFIER_ERROR
        result.error = f"{what} ran past agent.verifier_timeout_s={timeout:g}"
    except Exception as exc:
        log.warning("%s failed: %r", what, exc)
        result.exit_reason, result.error = ExitReason.VERIFIER_ERROR, f"verifier: {exc!r}"
    result.reward = None
    return False, None


async def _score(task: Task, sandbox: Sandbox | None, result: EpisodeResult, timeout: float) -> bool:
    t0 = time.perf_counter()
    try:
        ok, reward = await _bounded(lambda: task.score(sandbox, result), result, timeout, "verification")
    finally:
        result.metrics["verifier_s"] = time.perf_counter() - t0
    if ok:
        result.reward = reward
    return ok


def where(task: Task, config: AgentConfig) -> str:
    """Where `task` is graded under `config`: fresh | same | none (no sandbox)."""
    if task.carries == "answer":
        return "none"
    if task.carries == "patch" and config.grade_in == "fresh":
        return "fresh"
    return "same"


async def settle(task: Task, sandbox: Sandbox, result: EpisodeResult, config: AgentConfig) -> bool:
    """In the agent's sandbox, before it stops: the failure's owner for an episode whose sandbox
    died, then the final state and (unless the grading is fresh) the verdict. True when the
    episode is still to be graded in a fresh sandbox (`grade_fresh`)."""
    if result.exit_reason == ExitReason.SANDBOX_DEAD:
        await _blame(sandbox, result)
        return False
    if not result.exit_reason.trainable:
        return False
    place = where(task, config)
    result.metrics["graded_in"] = place
    hits = sandbox.limit_events()
    if hits:
        result.metrics["sandbox_limits_hit"] = hits
    t0 = time.perf_counter()
    try:
        ok, _ = await _bounded(
            lambda: task.final_state(sandbox, result), result, config.verifier_timeout_s, "the final state"
        )
    except WorkspaceDestroyedError as exc:  # a sandbox out of processes cannot look either
        if not await _blame(sandbox, result):
            why = f"the agent destroyed its workspace: {exc}"
            _policy_outcome(result, ExitReason.WORKSPACE_DESTROYED, why)
        return False
    finally:
        result.metrics["final_state_s"] = time.perf_counter() - t0
    if not ok:
        if result.exit_reason in (ExitReason.SANDBOX_DEAD, ExitReason.VERIFIER_ERROR):
            await _blame(sandbox, result)
        return False
    if place == "fresh":
        return True
    if not await _score(task, None if place == "none" else sandbox, result, config.verifier_timeout_s):
        if place == "same" and result.exit_reason in (ExitReason.SANDBOX_DEAD, ExitReason.VERIFIER_ERROR):
            await _blame(sandbox, result)  # the agent's sandbox: what it left may have done it
        return False
    return False


async def grade_fresh(
    task: Task, sandbox_cfg: SandboxConfig | None, result: EpisodeResult, config: AgentConfig
) -> None:
    """`score` in a new sandbox of `task`, set up as for an episode, with only `result.patch`
    carried over. A grading sandbox that cannot start or set up is `sandbox_dead` (ours, never the
    agent's: it never ran there)."""
    t0 = time.perf_counter()
    figures: dict[str, Any] = {}
    try:
        async with episode_sandbox(task, sandbox_cfg, figures) as ready:
            result.metrics["grade_sandbox_s"] = time.perf_counter() - t0
            if ready.failure is not None or ready.sandbox is None:
                failure = ready.failure
                result.exit_reason = ExitReason.SANDBOX_DEAD
                result.error = f"the grading sandbox: {failure.error if failure else 'none'}"
                result.reward = None
                return
            await _score(ready.task, ready.sandbox, result, config.verifier_timeout_s)
    except asyncio.CancelledError:
        result.exit_reason, result.error, result.reward = (
            ExitReason.CANCELLED,
            "cancelled during verification",
            None,
        )
    except (SandboxError, OSError) as exc:
        result.exit_reason, result.error, result.reward = (
            ExitReason.SANDBOX_DEAD,
            f"the grading sandbox: {exc}",
            None,
        )
    finally:
        result.metrics["grading_s"] = time.perf_counter() - t0
