"""Gateway sessions: the exact token stream behind an OpenAI-style conversation.

A black-box harness sends its whole conversation on every request. A session keeps that
conversation's token record in one `TokenConversation` (uniagent.tokens), the same bookkeeping
`TokenChatModel` uses: a request that extends a segment appends only the new messages' tokens; a
request that rewrites history after an assistant turn the session holds rolls back to the exact
tokens up to that turn (`rollback`); anything else starts a segment rendered afresh, in a new
chain (`rewritten`). Every generated token stays in exactly one segment with mask 1.

What stays here is the gateway's side: cleaning the client's messages, the match keys that say
whether a message is the same one (whitespace-insensitive), the template's view of client
messages, trusted sampling, the context cap and the counters of tokens the engine generated that
no segment holds (a request that went away mid-generation).

State changes only when a generation succeeds (`plan` then `commit`), so a client that drops
a request mid-generation leaves the record as it was.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from uniagent.errors import UniAgentError
from uniagent.models.base import Generation, SamplingParams
from uniagent.parsers.base import ToolCall, ToolFormatError, ToolParser, call_id, decode_arguments
from uniagent.parsers.prompt import inject_tools
from uniagent.parsers.registry import get_parser
from uniagent.tokens import ChatCodec, Segment, TokenConversation, Trajectory
from uniagent.tokens import Plan as Step

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "seed")


class GatewayError(UniAgentError):
    """A request the gateway refuses; becomes an OpenAI-style JSON error with `status`."""

    def __init__(
        self, message: str, status: int = 400, code: str | None = None, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.kind = kind


class ContextLengthError(GatewayError):
    """A request does not fit the context cap. `tokens` and `limit` let each wire protocol say it
    the way its clients recognise (Claude Code: "prompt is too long: N tokens > M maximum")."""

    def __init__(self, message: str, tokens: int, limit: int) -> None:
        super().__init__(message, 400, "context_length_exceeded")
        self.tokens = tokens
        self.limit = limit


class SessionConfig(BaseModel):
    """What `POST /sessions` takes. Sampling here is trusted: it overrides the client's."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,200}$")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    client_sampling: list[str] = Field(
        default_factory=list,
        description=f"sampling fields the client may set per request ({', '.join(SAMPLING_FIELDS)})",
    )
    max_context_tokens: int | None = Field(
        None, ge=2, description="tokens per segment (prompt + response); reaching it ends the segment"
    )
    parser: str | None = Field(None, description="tool-call format the model writes (default: server's)")
    request_id: str | None = Field(None, description="engine routing id (default: the session id)")
    metadata: dict[str, Any] = Field(default_factory=dict)

    def model_post_init(self, __context: Any) -> None:
        bad = [f for f in self.client_sampling if f not in SAMPLING_FIELDS]
        if bad:
            raise ValueError(f"client_sampling: unknown fields {bad}; allowed: {list(SAMPLING_FIELDS)}")


# -- message normalization -----------------------------------------------------------------


def content_text(content: Any) -> str:
    """OpenAI content (string, None or a list of parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise GatewayError(f"message content part of type {kind!r} is not supported (text only)")
        return "".join(parts)
    raise GatewayError(
        f"message content must be a string or a list of text parts, got {type(content).__name__}"
    )


def _arguments(raw: Any) -> Any:
    """A client's call arguments read as the parsers read a reply's (`decode_arguments`); a
    string that is not JSON is kept as sent, so the history still matches what the client holds."""
    try:
        return decode_arguments(raw)
    except ValueError:
        return raw


def clean_message(message: Any, index: int) -> dict[str, Any]:
    """The fields a chat template uses, from whatever a client sent (extra keys dropped)."""
    if not isinstance(message, dict):
        raise GatewayError(f"messages[{index}] must be an object with 'role' and 'content'")
    role = message.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise GatewayError(f"messages[{index}].role must be system, user, assistant or tool; got {role!r}")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    out["content"] = content_text(message.get("content"))
    calls = message.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise GatewayError(f"messages[{index}].tool_calls must be a list on an assistant message")
        clean = []
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise GatewayError(f"messages[{index}].tool_calls[{j}] needs function.name and arguments")
            clean.append(
                {
                    "id": str(call.get("id") or ""),
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"))},
                }
            )
        out["tool_calls"] = clean
    if role == "tool":
        if message.get("tool_call_id"):
            out["tool_call_id"] = str(message["tool_call_id"])
        if message.get("name"):
            out["name"] = str(message["name"])
    return out


def match_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What must be unchanged for a message to count as the same history (whitespace-insensitive)."""
    calls = tuple(
        (c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
        for c in message.get("tool_calls") or []
    )
    return (message["role"], message["content"].strip(), calls, message.get("tool_call_id", ""))


# -- sessions ------------------------------------------------------------------------------


@dataclass
class Plan:
    """A request turned into a prompt; applied to the session only if generation succeeds."""

    step: Step  # where the request goes in the conversation (extend, roll back, or a new segment)
    sampling: SamplingParams
    capped: bool  # max_tokens was lowered to fit the context cap

    @property
    def prompt_ids(self) -> list[int]:
        return self.step.prompt_ids

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return self.step.tools


@dataclass
class Turn:
    """One generation at message level."""

    text: str
    content: str
    calls: list[ToolCall]
    format_error: str | None
    finish_reason: str  # OpenAI: stop | length | tool_calls
    generation: Generation
    prompt_tokens: int
    chain: int
    reasoning: str | None = None  # what the model wrote in the template's reasoning part


class Session:
    """One harness episode: its token conversation, trusted sampling and lifecycle."""

    def __init__(
        self,
        session_id: str,
        config: SessionConfig,
        codec: ChatCodec,
        parser: ToolParser,
        model_max_len: int | None,
    ) -> None:
        self.id = session_id
        self.config = config
        self.codec = codec
        self.parser = parser
        self.native_tools = codec.renders_tool_calls
        self.request_id = config.request_id or session_id
        stops = list(dict.fromkeys([*config.sampling.stop_token_ids, *codec.stop_token_ids]))
        self.sampling = config.sampling.model_copy(update={"stop_token_ids": stops})
        caps = [c for c in (config.max_context_tokens, model_max_len) if c]
        self.max_context = min(caps) if caps else None
        self.conversation = TokenConversation(codec, stops, self.native_tools, self._inject)
        self.lock = asyncio.Lock()
        self.created = time.time()
        self.last_active = time.monotonic()
        self.state = "open"  # open | finalized | aborted | expired
        self.reward: float | None = None
        self.reward_details: dict[str, Any] = {}
        self.requests = 0
        self.context_full = False  # a request hit the context cap
        self.inflight: set[asyncio.Task[Any]] = set()
        self.dropped_generations = 0  # generations that went away before they were recorded
        self.dropped_tokens = 0  # their tokens the engine reported (streamed) before that
        self.engine_errors = 0  # model calls the engine failed (a harness's model_error, even mid-stream)
        self._call_count = 0

    # -- views -------------------------------------------------------------------------
    @property
    def segments(self) -> list[Segment]:
        return self.conversation.segments

    @property
    def chains(self) -> int:
        """How many linear conversations the harness held in this session."""
        return len({s.trajectory.chain for s in self.segments})

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def check_open(self) -> None:
        if self.state == "finalized":
            raise GatewayError(f"session {self.id!r} is finalized", 409, "session_closed")
        if self.state != "open":  # 404: clients (litellm, openai) stop instead of retrying
            raise GatewayError(f"session {self.id!r} is {self.state}", 404, "session_closed")

    def _inject(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return inject_tools(messages, tools, self.parser)

    def _template_view(self, message: dict[str, Any]) -> dict[str, Any]:
        """A client message as the template should see it (calls as text when not native). The
        conversation copies what it keeps, so an unchanged message is passed as it is."""
        if message["role"] == "assistant" and message.get("tool_calls") and not self.native_tools:
            calls = [
                self.parser.render_call(ToolCall(c["function"]["name"], c["function"]["arguments"] or {}))
                for c in message["tool_calls"]
            ]
            text = "\n".join(p for p in [message["content"].strip(), *calls] if p)
            return {"role": "assistant", "content": text}
        return message

    # -- requests ----------------------------------------------------------------------
    def sampling_for(self, request: dict[str, Any]) -> SamplingParams:
        update: dict[str, Any] = {}
        for name in self.config.client_sampling:
            value = request.get("max_completion_tokens") if name == "max_tokens" else None
            value = request.get(name) if value is None else value
            if value is not None:
                update[name] = value
        if not update:
            return self.sampling
        try:
            return SamplingParams.model_validate({**self.sampling.model_dump(), **update})
        except ValueError as exc:
            raise GatewayError(f"invalid sampling parameter: {exc}") from None

    def plan(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: SamplingParams
    ) -> Plan:
        """Where this request goes (extend, roll back or a new segment) and its prompt ids."""
        keys = [match_key(m) for m in messages]
        step = self.conversation.plan([self._template_view(m) for m in messages], tools, keys)
        if step.segment is not None and step.segment.ended:
            self.context_full = True
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_context} tokens; this conversation "
                "reached it and has ended (context_length_exceeded).",
                len(step.prompt_ids),
                self.max_context or 0,
            )
        sampling, capped = self._fit(step, sampling)
        return Plan(step, sampling, capped)

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        """Tokens of this request's prompt rendered afresh, tools included (what a protocol's
        token-count endpoint answers); nothing in the session changes."""
        shown = self.conversation.full_view([self._template_view(m) for m in messages], tools)
        return len(self.codec.prompt_ids(*shown))

    def _fit(self, step: Step, sampling: SamplingParams) -> tuple[SamplingParams, bool]:
        if self.max_context is None:
            return sampling, False
        room = self.max_context - len(step.prompt_ids)
        if room < 1:
            if step.segment is not None:
                step.segment.ended = "length"
            self.context_full = True
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_context} tokens. However, your messages "
                f"resulted in {len(step.prompt_ids)} tokens (context_length_exceeded).",
                len(step.prompt_ids),
                self.max_context,
            )
        if room < sampling.max_tokens:
            return sampling.model_copy(update={"max_tokens": room}), True
        return sampling, False

    def commit(self, plan: Plan, generation: Generation) -> Turn:
        """Record a successful generation in the conversation; build the assistant turn."""
        gen = generation
        reply = self.conversation.commit(
            plan.step, gen.token_ids, gen.logprobs, gen.finish_reason, gen.versions
        )
        text = reply.text
        # The answer without the template's own header or think block (tokens/reply.py): what
        # the client shows and sends back, and what the template renders back to these tokens.
        said = self.codec.reply_message(text)
        answer, reasoning = said["content"], said.get(self.codec.reply_format.field)
        calls: list[ToolCall] = []
        format_error = None
        try:
            parsed = self.parser.parse(answer, plan.tools) if plan.tools else None
        except ToolFormatError as exc:
            parsed, format_error = None, str(exc)
        content = answer
        if parsed is not None and parsed.calls:
            calls, content = parsed.calls, parsed.thought
            for call in calls:
                self._call_count += 1
                call.id = call.id or call_id(self._call_count)
        finish = "tool_calls" if calls else ("length" if generation.finish_reason == "length" else "stop")
        if generation.finish_reason == "length" and plan.capped:
            reply.segment.ended = "length"
            finish = "length"
        client_msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            client_msg["tool_calls"] = [c.to_openai() for c in calls]
        key = match_key(clean_message(client_msg, len(plan.step.messages)))
        template = dict(said)
        if calls and self.native_tools:
            template.update(content=content, tool_calls=client_msg["tool_calls"])
        self.conversation.add_reply(reply, template, key)
        self.requests += 1
        chain = reply.segment.trajectory.chain
        return Turn(
            text,
            content,
            calls,
            format_error,
            finish,
            generation,
            reply.prompt_tokens,
            chain,
            reasoning or None,
        )

    def dropped(self, tokens: int) -> None:
        """A generation went away before it was recorded (its client left, the session closed):
        the `tokens` the engine had reported are in no segment, so nothing trains on them."""
        self.dropped_generations += 1
        self.dropped_tokens += tokens

    # -- results -----------------------------------------------------------------------
    def trajectories(self) -> list[Trajectory]:
        """Every segment, with its drift against a full render of its messages
        (`TokenConversation.finish`: the same drift, and the same answer for a history the
        template cannot render, as the ReAct loop's `TokenChatModel`)."""
        return self.conversation.finish()

    def summary(self) -> dict[str, Any]:
        trainable = self.conversation.generated_tokens
        return {
            "session_id": self.id,
            "state": self.state,
            "chains": self.chains,
            "requests": self.requests,
            "reward": self.reward,
            "segments": [
                {
                    "chain": s.trajectory.chain,
                    "reason": s.trajectory.reason,
                    "tokens": len(s.trajectory),
                    "model_tokens": s.trajectory.num_model_tokens,
                    "turns": s.trajectory.num_turns,
                    "ended": s.ended,
                }
                for s in self.segments
            ],
            "generated_tokens": trainable + self.dropped_tokens,
            "untrainable_tokens": self.dropped_tokens,
            "dropped_generations": self.dropped_generations,
            "metadata": self.config.metadata,
        }


class SessionManager:
    """All sessions of a gateway; expires idle ones."""

    def __init__(
        self,
        codec: ChatCodec,
        parser: str = "hermes",
        model_max_len: int | None = None,
        idle_timeout_s: float = 1800.0,
        max_sessions: int = 10_000,
    ) -> None:
        self.codec = codec
        self.default_parser = parser
        get_parser(parser)  # fail early on a bad name
        self.model_max_len = model_max_len
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}

    def create(self, config: SessionConfig) -> Session:
        self.expire()
        sid = config.session_id or uuid.uuid4().hex
        if sid in self.sessions:
            raise GatewayError(f"session {sid!r} already exists", 409, "session_exists")
        if len(self.sessions) >= self.max_sessions:
            raise GatewayError(
                f"the gateway holds {self.max_sessions} sessions already", 429, "too_many_sessions"
            )
        try:
            parser = get_parser(config.parser or self.default_parser)
        except UniAgentError as exc:
            raise GatewayError(str(exc)) from None
        session = Session(sid, config, self.codec, parser, self.model_max_len)
        self.sessions[sid] = session
        return session

    def get(self, sid: str) -> Session:
        session = self.sessions.get(sid)
        if session is None or self._idle(session):
            if session is not None:
                self.close(session, "expired")
            raise GatewayError(f"session {sid!r} does not exist (or expired)", 404, "session_not_found")
        return session

    def _idle(self, session: Session) -> bool:
        return (
            not session.lock.locked()
            and not session.inflight
            and time.monotonic() - session.last_active > self.idle_timeout_s
        )

    def close(self, session: Session, state: str) -> None:
        if session.state == "open":
            session.state = state
        for task in list(session.inflight):
            task.cancel()
        if state in ("expired", "deleted"):
            self.sessions.pop(session.id, None)

    def expire(self) -> int:
        idle = [s for s in self.sessions.values() if self._idle(s)]
        for session in idle:
            self.close(session, "expired")
        return len(idle)
