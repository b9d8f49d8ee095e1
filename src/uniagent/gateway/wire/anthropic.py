"""Anthropic Messages (`/v1/messages`): what Claude Code and the `anthropic` SDK speak.

Requests: `system` as a string or text blocks (Claude Code's per-call billing-header block is
dropped: its hash changes between calls, so keeping it would rewrite the history every turn),
messages of content blocks (`text`; `tool_use` on assistant turns; `tool_result` on user turns,
its content a string or text blocks, `is_error` shown to the model as an "Error: " prefix), the
mid-conversation `role: "system"` messages Claude Code sends, tools with `input_schema`. Keys the
gateway has no use for (`cache_control`, `thinking`, `metadata`, `context_management`,
`output_config`, `tool_choice`) are ignored, so they never make two equal histories differ.
Server tools (a `type` other than `custom`: web search, code execution) run at Anthropic, not in
a sandbox, so they are left out of the tool list.

Answers: a message of `text` and `tool_use` blocks (tool ids are the session's call ids, which
the client sends back as `tool_use_id`), `stop_reason` end_turn / tool_use / max_tokens, usage,
streaming in Anthropic's event format, errors in Anthropic's error shape, and the context error
as Claude Code recognises it ("prompt is too long: N tokens > M maximum").
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from uniagent.gateway.sessions import ContextLengthError, GatewayError, Turn, clean_message
from uniagent.gateway.wire.base import Event, Exchange, Wire, WireRequest, converted_tools, flag, sse, text_of

log = logging.getLogger(__name__)

BILLING_HEADER = "x-anthropic-billing-header"
STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}
STATUS_TYPES = {  # Anthropic names its error types by status
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
TEXT = ("text",)


def _system(system: Any) -> str:
    if isinstance(system, list):
        blocks = [
            b
            for b in system
            if not (isinstance(b, dict) and str(b.get("text", "")).startswith(BILLING_HEADER))
        ]
        return "\n".join(text_of([b], "system", TEXT) for b in blocks)
    return text_of(system, "system", TEXT)


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise GatewayError(f"{where}.tool_use_id must be a string")
    text = text_of(block.get("content"), f"{where}.content", TEXT)
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _messages(message: Any, i: int) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages (a user turn's tool results become tool messages)."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise GatewayError(f"{where} must be an object with 'role' and 'content'")
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant", "system"):
        raise GatewayError(f"{where}.role must be user, assistant or system; got {role!r}")
    if isinstance(content, str) or role == "system":
        return [{"role": role, "content": text_of(content, f"{where}.content", TEXT)}]
    if not isinstance(content, list):
        raise GatewayError(f"{where}.content must be a string or a list of content blocks")
    out: list[dict[str, Any]] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # the gateway's model writes none; a client's would not be its tokens
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise GatewayError(f"{at} needs a name and an input object")
            call = {"name": block["name"], "arguments": block.get("input") or {}}
            calls.append({"id": str(block.get("id") or ""), "type": "function", "function": call})
        elif kind == "tool_result" and role == "user":
            if text:
                out.append({"role": "user", "content": "".join(text)})
                text = []
            out.append(_tool_result(block, at))
        else:
            allowed = "text, tool_use" if role == "assistant" else "text, tool_result"
            raise GatewayError(f"{at} is of type {kind!r}; a {role} message takes {allowed} blocks")
    if role == "assistant":
        out.append(
            {"role": "assistant", "content": "".join(text), **({"tool_calls": calls} if calls else {})}
        )
    elif text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _tool(tool: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic tool as an OpenAI chat schema (none for a server tool)."""
    if not isinstance(tool, dict):
        raise GatewayError(f"{where} must be an object with name, description and input_schema")
    if tool.get("type") not in (None, "custom"):
        log.info("gateway: server tool %r left out (it runs at Anthropic, not here)", tool.get("type"))
        return []
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise GatewayError(f"{where}.input_schema must be a JSON schema object")
    params = {k: v for k, v in schema.items() if k != "$schema"}
    fn = {"name": tool.get("name"), "description": tool.get("description") or "", "parameters": params}
    return [{"type": "function", "function": fn}]


def _blocks(turn: Turn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.content or not turn.calls:
        blocks.append({"type": "text", "text": turn.content})
    for call in turn.calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
    return blocks


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


class AnthropicMessages(Wire):
    name = "anthropic"
    path = "/v1/messages"
    count_path = "/v1/messages/count_tokens"
    clamp_max_tokens = True

    def parse(self, body: dict[str, Any]) -> WireRequest:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise GatewayError("'messages' must be a non-empty list")
        if body.get("stop_sequences"):
            raise GatewayError(
                "'stop_sequences' are not supported: generations end at the chat template's end-of-turn"
            )
        messages = [{"role": "system", "content": _system(body["system"])}] if body.get("system") else []
        for i, message in enumerate(raw):
            messages += _messages(message, i)
        cleaned = [clean_message(m, i) for i, m in enumerate(messages)]
        sampling = {k: body.get(k) for k in ("temperature", "top_p", "top_k", "max_tokens")}
        return WireRequest(cleaned, converted_tools(body.get("tools"), _tool), sampling, flag(body, "stream"))

    def response(self, turn: Turn, ex: Exchange) -> dict[str, Any]:
        return {
            "id": f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "model": ex.model,
            "content": _blocks(turn),
            "stop_reason": STOP_REASONS[turn.finish_reason],
            "stop_sequence": None,
            "usage": _usage(turn.prompt_tokens, len(turn.generation.token_ids)),
        }

    async def stream(self, events: AsyncIterator[Event], ex: Exchange) -> AsyncIterator[bytes]:
        def event(name: str, **data: Any) -> bytes:
            return sse({"type": name, **data}, name)

        message = {
            "id": f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "model": ex.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(ex.prompt_tokens, 0),
        }
        yield event("message_start", message=message)
        index, sent, text_open = 0, "", False
        async for kind, item in events:
            if kind == "text":
                if not text_open:
                    yield event(
                        "content_block_start", index=index, content_block={"type": "text", "text": ""}
                    )
                    text_open = True
                sent += item
                yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": item})
                continue
            if kind == "error":
                yield event("error", error=self.error(item)["error"])
                return
            turn: Turn = item
            rest = turn.content[len(sent) :] if not turn.calls and turn.content.startswith(sent) else ""
            if rest or not (text_open or turn.calls):
                if not text_open:
                    yield event(
                        "content_block_start", index=index, content_block={"type": "text", "text": ""}
                    )
                    text_open = True
                yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": rest})
            if text_open:
                yield event("content_block_stop", index=index)
                index += 1
            for call in turn.calls:
                block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
                yield event("content_block_start", index=index, content_block=block)
                args = json.dumps(call.arguments, ensure_ascii=False)
                yield event(
                    "content_block_delta",
                    index=index,
                    delta={"type": "input_json_delta", "partial_json": args},
                )
                yield event("content_block_stop", index=index)
                index += 1
            delta = {"stop_reason": STOP_REASONS[turn.finish_reason], "stop_sequence": None}
            yield event("message_delta", delta=delta, usage={"output_tokens": len(turn.generation.token_ids)})
            yield event("message_stop")
            return

    def error(self, exc: GatewayError) -> dict[str, Any]:
        kind = STATUS_TYPES.get(exc.status) or ("api_error" if exc.status >= 500 else "invalid_request_error")
        message = str(exc)
        if isinstance(exc, ContextLengthError):
            message = f"prompt is too long: {exc.tokens} tokens > {exc.limit} maximum"
        return {"type": "error", "error": {"type": kind, "message": message}}

    def count(self, tokens: int) -> dict[str, Any]:
        return {"input_tokens": tokens}
