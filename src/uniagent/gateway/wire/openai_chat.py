"""OpenAI chat completions (`/v1/chat/completions`): what mini-swe-agent, litellm and any OpenAI
client speak. Messages are already in the gateway's own shape; tool calls go out as `tool_calls`
with the session's call ids, logprobs on request, streaming as `chat.completion.chunk`s."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from uniagent.gateway.sessions import GatewayError, Turn, clean_message
from uniagent.gateway.wire.base import Event, Exchange, Wire, WireRequest, checked_tools, flag, sse


def usage(turn: Turn) -> dict[str, int]:
    n = len(turn.generation.token_ids)
    return {
        "prompt_tokens": turn.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": turn.prompt_tokens + n,
    }


class OpenAIChat(Wire):
    name = "openai-chat"
    path = "/v1/chat/completions"

    def parse(self, body: dict[str, Any]) -> WireRequest:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise GatewayError("'messages' must be a non-empty list", code="invalid_messages")
        cleaned = [clean_message(m, i) for i, m in enumerate(messages)]
        if body.get("n") not in (None, 1):
            raise GatewayError("only n=1 is supported", code="unsupported_parameter")
        if body.get("stop"):
            raise GatewayError(
                "'stop' strings are not supported: generations end at the chat template's end-of-turn",
                code="unsupported_parameter",
            )
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise GatewayError("'tools' must be a list of tool schemas")
        checked_tools(tools)
        for i, tool in enumerate(tools or []):
            if not isinstance(tool.get("function"), dict):
                raise GatewayError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        sampling = {k: body.get(k) for k in ("temperature", "top_p", "top_k", "seed", "max_tokens")}
        if body.get("max_completion_tokens") is not None:
            sampling["max_tokens"] = body["max_completion_tokens"]
        options = {
            "logprobs": bool(body.get("logprobs")),
            "include_usage": bool((body.get("stream_options") or {}).get("include_usage")),
        }
        return WireRequest(cleaned, tools or None, sampling, flag(body, "stream"), options)

    def response(self, turn: Turn, ex: Exchange) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.calls:
            message["tool_calls"] = [c.to_openai() for c in turn.calls]
            message["content"] = turn.content or None
        if turn.reasoning:  # where vLLM's reasoning parsers put it
            message["reasoning_content"] = turn.reasoning
        logprobs = None
        if ex.request.options.get("logprobs"):
            gen = turn.generation
            logprobs = {
                "content": [
                    {"token": ex.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(gen.token_ids, gen.logprobs, strict=True)
                ]
            }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": ex.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": turn.finish_reason, "logprobs": logprobs}
            ],
            "usage": usage(turn),
        }

    async def stream(self, events: AsyncIterator[Event], ex: Exchange) -> AsyncIterator[bytes]:
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
            choices = (
                []
                if delta is None
                else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
            )
            body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": ex.model}
            return sse({**body, "choices": choices, **extra})

        sent = ""
        yield chunk({"role": "assistant", "content": ""})
        async for kind, item in events:
            if kind == "text":
                sent += item
                yield chunk({"content": item})
            elif kind == "error":
                yield sse(self.error(item))
                break
            else:
                turn: Turn = item
                if turn.calls:
                    yield chunk(
                        {"tool_calls": [{"index": i, **c.to_openai()} for i, c in enumerate(turn.calls)]}
                    )
                elif turn.content.startswith(sent) and len(turn.content) > len(sent):
                    yield chunk({"content": turn.content[len(sent) :]})
                yield chunk({}, turn.finish_reason)
                if ex.request.options.get("include_usage"):
                    yield chunk(None, usage=usage(turn))
        yield b"data: [DONE]\n\n"
