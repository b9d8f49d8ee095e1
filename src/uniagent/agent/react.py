"""The `react` agent: `AgentInteraction`, our white-box ReAct loop, behind the Agent seam."""

from __future__ import annotations

from uniagent.agent.base import AgentBase, Episode
from uniagent.agent.loop import AgentInteraction
from uniagent.agent.result import EpisodeResult
from uniagent.errors import ConfigError


class ReactAgent(AgentBase):
    """Needs no per-run resources and takes the task's sandbox as it is (`AgentBase`'s defaults):
    each episode builds its own loop over the episode's model."""

    name = "react"

    def __init__(self, arg: str | None = None) -> None:
        if arg:
            raise ConfigError(f"agent kind 'react:{arg}': react takes no ':ARGUMENT'; use `react`")

    async def run(self, episode: Episode) -> EpisodeResult:
        loop = AgentInteraction(episode.model, episode.tools, episode.config)
        # Not graded here: `run_episode` grades every agent's episode (uniagent.tasks.grading).
        return await loop.run(episode.task.messages(), episode.sandbox)
