"""OpenAI Responses (`/v1/responses`): what the Codex CLI speaks (it no longer speaks chat).

Requests: `instructions`, and `input` as a string or items: messages (roles user, assistant,
system and developer — Codex sends its system prompt as developer messages —, content a string
or `input_text` / `output_text` parts, item ids ignored), `function_call` items (joined to the
assistant turn before them, as one chat assistant message with tool calls) and
`function_call_output` items (a string output, or text parts). `reasoning` items are dropped:
the gateway's model writes none. Tools: `function` tools; a Codex `namespace` is flattened into
its inner functions; hosted tools (`web_search` and the like) run at OpenAI, not in a sandbox,
so they are left out. Store, include, prompt_cache_key, reasoning, client_metadata are ignored.

Answers: a response object whose output is a `message` item (if there is text) and one
`function_call` item per call (`call_id` is the session's call id, which the client sends back
with its output), usage, streaming as `response.*` events each with a `sequence_number`, and the
context error as Codex recognises it (`code: context_length_exceeded`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from uniagent.gateway.sessions import GatewayError, Turn, clean_message
from uniagent.gateway.wire.base import Event, Exchange, Wire, WireRequest, converted_tools, flag, sse, text_of

log = logging.getLogger(__name__)

PARTS = ("input_text", "output_text", "text")


def _content(content: Any, where: str) -> str:
    if isinstance(content, list):  # a refusal part carries its text as `refusal`
        content = [
            {"type": "text", "text": p["refusal"]} if p.get("type") == "refusal" else p for p in content
        ]
    return text_of(content, where, PARTS)


def _messages(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise GatewayError("'input' must be a string or a non-empty list of items")
    out: list[dict[str, Any]] = []
    joinable = False  # the last chat message is an assistant turn a function_call belongs to
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise GatewayError(f"{where} must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise GatewayError(f"{where}.role must be user, assistant, system or developer; got {role!r}")
            out.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
            joinable = role == "assistant"
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise GatewayError(f"{where} (function_call) needs name and call_id")
            fn = {"name": item["name"], "arguments": item.get("arguments") or ""}
            call = {"id": item["call_id"], "type": "function", "function": fn}
            if not joinable:
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
            joinable = True
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise GatewayError(f"{where} (function_call_output) needs a call_id")
            text = _content(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
            joinable = False
        elif kind == "reasoning":
            continue
        else:
            raise GatewayError(
                f"{where} is of type {kind!r}; the gateway takes message, function_call, "
                "function_call_output and reasoning items"
            )
    return out


def _function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str):
        raise GatewayError(f"{where} (function) needs a name")
    params = tool.get("parameters")
    fn = {"name": tool["name"], "description": tool.get("description") or "", "parameters": params}
    return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


def _tool(tool: Any, where: str) -> list[dict[str, Any]]:
    """One Responses tool as OpenAI chat schemas (a namespace gives its functions; a hosted tool none)."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind == "function":
        return [_function(tool, where)]
    if kind == "namespace":
        inner = tool.get("tools") or []
        return [
            _function(t, f"{where}.tools[{j}]") for j, t in enumerate(inner) if t.get("type") == "function"
        ]
    log.info("gateway: hosted tool %r left out (it runs at OpenAI, not here)", kind)
    return []


def _usage(turn: Turn) -> dict[str, Any]:
    n = len(turn.generation.token_ids)
    return {
        "input_tokens": turn.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": turn.prompt_tokens + n,
    }


def _message(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status == "completed"
        else []
    )
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _call(call: Any, status: str = "completed") -> dict[str, Any]:
    args = json.dumps(call.arguments, ensure_ascii=False) if status == "completed" else ""
    return {
        "id": f"fc_{call.id}",
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": args,
    }


class OpenAIResponses(Wire):
    name = "openai-responses"
    path = "/v1/responses"
    clamp_max_tokens = True

    def parse(self, body: dict[str, Any]) -> WireRequest:
        for stored in ("previous_response_id", "conversation"):
            if body.get(stored):
                raise GatewayError(
                    f"'{stored}' is not supported: the gateway stores no responses; send the whole "
                    "history in 'input' (Codex does, with store: false)"
                )
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise GatewayError("'instructions' must be a string")
        messages = [{"role": "system", "content": instructions}] if instructions else []
        messages += _messages(body.get("input"))
        cleaned = [clean_message(m, i) for i, m in enumerate(messages)]
        sampling = {"temperature": body.get("temperature"), "top_p": body.get("top_p")}
        sampling["max_tokens"] = body.get("max_output_tokens")
        return WireRequest(cleaned, converted_tools(body.get("tools"), _tool), sampling, flag(body, "stream"))

    def _response(
        self, rid: str, ex: Exchange, status: str, output: list[Any], turn: Turn | None
    ) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "model": ex.model,
            "status": status,
            "output": output,
            "usage": _usage(turn) if turn is not None else None,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": None,
            "metadata": {},
            "parallel_tool_calls": True,
            "temperature": None,
            "top_p": None,
            "tool_choice": "auto",
            "tools": [],
        }

    def response(self, turn: Turn, ex: Exchange) -> dict[str, Any]:
        output = [_message(f"msg_{uuid.uuid4().hex}", turn.content)] if turn.content or not turn.calls else []
        output += [_call(c) for c in turn.calls]
        status = "incomplete" if turn.finish_reason == "length" else "completed"
        return self._response(f"resp_{uuid.uuid4().hex}", ex, status, output, turn)

    async def stream(self, events: AsyncIterator[Event], ex: Exchange) -> AsyncIterator[bytes]:
        rid, mid, seq = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}", 0

        def event(name: str, **data: Any) -> bytes:
            nonlocal seq
            seq += 1
            return sse({"type": name, "sequence_number": seq - 1, **data}, name)

        yield event("response.created", response=self._response(rid, ex, "in_progress", [], None))
        yield event("response.in_progress", response=self._response(rid, ex, "in_progress", [], None))
        sent, opened = "", False
        part = {"item_id": mid, "output_index": 0, "content_index": 0}

        def open_text() -> list[bytes]:
            return [
                event("response.output_item.added", output_index=0, item=_message(mid, "", "in_progress")),
                event(
                    "response.content_part.added",
                    **part,
                    part={"type": "output_text", "text": "", "annotations": []},
                ),
            ]

        async for kind, item in events:
            if kind == "text":
                if not opened:
                    for b in open_text():
                        yield b
                    opened = True
                sent += item
                yield event("response.output_text.delta", **part, delta=item, logprobs=[])
                continue
            if kind == "error":
                failed = self._response(rid, ex, "failed", [], None)
                failed["error"] = {"code": item.code or "server_error", "message": str(item)}
                yield event("response.failed", response=failed)
                return
            turn: Turn = item
            output: list[dict[str, Any]] = []
            rest = turn.content[len(sent) :] if not turn.calls and turn.content.startswith(sent) else ""
            if opened or not turn.calls:
                if not opened:
                    for b in open_text():
                        yield b
                if rest:
                    sent += rest
                    yield event("response.output_text.delta", **part, delta=rest, logprobs=[])
                yield event("response.output_text.done", **part, text=sent, logprobs=[])
                done_part = {"type": "output_text", "text": sent, "annotations": []}
                yield event("response.content_part.done", **part, part=done_part)
                output.append(_message(mid, sent))
                yield event("response.output_item.done", output_index=0, item=output[-1])
            for call in turn.calls:
                index, done = len(output), _call(call)
                yield event("response.output_item.added", output_index=index, item=_call(call, "in_progress"))
                ids = {"item_id": done["id"], "output_index": index}
                yield event("response.function_call_arguments.delta", **ids, delta=done["arguments"])
                yield event("response.function_call_arguments.done", **ids, arguments=done["arguments"])
                output.append(done)
                yield event("response.output_item.done", output_index=index, item=done)
            status = "incomplete" if turn.finish_reason == "length" else "completed"
            yield event(f"response.{status}", response=self._response(rid, ex, status, output, turn))
            return

    def error(self, exc: GatewayError) -> dict[str, Any]:
        body = super().error(exc)
        if exc.code == "context_length_exceeded":
            body["error"]["param"] = "input"
        return body
