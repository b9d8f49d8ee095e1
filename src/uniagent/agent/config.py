"""Budgets of one episode. Every limit ends the episode with its own exit reason."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from uniagent.tools.base import DEFAULT_COMMAND_TIMEOUT_S


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(30, ge=1, description="model turns before the episode ends with max_turns")
    max_context_tokens: int | None = Field(
        None, ge=64, description="prompt + history tokens; reaching it ends with context_limit"
    )
    max_tokens_per_turn: int | None = Field(None, ge=1, description="cap on one model turn")
    wall_time_s: float | None = Field(None, gt=0, description="whole-episode limit (timeout_budget)")
    command_timeout_s: float = Field(
        DEFAULT_COMMAND_TIMEOUT_S,
        gt=0,
        description="how long one command of the model may run, in every agent: the bash tool's "
        "default (a call may ask for more, up to the tool's max_timeout_s), each str_replace_editor "
        "operation, each command of a harness agent; past it the command is interrupted",
    )
    timeout_budget: int = Field(
        5, ge=1, description="tool calls allowed to time out before the episode ends with timeout_budget"
    )
    max_format_errors: int = Field(3, ge=1, description="consecutive unusable turns before format_errors")
    observation_max_chars: int = Field(12_000, ge=200, description="observations are clipped to this")
    verifier_timeout_s: float = Field(900.0, gt=0)
