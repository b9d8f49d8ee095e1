"""The Task contract: a dataset row turned into an episode and a way to score it.

A task says what sandbox it needs, how to prepare it, what the model is told, which tools it
gets, and how its outcome is graded. Grading is two steps, run by `uniagent.tasks.grading` (the
one place that decides where each runs, for every kind of agent):

- `final_state(sandbox, result)` runs in the agent's sandbox after the agent stops and records on
  `result` what carries over to grading (a patch-graded task: `result.patch`);
- `score(sandbox, result)` gives the verdict from what was carried over, in the sandbox that
  `carries` calls for.

`carries` says what crosses from the agent's sandbox to grading:

- "patch": only `result.patch`. By default (`agent.grade_in: fresh`) the agent's sandbox is
  stopped and `score` runs in a fresh sandbox of the task, set up as for an episode, so nothing
  the agent left running or changed outside its workspace reaches the tests.
- "answer": only the agent's final answer (`result.answer`); `score` gets no sandbox (`None`).
- "sandbox": the verifier reads the agent's sandbox as it was left (a task whose outcome is
  neither a patch nor an answer); `score` runs there, before it is torn down.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

from uniagent.agent.config import AgentConfig
from uniagent.agent.result import EpisodeResult, Reward
from uniagent.errors import SandboxError
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.config import SandboxConfig, parse_config

SYSTEM_PROMPT = (
    "You are an autonomous agent working in a Linux sandbox. You act only through the tools "
    "you are given: call exactly one tool per reply and wait for its result. Think briefly "
    "before each call."
)


class WorkspaceDestroyedError(SandboxError):
    """`final_state` cannot compute the agent's outcome because the agent destroyed what it needs
    (its repository, the base commit). The policy's outcome: graded 0 and trained on."""


Carries = Literal["patch", "answer", "sandbox"]


class Task(ABC):
    """One problem. Subclasses are built from rows by their family's `from_row`."""

    family: ClassVar[str]
    carries: ClassVar[Carries] = "sandbox"
    """What crosses from the agent's sandbox to grading (see the module docstring)."""

    def __init__(self, row: dict[str, Any], source: str | None = None) -> None:
        self.row = row
        self.source = source
        self.instance_id: str = str(row.get("instance_id") or row.get("id") or "")

    @classmethod
    def from_row(cls, row: dict[str, Any], source: str | None = None) -> Task:
        return cls(row, source)

    def sandbox_config(self, base: SandboxConfig | None) -> SandboxConfig:
        """The sandbox this task needs (a backend's typed config), starting from the run's sandbox
        settings (None: the default local sandbox)."""
        return parse_config(base)

    def agent_config(self, config: AgentConfig) -> AgentConfig:
        """The run's agent budgets as this task needs them (a task format with its own agent
        timeout narrows `wall_time_s`); by default the run's, unchanged."""
        return config

    @abstractmethod
    def messages(self) -> list[dict[str, Any]]:
        """The conversation the agent starts from."""

    @abstractmethod
    def tools(self) -> list[str | dict[str, Any]]:
        """Tool names or {"name": ..., **config} entries for `uniagent.tools.build_tools`."""

    async def setup(self, sandbox: Sandbox) -> None:
        """Prepare the sandbox before the agent starts (copy the repo, scrub history...)."""
        return None

    async def final_state(self, sandbox: Sandbox, result: EpisodeResult) -> None:
        """Record on `result` what grading needs from the agent's sandbox (a patch-graded task:
        `result.patch`). Runs there after the agent stops. Raising means grading failed."""
        return None

    @abstractmethod
    async def score(self, sandbox: Sandbox | None, result: EpisodeResult) -> Reward:
        """The verdict on what `final_state` carried over, in the sandbox `carries` calls for
        (`None` for an answer-graded task). Raising means the verifier failed."""

    def describe(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "family": self.family}
