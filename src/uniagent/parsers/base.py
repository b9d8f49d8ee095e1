"""Tool-call parsing contract shared by every format.

A parser turns the text a model generated into a thought plus tool calls. Anything it cannot
understand becomes a `ToolFormatError` whose message is sent back to the model, so it must say
what was wrong and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class ToolFormatError(Exception):
    """The model's output does not follow the tool-call format; the message goes to the model."""


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
