"""Parsers by name, so configs and the CLI can pick a tool-call format with a string."""

from __future__ import annotations

from collections.abc import Callable

from uniagent.errors import UniAgentError
from uniagent.parsers.base import ToolParser
from uniagent.parsers.hermes import HermesParser
from uniagent.parsers.xml import XMLParser

ParserFactory = Callable[[], ToolParser]

_FACTORIES: dict[str, ParserFactory] = {}


class UnknownParserError(UniAgentError):
    """A config or flag names a tool parser that is not registered."""


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def register_parser(name: str, factory: ParserFactory) -> None:
    """Make `factory` available as `name`; a later registration replaces an earlier one (plugins win)."""
    _FACTORIES[_key(name)] = factory


def available_parsers() -> list[str]:
    return sorted(_FACTORIES)


def known_parser(name: str) -> str:
    """`name` if a parser is registered under it, else ValueError (for config validators)."""
    if _key(name) not in _FACTORIES:
        raise ValueError(f"unknown tool parser {name!r}; known parsers: {', '.join(available_parsers())}")
    return name


def get_parser(name: str) -> ToolParser:
    """A fresh parser instance for `name` (case and `-`/`_` do not matter)."""
    factory = _FACTORIES.get(_key(name))
    if factory is None:
        raise UnknownParserError(
            f"unknown tool parser {name!r}; known parsers: {', '.join(available_parsers())}"
        )
    return factory()


register_parser("hermes", HermesParser)
register_parser("xml", XMLParser)
register_parser("qwen3_coder", lambda: XMLParser(name="qwen3_coder"))
