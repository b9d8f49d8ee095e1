"""The agent registry: every agent kind is one line in `AGENTS`, like the sandbox backends
(sandbox/registry.py) and the engines (models/registry.py).

A line maps the kind's name to where its class lives (`"module:Class"`, imported only when an
agent of that kind is created: the `mini-swe-agent` line names a module of the gateway layer,
above this one, which a string may do and an import may not). A kind is `NAME` or `NAME:ARGUMENT`
(`mini-swe-agent:swebench.yaml`); the class is built as `Class(ARGUMENT or None)` and implements
the `Agent` protocol (agent/base.py). Adding an agent is one module plus one line below.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

from pydantic import AfterValidator

from uniagent.agent.base import Agent
from uniagent.errors import ConfigError
from uniagent.models.base import TokenEngine
from uniagent.tokens import ChatCodec

# One line per agent kind.
AGENTS: dict[str, str] = {
    "react": "uniagent.agent.react:ReactAgent",
    "mini-swe-agent": "uniagent.gateway.mini_swe_agent:MiniSweAgent",
    "claude-code": "uniagent.gateway.claude_code:ClaudeCodeAgent",
    "codex": "uniagent.gateway.codex:CodexAgent",
}


def split_kind(kind: str) -> tuple[str, str | None]:
    """`NAME[:ARGUMENT]` -> (NAME, ARGUMENT or None); an unknown NAME is a ConfigError listing the
    known ones (checked without importing the agent's module)."""
    name, _, arg = kind.partition(":")
    if name not in AGENTS:
        raise ConfigError(f"unknown agent kind {name!r}; known: {', '.join(AGENTS)} (NAME or NAME:ARGUMENT)")
    return name, arg or None


def create_agent(kind: str) -> Agent:
    """An unstarted agent of `kind` (`react`, `mini-swe-agent[:CONFIG]`, ...)."""
    name, arg = split_kind(kind)
    module, _, attr = AGENTS[name].partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"agent kind {name!r} needs the Python package {exc.name!r}: install it (pip install {exc.name})"
        ) from None
    agent: Agent = cls(arg)
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


def _check_kind(kind: Any) -> Any:
    if isinstance(kind, str):
        try:
            split_kind(kind)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return kind


AgentKind = Annotated[str, AfterValidator(_check_kind)]
"""A config field naming an agent kind, checked against the registry when the config is built."""
