"""The `agent:` section: who acts (`kind`) and the budgets of one episode. Every limit ends the
episode with its own exit reason.

The per-turn token cap is the model's (`model.max_tokens`, the model's sampling); the agent's
budgets are counted in turns, context tokens and seconds."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uniagent.agent.context.registry import POLICIES
from uniagent.agent.registry import AgentKind
from uniagent.errors import ConfigError
from uniagent.tools.base import DEFAULT_COMMAND_TIMEOUT_S


class ContextConfig(BaseModel):
    """How the ReAct loop keeps a long episode within `max_context_tokens` (`agent.context`).

    Before a model turn whose segment holds `compress_at` of the cap (or `compress_at_tokens`),
    the policy condenses the history the model sees; the model's next turn starts a new token
    segment (reason "condensed"). The episode ends `context_limit` only when the policy cannot
    bring the history under that threshold."""

    model_config = ConfigDict(extra="forbid")

    policy: str = Field(
        "none",
        description="none (the episode ends context_limit at the cap) | window (keep the system and task "
        "messages and the last keep_turns turns, with a note of what was dropped) | summarize (the policy "
        "model condenses the earlier turns into a summary, then window's cut); see "
        "uniagent.agent.context.POLICIES",
    )
    compress_at: float = Field(
        0.75, gt=0, le=1, description="fraction of max_context_tokens at which the policy condenses"
    )
    compress_at_tokens: int | None = Field(
        None, ge=32, description="condense at this many context tokens instead (default: compress_at)"
    )
    keep_turns: int = Field(
        2,
        ge=0,
        description="window/summarize: latest turns (an assistant message and its results) kept verbatim",
    )
    summary_max_tokens: int = Field(256, ge=8, description="summarize: the summary's token budget")

    @field_validator("policy")
    @classmethod
    def _registered(cls, name: str) -> str:
        try:
            POLICIES.entry(name)  # the name only: the policy's module is imported when it is built
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return name


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: AgentKind = Field(
        "react",
        description="who acts, a kind of the agent registry (uniagent.agent.registry.AGENTS): react (our "
        "loop) | mini-swe-agent[:CONFIG] | claude-code | codex (black-box harnesses through the gateway)",
    )
    max_turns: int = Field(30, ge=1, description="model turns before the episode ends with max_turns")
    max_context_tokens: int | None = Field(
        None, ge=64, description="prompt + history tokens; reaching it ends with context_limit"
    )
    wall_time_s: float | None = Field(None, gt=0, description="whole-episode limit (timeout_budget)")
    command_timeout_s: float = Field(
        DEFAULT_COMMAND_TIMEOUT_S,
        gt=0,
        description="how long one command of the model may run: the bash tool's default (a call "
        "may ask for more, up to the tool's max_timeout_s), each str_replace_editor operation, each "
        "command of mini-swe-agent, Claude Code's Bash default (BASH_DEFAULT_TIMEOUT_MS); past it the "
        "command is interrupted. Codex has no per-command setting: only wall_time_s bounds its commands",
    )
    timeout_budget: int = Field(
        5, ge=1, description="tool calls allowed to time out before the episode ends with timeout_budget"
    )
    max_format_errors: int = Field(3, ge=1, description="consecutive unusable turns before format_errors")
    observation_max_chars: int = Field(12_000, ge=200, description="observations are clipped to this")
    verifier_timeout_s: float = Field(
        900.0,
        gt=0,
        description="how long grading may take: computing the final state in the agent's sandbox, and "
        "the verifier's run (a fresh grading sandbox's start and set-up are bounded by the sandbox's own "
        "start_timeout_s); past it the episode ends verifier_error (untrainable)",
    )
    grade_in: Literal["fresh", "same"] = Field(
        "fresh",
        description="where a patch-graded task (swe, swe_rebench, r2e_gym) is graded: `fresh` (default) "
        "takes the agent's patch out of its sandbox, stops that sandbox, and grades the patch in a new "
        "sandbox of the task set up as for an episode, so nothing the agent left behind (a background "
        "process, files outside the workspace, its shell's state) reaches the tests; `same` grades in "
        "the agent's own sandbox (cheaper, and what uniagent did before). Answer-graded tasks (search, "
        "lookup) need no sandbox either way; see uniagent.tasks.grading",
    )
    context: ContextConfig = Field(default_factory=ContextConfig)

    @model_validator(mode="after")
    def _policy_has_a_threshold(self) -> AgentConfig:
        if self.context.policy != "none" and not (self.max_context_tokens or self.context.compress_at_tokens):
            raise ValueError(
                f"agent.context.policy {self.context.policy!r} condenses at a share of "
                "agent.max_context_tokens: set agent.max_context_tokens (or agent.context.compress_at_tokens)"
            )
        at, cap = self.context.compress_at_tokens, self.max_context_tokens
        if at and cap and at >= cap:
            raise ValueError(
                f"agent.context.compress_at_tokens ({at}) must be below agent.max_context_tokens ({cap})"
            )
        return self

    def compress_threshold(self) -> int | None:
        """Context tokens at which the policy condenses (None: never)."""
        if self.context.policy == "none":
            return None
        if self.context.compress_at_tokens:
            return self.context.compress_at_tokens
        assert self.max_context_tokens is not None  # the validator saw to it
        return max(1, int(self.max_context_tokens * self.context.compress_at))
