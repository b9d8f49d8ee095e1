"""The Task contract: a dataset row turned into an episode and a way to score it.

A task says what sandbox it needs, how to prepare it, what the model is told, which tools it
gets, and how to score the sandbox's final state. The verifier runs inside the sandbox after
the agent stops and before the sandbox is torn down.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from uniagent.agent.result import EpisodeResult, Reward
from uniagent.sandbox.base import Sandbox

SYSTEM_PROMPT = (
    "You are an autonomous agent working in a Linux sandbox. You act only through the tools "
    "you are given: call exactly one tool per reply and wait for its result. Think briefly "
    "before each call."
)


class Task(ABC):
    """One problem. Subclasses are built from rows by their family's `from_row`."""

    family: ClassVar[str]

    def __init__(self, row: dict[str, Any], source: str | None = None) -> None:
        self.row = row
        self.source = source
        self.instance_id: str = str(row.get("instance_id") or row.get("id") or "")

    @classmethod
    def from_row(cls, row: dict[str, Any], source: str | None = None) -> Task:
        return cls(row, source)

    def sandbox_config(self, base: dict[str, Any] | None) -> dict[str, Any]:
        """The sandbox this task needs, starting from the run's sandbox settings."""
        return dict(base or {"type": "local"})

    @abstractmethod
    def messages(self) -> list[dict[str, Any]]:
        """The conversation the agent starts from."""

    @abstractmethod
    def tools(self) -> list[str | dict[str, Any]]:
        """Tool names or {"name": ..., **config} entries for `uniagent.tools.build_tools`."""

    async def setup(self, sandbox: Sandbox) -> None:
        """Prepare the sandbox before the agent starts (copy the repo, scrub history...)."""
        return None

    @abstractmethod
    async def score(self, sandbox: Sandbox, result: EpisodeResult) -> Reward:
        """The reward for the sandbox's final state. Raising means the verifier failed."""

    def describe(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "family": self.family}
