"""gpt-oss (harmony) calls: `to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>`.

gpt-oss does not write calls inside its answer: a call is a message of its own, addressed to the
tool in the message header (`to=functions.NAME`, before or after `<|channel|>commentary`, with an
optional `<|constrain|>json`), whose body is the JSON arguments; `<|call|>` ends the turn (the
codec stops on it). Reasoning before a call sits in an analysis message; that text is the thought,
so the native template message `{content: thought, tool_calls}` renders back to the tokens the
model wrote (gpt-oss's template renders such content as the analysis before the call).
"""

from __future__ import annotations

import json
import re
from typing import Any

from uniagent.parsers.base import ParseResult, Specs, ToolCall, ToolFormatError, normalize_tools
from uniagent.parsers.coerce import call_format_prompt, checked_call, tool_error
from uniagent.parsers.text import skip_ws
from uniagent.parsers.text import snippet as _snippet

RECIPIENT = "to=functions."
_NAME = re.compile(r"to=functions\.([^\s<]+)")
_MESSAGE = "<|message|>"
_START = "<|start|>"
_BODY = re.compile(r"<\|channel\|>[^<]*<\|message\|>(.*?)(?:<\|end\|>|$)", re.S)
_DECODER = json.JSONDecoder()


class HarmonyParser:
    """gpt-oss's own call format (its chat template renders `tool_calls` in it)."""

    name = "harmony"
    markers = (RECIPIENT,)  # what opens a call, for streaming fronts (parsers.stream)

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        """The reasoning before the first call as the thought, then every call in order."""
        specs = normalize_tools(tools)
        found = _NAME.search(text)
        if found is None:
            return ParseResult(thought=_plain(text))
        result = ParseResult(thought=_plain(text[: _message_start(text, found.start())]))
        while found is not None:
            where = f"tool call {len(result.calls) + 1}"
            call, pos = self._parse_one(text, found, specs, where)
            result.calls.append(call)
            found = _NAME.search(text, pos)
        return result

    def _parse_one(self, text: str, found: re.Match[str], specs: Specs, where: str) -> tuple[ToolCall, int]:
        name = found.group(1)
        body_at = text.find(_MESSAGE, found.end())
        if body_at < 0:
            raise self._error(f"{where} to {name!r} has no {_MESSAGE} before its arguments.", specs, name)
        pos = skip_ws(text, body_at + len(_MESSAGE))
        try:
            args, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            problem = (
                f"{where} to {name!r}: the arguments are not valid JSON ({exc.msg}): {_snippet(text[pos:])}."
            )
            raise self._error(problem, specs, name) from None
        except (ValueError, RecursionError):
            raise self._error(
                f"{where} contains JSON that is too large or too deeply nested.", specs
            ) from None
        if not isinstance(args, dict):
            raise self._error(f"{where} to {name!r}: the arguments must be a JSON object.", specs, name)
        return checked_call(name, args, specs, self.render_call, where), end

    def _error(self, problem: str, specs: Specs, tool: str | None = None) -> ToolFormatError:
        return tool_error(problem, specs, self.render_call, tool)

    def render_call(self, call: ToolCall) -> str:
        """One call as gpt-oss's template writes it after `<|start|>assistant`."""
        body = json.dumps(call.arguments, ensure_ascii=False)
        return f" {RECIPIENT}{call.name}<|channel|>commentary json{_MESSAGE}{body}<|call|>"

    def format_instructions(self, tools: list[dict[str, Any]]) -> str:
        """Tool prompt for a template that does not list tools itself (gpt-oss's own does)."""
        how = (
            "To call a tool, address a commentary message to it and write its arguments as one JSON "
            f"object, exactly like this:\n{RECIPIENT}<tool-name><|channel|>commentary json"
            f"{_MESSAGE}<arguments-json-object><|call|>\n\n"
        )
        return call_format_prompt(tools, self.render_call, how, RECIPIENT)


def _message_start(text: str, recipient: int) -> int:
    """Where the message holding the recipient at `recipient` begins: its `<|start|>`, else the
    `<|channel|>` of its own header (`<|channel|>commentary to=functions.NAME`), else the recipient."""
    for opener in (_START, "<|channel|>"):
        at = text.rfind(opener, 0, recipient)
        if at >= 0 and _MESSAGE not in text[at:recipient]:
            return at
    return recipient


def _plain(text: str) -> str:
    """The text of harmony messages (analysis, commentary) without their framing tokens."""
    bodies = _BODY.findall(text)
    return "\n".join(b.strip() for b in bodies).strip() if bodies else text.strip()
