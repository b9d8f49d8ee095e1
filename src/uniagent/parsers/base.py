"""Tool-call parsing contract shared by every format.

A parser turns the text a model generated into a thought plus tool calls. Anything it cannot
understand becomes a `ToolFormatError` whose message is sent back to the model, so it must say
what was wrong and what is allowed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from uniagent.errors import UniAgentError


class ToolFormatError(Exception):
    """The model's output does not follow the tool-call format; the message goes to the model."""


class ToolSchemaError(UniAgentError):
    """A tool schema handed to a parser is unusable; this is the caller's mistake, not the model's."""


def call_id(n: int) -> str:
    """The id of the `n`-th tool call of a conversation (from 1) when the model wrote none: one
    format for the ReAct loop's `TokenChatModel` and the gateway's sessions. Unique within the
    conversation, which is all an OpenAI client needs (it pairs each tool result with its call)."""
    return f"call_{n}"


def decode_arguments(raw: Any) -> Any:
    """A call's `arguments` as OpenAI-style replies carry them: a JSON string, decoded; a blank
    string or none at all means no arguments (`{}`); any other value is returned as given (the
    caller checks it is an object). Raises `ValueError` for a string that is not JSON, or JSON
    nested too deeply to read. One reading for the parsers and the OpenAI client's native calls."""
    if raw is None:
        return {}
    if not isinstance(raw, str):
        return raw
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None


@dataclass
class ToolCall:
    """One parsed call: tool name and its (schema-coerced) arguments."""

    name: str
    arguments: dict[str, Any]
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        """OpenAI chat `tool_calls` entry (arguments as a JSON string)."""
        import json

        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


@dataclass
class ParseResult:
    """Text before the first call (the thought) and the calls in order."""

    thought: str
    calls: list[ToolCall] = field(default_factory=list)


class ToolParser(Protocol):
    """A tool-call format: parse model text, and describe the format to the model."""

    name: str

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        """Parse `text`; raise `ToolFormatError` on malformed calls. `tools` are OpenAI tool schemas."""
        ...

    def format_instructions(self, tools: list[dict[str, Any]]) -> str:
        """System-prompt text that lists the tools and shows this call format."""
        ...

    def render_call(self, call: ToolCall) -> str:
        """Text of one call in this format (as the model should write it)."""
        ...


CallRenderer = Callable[[ToolCall], str]


@dataclass(frozen=True)
class ToolSpec:
    """One tool, normalized from either OpenAI shape so parsers never branch on the input form."""

    name: str
    description: str
    parameters: dict[str, Any]

    @property
    def properties(self) -> dict[str, Any]:
        props = self.parameters.get("properties")
        return props if isinstance(props, dict) else {}

    @property
    def required(self) -> list[str]:
        req = self.parameters.get("required")
        return [r for r in req if isinstance(r, str)] if isinstance(req, list) else []

    @property
    def accepts_extra(self) -> bool:
        """Whether parameters outside `properties` are allowed.

        OpenAI-style schemas rarely say `additionalProperties`, yet a parameter the tool does not
        declare is almost always a model mistake worth reporting, so only an explicit opt-in (or a
        schema with no `properties` at all, i.e. free-form) lets unknown names through.
        """
        extra = self.parameters.get("additionalProperties")
        return "properties" not in self.parameters or bool(extra)

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


Specs = dict[str, ToolSpec] | None
"""Normalized tools by name; `None` means no tool list was given, so calls are not validated."""


def normalize_tools(tools: list[dict[str, Any]] | None) -> dict[str, ToolSpec] | None:
    """Name -> spec, in the given order; `None` stays `None` (meaning: do not validate calls).

    An empty list is kept as "no tools allowed", so a call in a tool-less conversation is reported
    to the model rather than passed on.
    """
    if tools is None:
        return None
    specs: dict[str, ToolSpec] = {}
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ToolSchemaError(f"tool #{i} must be a dict (OpenAI tool schema), got {type(tool).__name__}")
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ToolSchemaError(
                f"tool #{i} has no name; expected {{'type': 'function', 'function': {{'name': ..., "
                f"'description': ..., 'parameters': {{...}}}}}}"
            )
        if name in specs:
            raise ToolSchemaError(f"tool name {name!r} is given twice; tool names must be unique")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise ToolSchemaError(f"tool {name!r}: 'parameters' must be a JSON schema object (a dict)")
        description = fn.get("description")
        specs[name] = ToolSpec(name, description if isinstance(description, str) else "", params)
    return specs


def _type_label(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "any"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    if isinstance(kind, str):
        return kind
    if isinstance(schema.get("enum"), list):
        return "one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    return "any"


def describe_tools(specs: Specs) -> str:
    """Compact tool list for error messages: enough for the model to fix its call, short enough to repeat."""
    if specs is None:
        return "No tool list was given; use the tool names and parameters from the system prompt."
    if not specs:
        return "No tools are available in this conversation; answer without a tool call."
    lines = ["Allowed tools:"]
    for spec in specs.values():
        required = set(spec.required)
        params = [
            f"{p} ({_type_label(s)}{', required' if p in required else ''})"
            for p, s in spec.properties.items()
        ]
        params += [f"{p} (required)" for p in spec.required if p not in spec.properties]
        lines.append(f"- {spec.name}: " + (", ".join(params) if params else "no parameters"))
    return "\n".join(lines)


def format_error(problem: str, specs: Specs, example: str | None) -> ToolFormatError:
    """Build the error the model sees: what went wrong, what is allowed, and one call that would work."""
    parts = [f"Invalid tool call: {problem}", describe_tools(specs)]
    if example is not None:
        parts.append(f"Example of a correct call:\n{example}")
    return ToolFormatError("\n\n".join(parts))
