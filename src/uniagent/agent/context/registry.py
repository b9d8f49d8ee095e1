"""The context-policy registry: every policy is one module plus one line in `POLICIES`, like the
agents (agent/registry.py) and engines (models/registry.py). A policy class is built as
`Class(ContextConfig)` once per episode and implements `ContextPolicy` (context/base.py)."""

from __future__ import annotations

import importlib

from uniagent.agent.config import ContextConfig
from uniagent.agent.context.base import ContextPolicy
from uniagent.errors import ConfigError

# One line per policy.
POLICIES: dict[str, str] = {
    "none": "uniagent.agent.context.none:NoPolicy",
    "window": "uniagent.agent.context.window:WindowPolicy",
    "summarize": "uniagent.agent.context.summarize:SummarizePolicy",
}


def policy_class(name: str) -> type:
    if name not in POLICIES:
        raise ConfigError(f"unknown context policy {name!r}; known: {', '.join(POLICIES)}")
    module, _, attr = POLICIES[name].partition(":")
    cls: type = getattr(importlib.import_module(module), attr)
    return cls


def create_policy(config: ContextConfig) -> ContextPolicy:
    """The episode's policy, as `agent.context` names it."""
    policy: ContextPolicy = policy_class(config.policy)(config)
    return policy
