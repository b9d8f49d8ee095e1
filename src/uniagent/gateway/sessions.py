"""Gateway sessions: the exact token stream behind an OpenAI-style conversation.

A black-box harness sends its whole conversation on every request. The session keeps, per
*chain*, the token record (a `Trajectory`) and the messages it stands for. A request whose
messages extend a chain's history (same tools, the previous messages unchanged, at least one
new message) appends only the new messages' tokens through `ChatCodec.continuation_ids`; the
model's own tokens are never re-tokenized. A request that rewrites history (or changes the
tools) starts a new chain rendered from scratch, so every chain stays token-exact.

State changes only when a generation succeeds (`plan` then `commit`), so a client that drops
a request mid-generation leaves its chain as it was.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from uniagent.errors import UniAgentError
from uniagent.models.base import Generation, SamplingParams
from uniagent.parsers.base import ToolCall, ToolFormatError, ToolParser
from uniagent.parsers.prompt import inject_tools
from uniagent.parsers.registry import get_parser
from uniagent.tokens import ChatCodec, Trajectory

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
        None, ge=2, description="tokens per chain (prompt + response); reaching it ends the chain"
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
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw
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


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True)


# -- chains and sessions -----------------------------------------------------------------


@dataclass
class Chain:
    """One append-only conversation and its exact tokens."""

    index: int
    trajectory: Trajectory
    tools: list[dict[str, Any]] | None
    keys: list[tuple[Any, ...]] = field(default_factory=list)  # match keys of the client's view
    client_messages: list[dict[str, Any]] = field(default_factory=list)
    template_messages: list[dict[str, Any]] = field(default_factory=list)
    cut_turn: bool = False
    ended: str | None = None  # "length" once the context cap is reached
    requests: int = 0


@dataclass
class Plan:
    """A request turned into a prompt; applied to the session only if generation succeeds."""

    chain: Chain | None  # None: a new chain
    prompt_ids: list[int]
    context: list[tuple[list[int], str]]  # (ids, role) to append to an existing chain first
    messages: list[dict[str, Any]]  # the whole cleaned request
    template_new: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: SamplingParams
    capped: bool  # max_tokens was lowered to fit the context cap


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


class Session:
    """One harness episode: its chains, trusted sampling and lifecycle."""

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
        self.chains: list[Chain] = []
        self.lock = asyncio.Lock()
        self.created = time.time()
        self.last_active = time.monotonic()
        self.state = "open"  # open | finalized | aborted | expired
        self.reward: float | None = None
        self.reward_details: dict[str, Any] = {}
        self.requests = 0
        self.context_full = False  # a request hit the context cap
        self.inflight: set[asyncio.Task[Any]] = set()
        self._call_count = 0

    # -- views -------------------------------------------------------------------------
    def touch(self) -> None:
        self.last_active = time.monotonic()

    def check_open(self) -> None:
        if self.state == "finalized":
            raise GatewayError(f"session {self.id!r} is finalized", 409, "session_closed")
        if self.state != "open":  # 404: clients (litellm, openai) stop instead of retrying
            raise GatewayError(f"session {self.id!r} is {self.state}", 404, "session_closed")

    def _native(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return tools if (tools and self.native_tools) else None

    def _for_template(self, messages: list[dict[str, Any]], tools) -> list[dict[str, Any]]:
        if tools and not self.native_tools:
            return inject_tools(messages, tools, self.parser)
        return messages

    def _template_view(self, message: dict[str, Any]) -> dict[str, Any]:
        """A client message as the template should see it (calls as text when not native)."""
        if message["role"] == "assistant" and message.get("tool_calls") and not self.native_tools:
            calls = [
                self.parser.render_call(ToolCall(c["function"]["name"], c["function"]["arguments"] or {}))
                for c in message["tool_calls"]
            ]
            text = "\n".join(p for p in [message["content"].strip(), *calls] if p)
            return {"role": "assistant", "content": text}
        return copy.deepcopy(message)

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
        """Find the chain this request extends (or none) and the prompt ids to generate from."""
        keys = [match_key(m) for m in messages]
        tkey = tools_key(tools)
        for chain in reversed(self.chains):
            n = len(chain.keys)
            if tools_key(chain.tools) != tkey or len(keys) <= n or keys[:n] != chain.keys:
                continue
            if chain.ended:
                self.context_full = True
                raise GatewayError(
                    f"This model's maximum context length is {self.max_context} tokens; this conversation "
                    "reached it and has ended (context_length_exceeded).",
                    400,
                    "context_length_exceeded",
                )
            new = messages[n:]
            template_new = [self._template_view(m) for m in new]
            context: list[tuple[list[int], str]] = []
            if chain.cut_turn:  # the last turn stopped without its end-of-turn: close it as context
                context.append((self.codec.eot_ids, "assistant"))
            context.append((self.codec.continuation_ids(template_new, self._native(tools)), new[0]["role"]))
            prompt = chain.trajectory.token_ids + [t for ids, _ in context for t in ids]
            sampling, capped = self._fit(prompt, sampling, chain)
            return Plan(chain, prompt, context, messages, template_new, tools, sampling, capped)
        template = [self._template_view(m) for m in messages]
        prompt = self.codec.prompt_ids(self._for_template(template, tools), self._native(tools))
        sampling, capped = self._fit(prompt, sampling, None)
        return Plan(None, prompt, [], messages, template, tools, sampling, capped)

    def _fit(
        self, prompt: list[int], sampling: SamplingParams, chain: Chain | None
    ) -> tuple[SamplingParams, bool]:
        if self.max_context is None:
            return sampling, False
        room = self.max_context - len(prompt)
        if room < 1:
            if chain is not None:
                chain.ended = "length"
            self.context_full = True
            raise GatewayError(
                f"This model's maximum context length is {self.max_context} tokens. However, your messages "
                f"resulted in {len(prompt)} tokens (context_length_exceeded).",
                400,
                "context_length_exceeded",
            )
        if room < sampling.max_tokens:
            return sampling.model_copy(update={"max_tokens": room}), True
        return sampling, False

    def commit(self, plan: Plan, generation: Generation) -> Turn:
        """Record a successful generation in its chain; build the assistant turn."""
        chain = plan.chain
        if chain is None:
            chain = Chain(len(self.chains), Trajectory(prompt_ids=list(plan.prompt_ids)), plan.tools)
            chain.template_messages = list(plan.template_new)
            self.chains.append(chain)
        else:
            for ids, role in plan.context:
                chain.trajectory.add_context(ids, role=role)
            chain.template_messages.extend(plan.template_new)
        chain.trajectory.add_generation(generation.token_ids, generation.logprobs, generation.finish_reason)
        chain.requests += 1
        stops = set(plan.sampling.stop_token_ids)
        ended = bool(generation.token_ids) and generation.token_ids[-1] in stops
        chain.cut_turn = not ended
        text = self.codec.decode(generation.token_ids[:-1] if ended else generation.token_ids)
        calls: list[ToolCall] = []
        format_error = None
        try:
            parsed = self.parser.parse(text, plan.tools) if plan.tools else None
        except ToolFormatError as exc:
            parsed, format_error = None, str(exc)
        content = text
        if parsed is not None and parsed.calls:
            calls, content = parsed.calls, parsed.thought
            for call in calls:
                self._call_count += 1
                call.id = call.id or f"call_{self.id[:12]}_{self._call_count}"
        finish = "tool_calls" if calls else ("length" if generation.finish_reason == "length" else "stop")
        if generation.finish_reason == "length" and plan.capped:
            chain.ended = "length"
            finish = "length"
        client_msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            client_msg["tool_calls"] = [c.to_openai() for c in calls]
        clean = clean_message(client_msg, len(plan.messages))
        chain.client_messages = [*plan.messages, clean]
        chain.keys = [match_key(m) for m in chain.client_messages]
        if calls and self.native_tools:
            chain.template_messages.append(
                {"role": "assistant", "content": content, "tool_calls": client_msg["tool_calls"]}
            )
        else:
            chain.template_messages.append({"role": "assistant", "content": text})
        self.requests += 1
        return Turn(text, content, calls, format_error, finish, generation, len(plan.prompt_ids), chain.index)

    # -- results -----------------------------------------------------------------------
    def trajectories(self) -> list[Trajectory]:
        """Each chain's trajectory with its drift against a full render of its messages."""
        out = []
        for chain in self.chains:
            traj = chain.trajectory
            rendered = self._for_template(chain.template_messages, chain.tools)
            try:
                traj.drift = self.codec.drift(rendered, traj.token_ids, self._native(chain.tools))
            except UniAgentError:
                traj.drift = 0  # the history cannot be rendered in full: no claim of exactness
            traj.validate()
            out.append(traj)
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "session_id": self.id,
            "state": self.state,
            "chains": len(self.chains),
            "requests": self.requests,
            "reward": self.reward,
            "tokens": [len(c.trajectory) for c in self.chains],
            "ended": [c.ended for c in self.chains],
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
