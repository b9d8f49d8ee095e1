"""The agent registry: every agent kind is one line in `AGENTS` (a `uniagent.registry.Registry`,
the shape of every extension table).

A line maps the kind's name to where its class lives (`"module:Class"`, imported only when an
agent of that kind is created: the `mini-swe-agent` line names a module of the gateway layer,
above this one, which a string may do and an import may not), with its `--agent` help and, for a
harness that needs a tool of its own, its doctor check. A kind is `NAME` or `NAME:ARGUMENT`
(`mini-swe-agent:swebench.yaml`); the class is built as `Class(ARGUMENT or None)` and implements
the `Agent` protocol (agent/base.py). Adding an agent is one module plus one line below.

It imports nothing of `agent`, so `agent.config` types its `kind` with `AgentKind` (checked when a
config is built) and `agent.base`, which builds and opens agents (`create_agent`, `open_agent`),
imports both.
"""

from __future__ import annotations

from uniagent.registry import Entry, Registry

# One line per agent kind.
AGENTS = Registry(
    "agent kind",
    {
        "react": Entry("uniagent.agent.react:ReactAgent", "our ReAct loop, the default"),
        "mini-swe-agent": Entry(
            "uniagent.harness.mini_swe_agent:MiniSweAgent", "mini-swe-agent[:CONFIG], a black-box harness"
        ),
        "claude-code": Entry(
            "uniagent.harness.claude_code:ClaudeCodeAgent",
            "the Claude Code CLI through the gateway",
            doctor="uniagent.harness.claude_code:doctor_check",
        ),
        "codex": Entry(
            "uniagent.harness.codex:CodexAgent",
            "the Codex CLI through the gateway",
            doctor="uniagent.harness.codex:doctor_check",
        ),
    },
)


def split_kind(kind: str) -> tuple[str, str | None]:
    """`NAME[:ARGUMENT]` -> (NAME, ARGUMENT or None); an unknown NAME is a ConfigError listing the
    known ones (checked without importing the agent's module)."""
    name, _, arg = kind.partition(":")
    if name not in AGENTS:
        raise AGENTS.unknown(name, f"{', '.join(AGENTS)} (NAME or NAME:ARGUMENT)")
    return name, arg or None


AgentKind = AGENTS.field_type(split_kind)
"""A config field naming an agent kind, checked against the registry when the config is built."""
