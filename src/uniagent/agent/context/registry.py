"""The context-policy registry: every policy is one module plus one line in `POLICIES` (a
`uniagent.registry.Registry`, like every extension table). A policy class is built as
`Class(ContextConfig)` once per episode and implements `ContextPolicy` (context/base.py).

`agent.config` checks a policy name against this table, so this module does not import the config
(a policy is built from anything that names it, `PolicySettings`): no cycle between the two."""

from __future__ import annotations

from typing import Protocol

from uniagent.agent.context.base import ContextPolicy
from uniagent.registry import Entry, Registry


class PolicySettings(Protocol):
    """What `create_policy` reads of its settings (`agent.config.ContextConfig`, which the policy
    class then takes whole)."""

    policy: str


# One line per policy.
POLICIES = Registry(
    "context policy",
    {
        "none": Entry("uniagent.agent.context.none:NoPolicy", "end the episode at the context cap"),
        "window": Entry("uniagent.agent.context.window:WindowPolicy", "keep the task and the latest turns"),
        "summarize": Entry(
            "uniagent.agent.context.summarize:SummarizePolicy", "the policy model condenses earlier turns"
        ),
    },
)


def policy_class(name: str) -> type:
    """The class of policy `name`; an unknown one is a ConfigError listing them."""
    cls: type = POLICIES.load(name)
    return cls


def create_policy(config: PolicySettings) -> ContextPolicy:
    """The episode's policy, as `agent.context` names it."""
    policy: ContextPolicy = policy_class(config.policy)(config)
    return policy
