"""What every harness agent shares (mini-swe-agent, Claude Code, Codex): a black-box agent talks
to its own gateway session while it acts in our sandbox; the session's trusted sampling and
context cap, the task text it is given, and the episode's token record (every segment of the
session) all work the same way whichever harness acts. Grading is not the harness's: `run_episode`
grades every agent's episode the same way (`uniagent.tasks.grading`).
Each harness is its own module: mini_swe_agent.py (in-process), cli_agent.py with claude_code.py
and codex.py (real CLIs inside the sandbox).
"""

from __future__ import annotations

import asyncio
import logging

from uniagent.agent.base import TaskView
from uniagent.agent.config import AgentConfig
from uniagent.agent.result import EpisodeResult
from uniagent.gateway.app import Gateway
from uniagent.gateway.sessions import Session, SessionConfig
from uniagent.models.base import SessionSpec
from uniagent.tokens.drift import episode_drift

log = logging.getLogger(__name__)


def task_text(task: TaskView) -> str:
    """What the harness is asked to do: the row's problem, else the task's last user message."""
    for key in ("problem_statement", "question", "task"):
        value = task.row.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    users = [m for m in task.messages() if m.get("role") == "user"]
    return str(users[-1].get("content", "")) if users else ""


NEEDS_TOKENS = "harness episodes need a token-level model (TokenChatModel)"
"""The episode's error when its model offers no gateway session (`ChatModel.session_spec()`)."""


def open_session(
    gateway: Gateway, spec: SessionSpec, agent: AgentConfig, task: TaskView, kind: str
) -> Session:
    """The episode's gateway session from what its model offers (`ChatModel.session_spec()`):
    the model's sampling (trusted; its `max_tokens` is the per-turn cap, `model.max_tokens`),
    parser and request id, the context cap. Every harness agent (mini-swe-agent, the CLIs) opens
    one."""
    return gateway.sessions.create(
        SessionConfig(
            sampling=spec.sampling,
            max_context_tokens=agent.max_context_tokens,
            parser=spec.parser,
            request_id=spec.request_id,
            metadata={"instance_id": task.instance_id, "agent_kind": kind},
        )
    )


async def attach_segments(session: Session, result: EpisodeResult) -> None:
    """Every segment of the session (each with its chain and reason) is in the episode's record;
    tokens the engine generated that no segment holds are counted as untrainable."""
    result.metrics["chains"] = session.chains
    result.metrics["turns"] = session.requests
    result.metrics["untrainable_tokens"] = session.dropped_tokens
    result.metrics["dropped_generations"] = session.dropped_generations
    if not session.segments:
        return
    try:
        async with session.lock:
            trajs = await asyncio.to_thread(session.trajectories)
    except Exception as exc:  # the episode stands; its token record is what failed
        log.warning("could not finish the harness trajectory: %s", exc)
        result.metrics["trajectory_error"] = str(exc)
        return
    result.segments = trajs
    result.metrics["drift"] = episode_drift(trajs).index  # the stored row's rule, as in the loop
    result.metrics["segments"] = len(trajs)
    result.metrics["segment_drifts"] = [t.drift for t in trajs]
    result.metrics["prompt_tokens"] = max(len(t.prompt_ids) for t in trajs)
    result.metrics["completion_tokens"] = sum(t.num_model_tokens for t in trajs)


def finish_session(session: Session) -> None:
    """A harness episode's end: the session finalized, unless it was already aborted or closed.
    No reward is set here: grading is `run_episode`'s alone, after the agent returns (the
    session is deleted before then, so it never carries a verdict)."""
    if session.state == "open":
        session.state = "finalized"
