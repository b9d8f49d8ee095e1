"""Qwen3-Coder style calls: `<function=NAME>` with one `<parameter=P>` block of raw text per argument.

Values are raw text, not JSON, so code with quotes and newlines needs no escaping; the price is
that a value cannot contain `</parameter>`, and that types come only from the tool schema.
"""

from __future__ import annotations

import json
import re
from typing import Any

from uniagent.parsers.base import ParseResult, Specs, ToolCall, ToolFormatError, normalize_tools
from uniagent.parsers.coerce import call_format_prompt, checked_call, tool_error
from uniagent.parsers.text import skip_ws as _skip_ws
from uniagent.parsers.text import snippet as _snippet

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNC, FUNC_CLOSE = "<function=", "</function>"
PARAM, PARAM_CLOSE = "<parameter=", "</parameter>"
_TAG_NAME = re.compile(r"([^>\n]*)>")
# Where a parameter whose close tag never comes is taken to end: the next structural tag.
_UNCLOSED_PARAM_END = (PARAM, FUNC_CLOSE, CLOSE, FUNC, OPEN)


def _raw_value(raw: str) -> str:
    """Drop exactly the newline after the open tag and the one before the close tag, as Qwen3-Coder does."""
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    return raw


def _render_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _next_call(text: str, pos: int) -> int:
    """Start of the next call: a `<tool_call>`, or a bare `<function=` the model wrote without one."""
    found = [i for i in (text.find(OPEN, pos), text.find(FUNC, pos)) if i >= 0]
    return min(found) if found else -1


class XMLParser:
    """Tag-per-parameter format of Qwen3-Coder; also registered as `qwen3_coder`."""

    markers = (OPEN, FUNC)  # what opens a call, for streaming fronts (parsers.stream)

    def __init__(self, name: str = "xml") -> None:
        self.name = name

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        """Thought before the first call, then every `<function=...>` in order; text after them is dropped."""
        specs = normalize_tools(tools)
        start = _next_call(text, 0)
        if start < 0:
            return ParseResult(thought=text.strip())
        result = ParseResult(thought=text[:start].strip())
        while start >= 0:
            if text.startswith(OPEN, start):
                pos = self._parse_block(text, start + len(OPEN), specs, result)
            else:
                pos = self._parse_function(text, start, specs, result)
            start = _next_call(text, pos)
        return result

    def _parse_block(self, text: str, pos: int, specs: Specs, result: ParseResult) -> int:
        """Functions inside one `<tool_call>`; a missing close tag is fine when nothing else follows."""
        found = len(result.calls)
        while True:
            pos = _skip_ws(text, pos)
            if pos >= len(text) or text.startswith(OPEN, pos):
                break
            if text.startswith(CLOSE, pos):
                pos += len(CLOSE)
                break
            if not text.startswith(FUNC, pos):
                where = f"tool call {len(result.calls) + 1}"
                raise self._error(
                    f"{where}: expected {FUNC}NAME> after {OPEN}, found {_snippet(text[pos:])}.", specs
                )
            pos = self._parse_function(text, pos, specs, result)
        if len(result.calls) == found:
            raise self._error(f"tool call {found + 1}: {OPEN} contains no {FUNC}NAME> block.", specs)
        return pos

    def _parse_function(self, text: str, pos: int, specs: Specs, result: ParseResult) -> int:
        where = f"tool call {len(result.calls) + 1}"
        name, pos = self._tag_name(text, pos + len(FUNC), FUNC, specs, where)
        args: dict[str, Any] = {}
        while True:
            pos = _skip_ws(text, pos)
            if text.startswith(FUNC_CLOSE, pos):
                pos += len(FUNC_CLOSE)
                break
            # A missing </function> before the end, </tool_call> or the next call is unambiguous.
            if pos >= len(text) or any(text.startswith(t, pos) for t in (CLOSE, OPEN, FUNC)):
                break
            if not text.startswith(PARAM, pos):
                raise self._error(
                    f"{where} to {name!r}: expected {PARAM}NAME> or {FUNC_CLOSE}, "
                    f"found {_snippet(text[pos:])}.",
                    specs,
                    name,
                )
            pname, pos = self._tag_name(text, pos + len(PARAM), PARAM, specs, where, name)
            if pname in args:
                raise self._error(f"{where} to {name!r}: parameter {pname!r} is given twice.", specs, name)
            raw, pos = self._param_text(text, pos)
            args[pname] = _raw_value(raw)
        result.calls.append(checked_call(name, args, specs, self.render_call, where))
        return pos

    def _tag_name(
        self, text: str, pos: int, tag: str, specs: Specs, where: str, tool: str | None = None
    ) -> tuple[str, int]:
        match = _TAG_NAME.match(text, pos)
        name = match.group(1).strip() if match else ""
        if not match or not name:
            raise self._error(
                f"{where}: malformed tag {_snippet(tag + text[pos : pos + 40])}; "
                f"write {tag}NAME> on its own line.",
                specs,
                tool,
            )
        return name, match.end()

    @staticmethod
    def _param_text(text: str, pos: int) -> tuple[str, int]:
        """Raw value and the position after it.

        The first `</parameter>` always closes the value, even if the value looked like it held more
        tags. Only when no close tag follows at all (cut generation) is the next structural tag
        taken as the end, because then no later parameter can claim that close tag.
        """
        close = text.find(PARAM_CLOSE, pos)
        if close >= 0:
            return text[pos:close], close + len(PARAM_CLOSE)
        ends = [i for i in (text.find(t, pos) for t in _UNCLOSED_PARAM_END) if i >= 0]
        end = min(ends) if ends else len(text)
        return text[pos:end], end

    def _error(self, problem: str, specs: Specs, tool: str | None = None) -> ToolFormatError:
        return tool_error(problem, specs, self.render_call, tool)

    def render_call(self, call: ToolCall) -> str:
        """Qwen3-Coder's own layout; non-string values as JSON, which the schema coerces back."""
        lines = [OPEN, f"{FUNC}{call.name}>"]
        for key, value in call.arguments.items():
            lines += [f"{PARAM}{key}>", _render_value(value), PARAM_CLOSE]
        lines += [FUNC_CLOSE, CLOSE]
        return "\n".join(lines)

    def format_instructions(self, tools: list[dict[str, Any]]) -> str:
        """Self-contained tool prompt for templates without native tool support."""
        how = (
            "To call a tool, write exactly this format, each tag on its own line:\n"
            f"{OPEN}\n{FUNC}tool_name>\n{PARAM}parameter_name>\nvalue\n{PARAM_CLOSE}\n"
            f"{PARAM}other_parameter>\nA value can be plain text\nspanning several lines.\n{PARAM_CLOSE}\n"
            f"{FUNC_CLOSE}\n{CLOSE}\n\n"
        )
        values = "Write values as plain text, without quotes or escaping; write arrays and objects as JSON."
        return call_format_prompt(tools, self.render_call, how, OPEN, (values,))


def qwen3_coder() -> XMLParser:
    """Qwen3-Coder's tool-call format: the XML one under the name its chat template uses."""
    return XMLParser(name="qwen3_coder")
