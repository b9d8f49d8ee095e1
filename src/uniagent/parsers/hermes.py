"""Hermes / Qwen2.5 style calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

The JSON is read with a streaming decoder instead of cutting at the next close tag, so argument
strings that themselves contain `</tool_call>` (a model writing about this format) still parse,
and the decoder's end position tells exactly what follows the object.
"""

from __future__ import annotations

import json
from typing import Any

from uniagent.parsers.base import (
    ParseResult,
    Specs,
    ToolCall,
    ToolFormatError,
    decode_arguments,
    normalize_tools,
)
from uniagent.parsers.coerce import call_format_prompt, checked_call, tool_error
from uniagent.parsers.text import skip_ws as _skip_ws
from uniagent.parsers.text import snippet as _snippet

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_DECODER = json.JSONDecoder()


class HermesParser:
    """JSON-in-tags format used by Hermes, Qwen2.5/Qwen3 and most open chat templates."""

    name = "hermes"
    markers = (OPEN,)  # what opens a call, for streaming fronts (parsers.stream)

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        """Thought before the first `<tool_call>`, then every call; text after the calls is dropped."""
        specs = normalize_tools(tools)
        start = text.find(OPEN)
        if start < 0:
            return ParseResult(thought=text.strip())
        result = ParseResult(thought=text[:start].strip())
        while start >= 0:
            where = f"tool call {len(result.calls) + 1}"
            call, pos = self._parse_one(text, start + len(OPEN), specs, where)
            result.calls.append(call)
            start = text.find(OPEN, pos)
        return result

    def _parse_one(self, text: str, pos: int, specs: Specs, where: str) -> tuple[ToolCall, int]:
        """Decode one call body at `pos`; return the call and where scanning continues."""
        pos = _skip_ws(text, pos)
        try:
            obj, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            close = text.find(CLOSE, pos)
            body = text[pos : close if close >= 0 else len(text)]
            problem = f"{where} is not valid JSON ({exc.msg} at char {exc.pos - pos}): {_snippet(body)}."
            if close < 0:
                problem += f" The call is also missing its closing {CLOSE}."
            raise self._error(problem, specs) from None
        except (ValueError, RecursionError):  # digit-count limit, absurd nesting
            raise self._error(
                f"{where} contains JSON that is too large or too deeply nested.", specs
            ) from None
        end = _skip_ws(text, end)
        if text.startswith(CLOSE, end):
            end += len(CLOSE)
        else:
            close, reopen = text.find(CLOSE, end), text.find(OPEN, end)
            # No close tag before the next call (or at all): the model dropped it; the JSON is complete,
            # so nothing is ambiguous. Text that sits before a close tag, however, is inside the call.
            if close >= 0 and (reopen < 0 or close < reopen):
                extra = text[end:close]
                raise self._error(
                    f"{where} has unexpected text {_snippet(extra)} after its JSON object; "
                    f"write exactly one JSON object between {OPEN} and {CLOSE}.",
                    specs,
                )
        return self._to_call(obj, specs, where), end

    def _to_call(self, obj: Any, specs: Specs, where: str) -> ToolCall:
        if not isinstance(obj, dict):
            raise self._error(f'{where} must be a JSON object with "name" and "arguments".', specs)
        name = obj.get("name")
        name = name.strip() if isinstance(name, str) else ""
        if not name:
            raise self._error(f'{where} has no "name" (a non-empty string naming the tool).', specs)
        # "parameters" is what Llama-style prompts ask for; accepting it costs nothing and saves a retry.
        try:  # a string is OpenAI-style double encoding
            args = decode_arguments(obj["arguments"] if "arguments" in obj else obj.get("parameters"))
        except ValueError:
            args = ""  # reported below: not an object
        if not isinstance(args, dict):
            raise self._error(f'{where} to {name!r}: "arguments" must be a JSON object.', specs, name)
        return checked_call(name, args, specs, self.render_call, where)

    def _error(self, problem: str, specs: Specs, tool: str | None = None) -> ToolFormatError:
        return tool_error(problem, specs, self.render_call, tool)

    def render_call(self, call: ToolCall) -> str:
        """The text Qwen-family templates emit, so rendered history matches what models saw in training."""
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{OPEN}\n{body}\n{CLOSE}"

    def format_instructions(self, tools: list[dict[str, Any]]) -> str:
        """Self-contained tool prompt for templates without native tool support."""
        how = (
            "To call a tool, write a JSON object with the tool name and its arguments between "
            f"{OPEN} and {CLOSE} tags, exactly like this:\n"
            f'{OPEN}\n{{"name": <tool-name>, "arguments": <arguments-json-object>}}\n{CLOSE}\n\n'
        )
        return call_format_prompt(tools, self.render_call, how, OPEN)
