"""The interaction loop shared by evaluation and training."""

from uniagent.agent.config import AgentConfig
from uniagent.agent.loop import AgentInteraction
from uniagent.agent.result import EpisodeResult, ExitReason, Reward

__all__ = ["AgentConfig", "AgentInteraction", "EpisodeResult", "ExitReason", "Reward"]
