"""`none`: no condensing. The episode ends `context_limit` when it reaches `max_context_tokens`
(the behaviour before context policies; the loop never asks this policy)."""

from __future__ import annotations

from uniagent.agent.config import ContextConfig
from uniagent.agent.context.base import Condensed, Request


class NoPolicy:
    name = "none"

    def __init__(self, config: ContextConfig) -> None:
        self.config = config

    async def condense(self, request: Request) -> Condensed | None:
        return None
