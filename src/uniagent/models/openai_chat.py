"""`OpenAIChatModel`: a `ChatModel` over any OpenAI-compatible `/v1/chat/completions` endpoint.

Such endpoints return text, not token ids, so episodes run through this model are evaluation only
(`trainable = False`). Retries are our own loop rather than the SDK's so that the policy (which
errors, how many times, how long to wait) is explicit, bounded and testable. The API key is used only
to build the client: it never appears in `repr`, logs or error messages (servers that echo it back in
an error body are redacted too).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from typing import TYPE_CHECKING, Any

import openai

from uniagent.errors import EngineError
from uniagent.models.base import AssistantTurn, FinishReason
from uniagent.models.registry import EngineKind
from uniagent.parsers.base import ToolCall, ToolFormatError, ToolParser, decode_arguments

if TYPE_CHECKING:
    from uniagent.models.config import ModelConfig

log = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_FINISH: dict[str | None, FinishReason] = {
    "stop": "stop",
    "tool_calls": "stop",
    "function_call": "stop",
    None: "stop",
    "length": "length",
    "content_filter": "abort",
}
_NO_KEY = "EMPTY"  # local endpoints (vLLM, our gateway) accept any key; the SDK insists on one


class OpenAIChatModel:
    """Message-level model for text-only endpoints.

    Tools travel natively (`tools=` in the request, `tool_calls` in the reply) unless a `parser` is
    given: then the tool list is described in the system prompt and calls are parsed from the text,
    for endpoints whose server has no tool-call support.
    """

    trainable = False

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        timeout: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
        parser: ToolParser | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if max_retries < 0:
            raise EngineError(f"max_retries must be >= 0, got {max_retries}")
        key = api_key or os.environ.get(api_key_env)
        if not key:
            if base_url is None:
                raise EngineError(
                    f"no API key for the OpenAI endpoint: pass api_key= or set the {api_key_env} variable"
                )
            key = _NO_KEY
        self.model = model
        self.base_url = base_url
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.parser = parser
        self.extra_body = dict(extra_body or {})
        self._secret = key
        self._client = openai.AsyncOpenAI(api_key=key, base_url=base_url, timeout=timeout, max_retries=0)
        self._endpoint = str(self._client.base_url).rstrip("/")

    # A text-level model keeps no token record: no context count, no segments.
    context_tokens = 0

    @property
    def segments(self) -> list[Any]:
        return []

    def begin_segment(self, reason: str) -> None:
        """Nothing to do: the endpoint renders the whole history on every call."""

    def finish(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[Any]:
        return []

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        return 0  # no tokenizer here: token-sized context policies never trigger

    def session_spec(self) -> None:
        """No token engine behind it, so nothing a gateway session could sample with."""
        return None

    def __repr__(self) -> str:
        return f"OpenAIChatModel(model={self.model!r}, base_url={self._endpoint!r}, api_key='***')"

    async def aclose(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def query(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
    ) -> AssistantTurn:
        """One chat completion, retried on rate limits, server errors and dropped connections.
        `max_tokens` caps this call only (the loop's per-turn budget)."""
        request = self._request(messages, tools)
        if max_tokens is not None:
            request["max_tokens"] = min(max_tokens, self.max_tokens or max_tokens)
        started = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            try:
                completion = await self._client.chat.completions.create(**request)
                break
            except openai.APIError as exc:
                retryable, reason = self._classify(exc)
                if not retryable or attempt > self.max_retries:
                    tried = f" after {attempt} attempts" if attempt > 1 else ""
                    raise EngineError(
                        f"chat endpoint {self._endpoint} (model {self.model!r}){tried}: {reason}"
                    ) from None
                headers = exc.response.headers if isinstance(exc, openai.APIStatusError) else {}
                delay = self._backoff(attempt, headers.get("retry-after"))
                log.warning(
                    "chat endpoint %s: attempt %d failed (%s); retrying in %.2fs",
                    self._endpoint,
                    attempt,
                    reason,
                    delay,
                )
                await asyncio.sleep(delay)
        turn = self._turn(completion, tools)
        turn.metrics.update({"latency_s": time.perf_counter() - started, "attempts": float(attempt)})
        return turn

    async def check(self, timeout_s: float = 30.0) -> str:
        """A run's health check: the endpoint answers, accepts the key and serves `model`.

        `GET /models` costs no tokens; when it does not list the model (or the endpoint has no such
        route) one 1-token completion decides. No retries: a run's first request should not wait
        minutes to say the endpoint is down. Raises `EngineError` naming the endpoint.
        """
        timeout = min(timeout_s, self.timeout)
        listed: list[str] = []
        try:
            page = await self._client.models.list(timeout=timeout)
            listed = [m.id for m in page.data]
        except openai.APIStatusError as exc:
            if exc.status_code not in (404, 405, 501):  # only "no such route" falls through
                raise self._check_error(exc) from None
        except openai.APIError as exc:
            raise self._check_error(exc) from None
        if self.model in listed or (not self.model and listed):
            return (
                f"{self._endpoint} serves {self.model!r}"
                if self.model
                else f"{self._endpoint} serves {listed[:5]}"
            )
        try:
            ping = [{"role": "user", "content": "ping"}]
            await self._client.chat.completions.create(
                model=self.model, messages=ping, max_tokens=1, timeout=timeout
            )
        except openai.APIError as exc:
            served = f" (it lists: {', '.join(listed[:8])})" if listed else ""
            raise self._check_error(exc, served) from None
        return f"{self._endpoint} answered a 1-token completion for {self.model!r}"

    def _check_error(self, exc: openai.APIError, extra: str = "") -> EngineError:
        _, reason = self._classify(exc)
        return EngineError(f"chat endpoint {self._endpoint} (model {self.model!r}): {reason}{extra}")

    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        request: dict[str, Any] = {"model": self.model, "messages": messages, "timeout": self.timeout}
        if tools and self.parser is not None:
            from uniagent.parsers.prompt import inject_tools

            request["messages"] = inject_tools(messages, tools, self.parser)
        elif tools:
            request["tools"] = tools
        for name in ("temperature", "top_p", "max_tokens"):
            value = getattr(self, name)
            if value is not None:
                request[name] = value
        if self.extra_body:
            request["extra_body"] = self.extra_body
        return request

    def _classify(self, exc: openai.APIError) -> tuple[bool, str]:
        """Whether an error is worth retrying, and a message for the user with secrets removed."""
        if isinstance(exc, openai.APITimeoutError):
            return True, f"request timed out after {self.timeout}s"
        if isinstance(exc, openai.APIConnectionError):
            return True, f"cannot connect ({self._redact(str(exc))})"
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = self._redact(exc.message)
            hint = " (check the API key)" if status in (401, 403) else ""
            return status in _RETRYABLE_STATUS or status >= 500, f"HTTP {status}{hint}: {detail}"
        return False, self._redact(str(exc))

    def _backoff(self, attempt: int, retry_after: str | None = None) -> float:
        """Exponential with jitter (spreads the retries of many episodes), or the server's Retry-After."""
        if retry_after is not None:
            try:
                return min(self.backoff_max_s, max(0.0, float(retry_after)))
            except ValueError:
                pass  # an HTTP date: rare enough to fall back to our own schedule
        ceiling = min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
        return random.uniform(ceiling / 2, ceiling)

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret and self._secret != _NO_KEY else text

    def _turn(self, completion: Any, tools: list[dict[str, Any]] | None) -> AssistantTurn:
        if not completion.choices:
            raise EngineError(f"chat endpoint {self._endpoint} returned no choices for model {self.model!r}")
        choice = completion.choices[0]
        text = choice.message.content or ""
        usage = completion.usage
        turn = AssistantTurn(
            text=text,
            thought=text,
            tool_calls=[],
            message={"role": "assistant", "content": text},
            finish_reason=_FINISH.get(choice.finish_reason, "stop"),
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
        )
        if self.parser is not None:
            self._parse_text(turn, tools)
        elif choice.message.tool_calls:
            self._native_calls(turn, choice.message.tool_calls)
        return turn

    def _parse_text(self, turn: AssistantTurn, tools: list[dict[str, Any]] | None) -> None:
        assert self.parser is not None
        try:
            parsed = self.parser.parse(turn.text, tools)
        except ToolFormatError as exc:
            turn.format_error = str(exc)
            return
        turn.thought = parsed.thought
        turn.tool_calls = parsed.calls

    def _native_calls(self, turn: AssistantTurn, raw_calls: list[Any]) -> None:
        """Keep the calls exactly as returned in `message` (history); decode arguments for `tool_calls`."""
        wire, calls, problems = [], [], []
        for raw in raw_calls:
            function = getattr(raw, "function", None)
            if getattr(raw, "type", "function") != "function" or function is None:
                problems.append(
                    f"call {raw.id!r} is of type {getattr(raw, 'type', '?')!r}, only functions are supported"
                )
                continue
            wire.append(
                {
                    "id": raw.id,
                    "type": "function",
                    "function": {"name": function.name, "arguments": function.arguments},
                }
            )
            try:
                arguments = decode_arguments(function.arguments)
            except ValueError as exc:
                detail = getattr(exc, "msg", exc)
                problems.append(f"arguments of call to {function.name!r} are not valid JSON ({detail})")
                continue
            if not isinstance(arguments, dict):
                problems.append(f"arguments of call to {function.name!r} must be a JSON object")
                continue
            calls.append(ToolCall(name=function.name, arguments=arguments, id=raw.id))
        turn.message["tool_calls"] = wire
        if problems:
            turn.format_error = "; ".join(problems)
        else:
            turn.tool_calls = calls


async def doctor_check(
    base_url: str, api_key_env: str = "OPENAI_API_KEY"
) -> list[tuple[str, bool | None, str]]:
    """`uniagent doctor --model openai:URL`: the same check a run's preflight makes
    (`OpenAIChatModel.check`), within 15 s and without retries."""
    name = f"engine openai:{base_url}"
    async with OpenAIChatModel("", base_url=base_url, api_key_env=api_key_env, timeout=15.0) as model:
        try:
            detail = await model.check(timeout_s=15.0)
        except EngineError as exc:
            return [(name, False, str(exc)[:200])]
    key = "" if os.environ.get(api_key_env) else f"; {api_key_env} not set"
    return [(name, True, detail + key)]


class OpenAIModels:
    """`openai:URL` built from a model config: one `OpenAIChatModel` per episode (text level)."""

    def __init__(self, base_url: str, config: ModelConfig) -> None:
        self.base_url = base_url
        self.config = config

    def new_model(self) -> OpenAIChatModel:
        from uniagent.parsers import get_parser

        cfg = self.config
        return OpenAIChatModel(
            cfg.name or "default",
            base_url=self.base_url,
            api_key_env=cfg.api_key_env,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            timeout=cfg.timeout_s,
            max_retries=cfg.max_retries,
            parser=get_parser(cfg.parser) if cfg.tool_format == "text" else None,
        )

    async def check(self) -> str:
        """The run's preflight: the endpoint answers one request (`OpenAIChatModel.check`)."""
        async with self.new_model() as model:
            return await model.check()


async def _build(arg: str, config: ModelConfig) -> OpenAIModels:
    return OpenAIModels(arg, config)


async def _doctor(arg: str, config: ModelConfig, quick: bool) -> list[tuple[str, bool | None, str]]:
    return await doctor_check(arg, config.api_key_env)


# `openai:URL`: any OpenAI-compatible chat endpoint, text level (episodes are not trainable).
KIND = EngineKind(name="openai", usage="openai:URL", token_level=False, build=_build, doctor=_doctor)
