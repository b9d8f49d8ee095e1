"""Tool-call formats: parse model text into calls, render calls, and describe the format to models."""

from uniagent.parsers.base import (
    ParseResult,
    ToolCall,
    ToolFormatError,
    ToolParser,
    ToolSchemaError,
    ToolSpec,
    normalize_tools,
)
from uniagent.parsers.coerce import coerce_arguments, coerce_value
from uniagent.parsers.harmony import HarmonyParser
from uniagent.parsers.hermes import HermesParser
from uniagent.parsers.prompt import inject_tools, tools_system_prompt
from uniagent.parsers.registry import UnknownParserError, available_parsers, get_parser, register_parser
from uniagent.parsers.xml import XMLParser

__all__ = [
    "HarmonyParser",
    "HermesParser",
    "ParseResult",
    "ToolCall",
    "ToolFormatError",
    "ToolParser",
    "ToolSchemaError",
    "ToolSpec",
    "UnknownParserError",
    "XMLParser",
    "available_parsers",
    "coerce_arguments",
    "coerce_value",
    "get_parser",
    "inject_tools",
    "normalize_tools",
    "register_parser",
    "tools_system_prompt",
]
