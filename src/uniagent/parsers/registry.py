"""Parsers by name, so configs and the CLI can pick a tool-call format with a string.

`PARSERS` is a `uniagent.registry.Registry` like every extension table: a format is one module
with its `ToolParser` class (or a factory) plus one line below; a plugin may `register_parser` a
factory at run time. Names ignore case and `-`/`_`.
"""

from __future__ import annotations

from collections.abc import Callable

from uniagent.errors import UniAgentError
from uniagent.parsers.base import ToolParser
from uniagent.registry import Entry, Registry

ParserFactory = Callable[[], ToolParser]


class UnknownParserError(UniAgentError):
    """A config or flag names a tool parser that is not registered."""


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


# One line per format: the name and the factory (a class or a function) that builds a parser.
PARSERS = Registry(
    "tool parser",
    {
        "hermes": Entry("uniagent.parsers.hermes:HermesParser", "<tool_call>{json}</tool_call>"),
        "xml": Entry("uniagent.parsers.xml:XMLParser", "<function=NAME><parameter=...>"),
        "qwen3_coder": Entry("uniagent.parsers.xml:qwen3_coder", "the xml format as Qwen3-Coder names it"),
        "harmony": Entry("uniagent.parsers.harmony:HarmonyParser", "gpt-oss: to=functions.NAME…{json}"),
    },
    error=UnknownParserError,
    key=_key,
)


def register_parser(name: str, factory: ParserFactory) -> None:
    """Make `factory` available as `name`; a later registration replaces an earlier one (plugins win)."""
    PARSERS[name] = Entry(factory)


def available_parsers() -> list[str]:
    return sorted(PARSERS)


def known_parser(name: str) -> str:
    """`name` if a parser is registered under it, else ValueError (for config validators)."""
    if name not in PARSERS:
        raise ValueError(str(PARSERS.unknown(name)))
    return name


def get_parser(name: str) -> ToolParser:
    """A fresh parser instance for `name` (case and `-`/`_` do not matter)."""
    factory: ParserFactory = PARSERS.load(name)
    return factory()
