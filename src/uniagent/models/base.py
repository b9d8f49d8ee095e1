"""Model contracts: token-level engines and message-level chat models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from uniagent.parsers.base import ToolCall

FinishReason = Literal["stop", "length", "abort"]


class SamplingParams(BaseModel):
    """How to sample one generation. `stop_token_ids` end it (the stop token is kept)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    max_tokens: int = Field(512, ge=1)
    stop_token_ids: list[int] = Field(default_factory=list)
    seed: int | None = None


@dataclass
class Generation:
    """What an engine produced: token ids exactly as sampled and the logprob of each."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    # The policy version that sampled each token (`LocalEngine.version` at sampling time). A generation
    # interrupted by a weight update and resumed (partial rollout) holds tokens of several versions.
    # `None`: the engine does not know (remote servers); the record then says "unknown", never a guess.
    versions: list[int] | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"Generation has {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs")
        if self.versions is not None and len(self.versions) != len(self.token_ids):
            raise ValueError(f"Generation has {len(self.token_ids)} tokens but {len(self.versions)} versions")


@runtime_checkable
class TokenEngine(Protocol):
    """Token in, token out. `request_id` is sticky per episode (engines may route on it)."""

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> Generation: ...


@dataclass
class AssistantTurn:
    """One model turn at message level.

    `message` is what goes into the conversation history; `text` is the raw generated text;
    `format_error` is set when tool calls could not be parsed (its text goes back to the model).
    """

    text: str
    thought: str
    tool_calls: list[ToolCall]
    message: dict[str, Any]
    finish_reason: FinishReason = "stop"
    format_error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SessionSpec:
    """What a token-level chat model offers a gateway session, so that a black-box harness's
    episode samples exactly as the model would: its trusted `sampling` (stop ids included), the
    name of its tool-call `parser`, and its sticky `request_id` (an engine keeps its prefix by
    it). `ChatModel.session_spec()` gives it; a text-level model has none."""

    sampling: SamplingParams
    parser: str
    request_id: str


@runtime_checkable
class ChatModel(Protocol):
    """Message level: the agent loop talks to this, and only through these members.

    `context_tokens`: tokens in the current segment (what the next call's context holds; 0 for a
    model that keeps no token record). `segments`: the token record so far, one `Trajectory`
    per segment ([] for a text-level model). `begin_segment(reason)`: the next `query` renders
    its messages afresh and starts a segment with that reason (a context policy condensed the
    history). `finish(messages, tools)`: the episode's segments, each with its drift.
    `max_tokens` on `query` caps that call only. `session_spec()`: what the model offers a
    gateway session (`SessionSpec`), `None` for a model without a token engine (a harness agent
    needs one). `trainable`: its token record is what the policy produced (False for a text-level
    model); `run_episode` marks an episode of a model that is not trainable untrainable
    (`untrainable_reason: text_only_model`)."""

    trainable: bool

    @property
    def context_tokens(self) -> int: ...

    @property
    def segments(self) -> list[Any]: ...

    async def query(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
    ) -> AssistantTurn: ...

    def begin_segment(self, reason: str) -> None: ...

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """Tokens of a prompt rendered afresh from `messages` (what a new segment would start
        with; a context policy sizes a condensed history with it). 0 without a token record."""
        ...

    def finish(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[Any]: ...

    def session_spec(self) -> SessionSpec | None: ...
