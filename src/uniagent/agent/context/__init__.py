"""Context management for the ReAct loop: pluggable policies that condense a long history.

`none` (end `context_limit` at the cap), `window` (keep the task and the latest turns),
`summarize` (the policy model condenses the earlier turns). Each compression starts a new token
segment (reason "condensed"); see agent/loop.py for how the loop stores the full history."""

from uniagent.agent.context.base import Condensed, ContextPolicy, Request, split_turns
from uniagent.agent.context.registry import POLICIES, create_policy, policy_class

__all__ = [
    "POLICIES",
    "Condensed",
    "ContextPolicy",
    "Request",
    "create_policy",
    "policy_class",
    "split_turns",
]
