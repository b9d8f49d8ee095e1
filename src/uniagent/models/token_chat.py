"""TokenChatModel: a ChatModel that records the exact token stream as it goes.

The agent loop speaks messages; the trainer needs tokens. This model keeps both in lockstep:
the first turn renders the prompt, later turns append only the codec's continuation, and the
model's tokens are stored exactly as the engine returned them. Text is decoded from tokens for
the conversation; tokens are never re-derived from that text.
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

from uniagent.errors import UniAgentError
from uniagent.models.base import AssistantTurn, SamplingParams, TokenEngine
from uniagent.parsers.base import ToolCall, ToolFormatError, ToolParser
from uniagent.parsers.prompt import inject_tools
from uniagent.tokens import ChatCodec, Trajectory


class HistoryMismatchError(UniAgentError):
    """The caller changed conversation history this model already turned into tokens."""


class TokenChatModel:
    """Token-in-token-out chat model over any `TokenEngine`.

    One instance serves one episode (one conversation): call `reset()` to start another.
    Tools are shown to the model natively when the template renders tool calls, otherwise as
    system-prompt instructions in the parser's format.
    """

    trainable = True

    def __init__(
        self,
        engine: TokenEngine,
        codec: ChatCodec,
        parser: ToolParser,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        native_tools: bool | None = None,
    ) -> None:
        self.engine = engine
        self.codec = codec
        self.parser = parser
        base = sampling or SamplingParams()
        stops = list(dict.fromkeys([*base.stop_token_ids, *codec.stop_token_ids]))
        self.sampling = base.model_copy(update={"stop_token_ids": stops})
        self.native_tools = codec.renders_tool_calls if native_tools is None else native_tools
        self.request_id = request_id or uuid.uuid4().hex
        self.reset(self.request_id)

    def reset(self, request_id: str | None = None) -> None:
        """Forget the conversation; the next `query` starts a new trajectory."""
        self.trajectory: Trajectory | None = None
        self.request_id = request_id or uuid.uuid4().hex
        self._seen: list[dict[str, Any]] = []
        self._cut_turn = False
        self._call_count = 0

    # -- ChatModel ------------------------------------------------------------------------
    async def query(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> AssistantTurn:
        started = time.perf_counter()
        prompt_ids = self._extend(messages, tools)
        generation = await self.engine.generate(prompt_ids, self.sampling, self.request_id)
        assert self.trajectory is not None
        self.trajectory.add_generation(generation.token_ids, generation.logprobs, generation.finish_reason)
        stops = set(self.sampling.stop_token_ids)
        ended = bool(generation.token_ids) and generation.token_ids[-1] in stops
        self._cut_turn = not ended
        text_ids = generation.token_ids[:-1] if ended else generation.token_ids
        text = self.codec.decode(text_ids)
        turn = self._turn(text, tools, generation.finish_reason)
        turn.prompt_tokens = len(prompt_ids)
        turn.completion_tokens = len(generation.token_ids)
        turn.metrics["model_s"] = time.perf_counter() - started
        # Only the new messages are copied: the earlier ones were checked equal to `_seen` by `_extend`
        # (a copy of the whole history per turn grew with it).
        self._seen.extend(copy.deepcopy(messages[len(self._seen) :]))
        self._seen.append(turn.message)
        return turn

    def finish(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Trajectory:
        """Close the episode: compute drift against a full render of `messages`, validate."""
        if self.trajectory is None:
            raise UniAgentError("no turn was generated, so there is no trajectory to finish")
        rendered = self._for_template(messages, tools)
        self.trajectory.drift = self.codec.drift(rendered, self.trajectory.token_ids, self._native(tools))
        self.trajectory.validate()
        return self.trajectory

    @property
    def context_tokens(self) -> int:
        return len(self.trajectory) if self.trajectory else 0

    # -- internals ------------------------------------------------------------------------
    def _native(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return tools if (tools and self.native_tools) else None

    def _for_template(self, messages: list[dict[str, Any]], tools) -> list[dict[str, Any]]:
        """Messages as the template sees them: tool instructions injected when not native."""
        if tools and not self.native_tools:
            return inject_tools(messages, tools, self.parser)
        return messages

    def _extend(self, messages: list[dict[str, Any]], tools) -> list[int]:
        """Bring the token stream up to `messages` and return the full prompt ids."""
        if self.trajectory is None:
            self.trajectory = Trajectory(
                prompt_ids=self.codec.prompt_ids(self._for_template(messages, tools), self._native(tools))
            )
            return self.trajectory.prompt_ids
        n = len(self._seen)
        if messages[:n] != self._seen:
            raise HistoryMismatchError(
                "the conversation history differs from the one already tokenized; "
                "TokenChatModel only appends (call reset() to start a new trajectory)"
            )
        new = messages[n:]
        if not new:
            raise UniAgentError("query() needs at least one new message after the model's last turn")
        if self._cut_turn:
            # The turn stopped without its end-of-turn (max_tokens): close it as context.
            self.trajectory.add_context(self.codec.eot_ids, role="assistant")
            self._cut_turn = False
        ids = self.codec.continuation_ids(new, self._native(tools))
        self.trajectory.add_context(ids, role=new[0].get("role", "context"))
        return self.trajectory.token_ids

    def _turn(self, text: str, tools, finish_reason) -> AssistantTurn:
        format_error = None
        calls: list[ToolCall] = []
        try:
            parsed = self.parser.parse(text, tools)
            thought, calls = parsed.thought, parsed.calls
        except ToolFormatError as exc:
            thought, format_error = text.strip(), str(exc)
        for call in calls:
            self._call_count += 1
            call.id = call.id or f"call_{self._call_count}"
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls and self.native_tools:
            message = {"role": "assistant", "content": thought, "tool_calls": [c.to_openai() for c in calls]}
        return AssistantTurn(
            text=text,
            thought=thought,
            tool_calls=calls,
            message=message,
            finish_reason=finish_reason,
            format_error=format_error,
        )
