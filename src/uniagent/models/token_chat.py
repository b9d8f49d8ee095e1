"""TokenChatModel: a ChatModel that records the exact token stream as it goes.

The agent loop speaks messages; the trainer needs tokens. This model keeps both in lockstep:
the first turn renders the prompt, later turns append only the codec's continuation, and the
model's tokens are stored exactly as the engine returned them. Text is decoded from tokens for
the conversation; tokens are never re-derived from that text.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from uniagent.errors import UniAgentError
from uniagent.models.base import AssistantTurn, SamplingParams, SessionSpec, TokenEngine
from uniagent.parsers.base import ToolCall, ToolFormatError, ToolParser, call_id
from uniagent.parsers.prompt import inject_tools
from uniagent.tokens import ChatCodec, TokenConversation, Trajectory


class TokenChatModel:
    """Token-in-token-out chat model over any `TokenEngine`.

    One instance serves one episode (one conversation): call `reset()` to start another.
    Tools are shown to the model natively when the template renders tool calls, otherwise as
    system-prompt instructions in the parser's format. The token record is a `TokenConversation`:
    a history that stops being append-only (a context policy condensed it, a caller rewrote it)
    starts a new segment instead of failing; nothing generated is dropped.
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
        follow_template: bool = False,
    ) -> None:
        self.engine = engine
        self.follow_template = follow_template
        self.codec = codec
        self.parser = parser
        base = sampling or SamplingParams()
        stops = list(dict.fromkeys([*base.stop_token_ids, *codec.stop_token_ids]))
        self.sampling = base.model_copy(update={"stop_token_ids": stops})
        self.native_tools = codec.renders_tool_calls if native_tools is None else native_tools
        self.request_id = request_id or uuid.uuid4().hex
        self.reset(self.request_id)

    def reset(self, request_id: str | None = None) -> None:
        """Forget the conversation; the next `query` starts a new record."""
        self.conversation = TokenConversation(
            self.codec, self.sampling.stop_token_ids, self.native_tools, self._inject, self.follow_template
        )
        self.request_id = request_id or uuid.uuid4().hex
        self._call_count = 0

    # -- ChatModel ------------------------------------------------------------------------
    async def query(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
    ) -> AssistantTurn:
        """One model turn. `max_tokens` lowers this turn's cap only (the loop's per-turn/context budget)."""
        if not messages:
            raise UniAgentError("query() needs at least one message")
        started = time.perf_counter()
        plan = self.conversation.plan(messages, tools)
        sampling = self.sampling
        if max_tokens is not None and max_tokens < sampling.max_tokens:
            sampling = sampling.model_copy(update={"max_tokens": max(1, max_tokens)})
        generation = await self.engine.generate(plan.prompt_ids, sampling, self.request_id)
        reply = self.conversation.commit(
            plan, generation.token_ids, generation.logprobs, generation.finish_reason, generation.versions
        )
        turn = self._turn(reply.text, tools, generation.finish_reason)
        self.conversation.add_reply(reply, turn.message)
        turn.prompt_tokens = reply.prompt_tokens
        turn.completion_tokens = len(generation.token_ids)
        turn.metrics["model_s"] = time.perf_counter() - started
        return turn

    def begin_segment(self, reason: str) -> None:
        """The next query renders its messages afresh and starts a segment with `reason`."""
        self.conversation.begin_segment(reason)

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """Tokens of the prompt `messages` would get rendered afresh (a context policy's sizing)."""
        return len(self.codec.prompt_ids(*self.conversation.full_view(messages, tools)))

    def finish(
        self, messages: list[dict[str, Any]] | None = None, tools: list[dict[str, Any]] | None = None
    ) -> list[Trajectory]:
        """Close the episode: every segment with its drift against a full render of its messages."""
        if not self.conversation.segments:
            raise UniAgentError("no turn was generated, so there is no trajectory to finish")
        return self.conversation.finish()

    def session_spec(self) -> SessionSpec:
        """A harness's gateway session samples as this model does: its sampling (stop ids
        included), parser and request id."""
        return SessionSpec(self.sampling, self.parser.name, self.request_id)

    @property
    def segments(self) -> list[Trajectory]:
        return self.conversation.trajectories

    @property
    def trajectory(self) -> Trajectory | None:
        """The current (last) segment."""
        seg = self.conversation.current
        return seg.trajectory if seg is not None else None

    @property
    def context_tokens(self) -> int:
        return self.conversation.context_tokens

    # -- internals ------------------------------------------------------------------------
    def _inject(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return inject_tools(messages, tools, self.parser)

    def _turn(self, text: str, tools, finish_reason) -> AssistantTurn:
        format_error = None
        calls: list[ToolCall] = []
        # the answer without the template's own header or think block (tokens/reply.py)
        message = self.codec.reply_message(text)
        answer = message["content"]
        try:
            parsed = self.parser.parse(answer, tools)
            thought, calls = parsed.thought, parsed.calls
        except ToolFormatError as exc:
            thought, format_error = answer.strip(), str(exc)
        for call in calls:
            self._call_count += 1
            call.id = call.id or call_id(self._call_count)
        if calls and self.native_tools:
            message.update(content=thought, tool_calls=[c.to_openai() for c in calls])
        return AssistantTurn(
            text=text,
            thought=thought,
            tool_calls=calls,
            message=message,
            finish_reason=finish_reason,
            format_error=format_error,
        )
