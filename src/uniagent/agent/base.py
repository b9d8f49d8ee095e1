"""The Agent seam: who acts in an episode, behind one signature.

The runner, the Ray backend, the verl loop and the local trainer all run an episode the same way
(`uniagent.tasks.episode.run_episode`): the shared sandbox set-up (sandbox up, task setup, tool
scripts; always stopped), then `await agent.run(episode)` with the set-up `Episode`, then the
task's final state taken from the sandbox, the sandbox down, and grading (`uniagent.tasks.grading`,
by default in a fresh sandbox): an agent never grades its own episode. What differs between agents
is only `run`: the ReAct loop (`react`), a black-box harness talking to a gateway session
(`mini-swe-agent`), or any agent added through the registry (agent/registry.py).

An agent may need resources that outlive one episode (a harness's gateway serves every episode of
a run): `start(engine, codec)` builds them before the first episode, `close()` releases them after
the last; `open_agent` below does both around a block. The engine and codec are
the run's (`None` for a text-only model): an agent that cannot work without them says so in
`start` with a `ConfigError`. `AgentBase` holds the contract's defaults (no resources, the
task's sandbox unchanged), so an agent writes only what it changes.

This layer sits below `tasks`, so an agent sees a task through `TaskView`, the few members of
`uniagent.tasks.Task` an agent uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from uniagent.agent.config import AgentConfig
from uniagent.agent.registry import AGENTS, split_kind
from uniagent.agent.result import EpisodeResult
from uniagent.models.base import ChatModel, TokenEngine
from uniagent.sandbox.base import Sandbox
from uniagent.sandbox.settings import SandboxConfig
from uniagent.tokens import ChatCodec
from uniagent.tools.base import Tool


class TaskView(Protocol):
    """What an agent may use of a task (`uniagent.tasks.Task` has all of it)."""

    instance_id: str
    row: dict[str, Any]

    def messages(self) -> list[dict[str, Any]]: ...


@dataclass
class Episode:
    """One episode, set up and handed to an agent: the task (already set up in `sandbox`), the
    task's tools (their scripts installed there), the episode's model and budgets, and `metrics`,
    the set-up's figures so far (the agent's result gets them)."""

    task: TaskView
    sandbox: Sandbox
    tools: list[Tool]
    model: ChatModel
    config: AgentConfig = field(default_factory=AgentConfig)
    metrics: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Agent(Protocol):
    """Runs one episode of a task in a set-up sandbox with a model.

    `run` never raises for an episode-level failure: every way out is one `ExitReason` in the
    returned `EpisodeResult`. The reward is not the agent's to give: `run_episode` grades a
    trainable exit after `run` returns. One agent object serves many episodes at once.

    `prepare_sandbox(config)` is the one hook into the set-up: `run_episode` calls it with the
    sandbox config the task completed, before the sandbox starts, and starts what it returns. An
    agent that runs inside the sandbox adds what it needs there (a CLI harness binds its install
    and its session socket's directory in); every other agent returns `config` as it is."""

    name: str

    async def start(self, engine: TokenEngine | None, codec: ChatCodec | None) -> None: ...

    async def close(self) -> None: ...

    def prepare_sandbox(self, config: SandboxConfig) -> SandboxConfig: ...

    async def run(self, episode: Episode) -> EpisodeResult: ...


class AgentBase:
    """The defaults of the `Agent` contract, for an agent to inherit: no per-run resources
    (`start`, `close` do nothing) and the task's sandbox as it is (`prepare_sandbox`). A
    subclass gives `name` and `run`, and overrides only what it needs."""

    name: str = ""

    async def start(self, engine: TokenEngine | None, codec: ChatCodec | None) -> None:
        return None

    async def close(self) -> None:
        return None

    def prepare_sandbox(self, config: SandboxConfig) -> SandboxConfig:
        return config


def create_agent(kind: str) -> Agent:
    """An unstarted agent of `kind` (`react`, `mini-swe-agent[:CONFIG]`, ...)."""
    name, arg = split_kind(kind)
    agent: Agent = AGENTS.load(name)(arg)
    return agent


@contextlib.asynccontextmanager
async def open_agent(
    kind: str | Agent, engine: TokenEngine | None = None, codec: ChatCodec | None = None
) -> AsyncIterator[Agent]:
    """An agent of `kind` (or the agent object itself), started over the run's engine and codec
    for the block and closed after it, however it ends."""
    agent = create_agent(kind) if isinstance(kind, str) else kind
    await agent.start(engine, codec)
    try:
        yield agent
    finally:
        await agent.close()
