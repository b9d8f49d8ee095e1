"""Tool prompts for chat templates that have no native tool support (e.g. SmolLM2).

Such templates ignore a `tools=` argument, so the tool list and call format must travel inside
the system message; the parser supplies the text so the format described is the one parsed.
"""

from __future__ import annotations

import copy
from typing import Any

from uniagent.parsers.base import ToolParser


def tools_system_prompt(
    tools: list[dict[str, Any]], parser: ToolParser, base_system: str | None = None
) -> str:
    """`base_system` followed by the parser's tool instructions (the base first: it sets the persona)."""
    instructions = parser.format_instructions(tools)
    if base_system and base_system.strip():
        return f"{base_system.rstrip()}\n\n{instructions}"
    return instructions


def inject_tools(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], parser: ToolParser
) -> list[dict[str, Any]]:
    """Deep copy of `messages` whose first system message carries the tool instructions.

    Without a system message one is inserted first. With no tools the copy is returned unchanged,
    so callers need not special-case tool-less conversations.
    """
    out = copy.deepcopy(messages)
    if not tools:
        return out
    for message in out:
        if message.get("role") == "system":
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts
                message["content"] = [
                    *content,
                    {"type": "text", "text": "\n\n" + parser.format_instructions(tools)},
                ]
            else:
                message["content"] = tools_system_prompt(tools, parser, content)
            return out
    return [{"role": "system", "content": tools_system_prompt(tools, parser)}, *out]
