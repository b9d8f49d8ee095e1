"""Property tests: parsers fail only with `ToolFormatError`, and render/parse round-trips."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uniagent.parsers import (
    HarmonyParser,
    HermesParser,
    ParseResult,
    ToolCall,
    ToolFormatError,
    ToolParser,
    XMLParser,
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Edit a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "text": {"type": "string"},
                    "line": {"type": "integer"},
                    "scale": {"type": "number"},
                    "dry_run": {"type": "boolean"},
                    "labels": {"type": "array", "items": {"type": "string"}},
                    "options": {"type": "object"},
                },
                "required": ["path"],
            },
        },
    },
    {"name": "noop", "description": "Do nothing.", "parameters": {"type": "object", "properties": {}}},
]
PARSERS: list[ToolParser] = [HermesParser(), XMLParser(), HarmonyParser()]
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<function=edit>",
    "<parameter=path>",
    "<parameter=line>",
    "{",
    "}",
    "[",
    "]",
    '"',
    ":",
    ",",
    '"name"',
    '"arguments"',
    '"edit"',
    '"noop"',
    '"path"',
    "null",
    "true",
    "1",
    "\n",
    " ",
    ">",
    "=",
    "\\",
    "edit",
    "noop",
    "path",
]
fragment_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=40).map("".join)


def parse_or_format_error(parser: ToolParser, text: str, tools: list[dict[str, Any]] | None) -> None:
    """Parse; a format error is fine, but its example must itself parse, since the model will copy it."""
    try:
        parser.parse(text, tools)
    except ToolFormatError as err:
        example = str(err).partition("Example of a correct call:\n")[2]
        if example and tools:
            assert len(parser.parse(example, tools).calls) == 1


@FAST
@given(text=st.text(max_size=200))
def test_arbitrary_text_never_crashes(text: str) -> None:
    for parser in PARSERS:
        parse_or_format_error(parser, text, TOOLS)
        parse_or_format_error(parser, text, None)


@FAST
@given(text=fragment_text)
def test_fragment_soup_never_crashes(text: str) -> None:
    for parser in PARSERS:
        parse_or_format_error(parser, text, TOOLS)
        parse_or_format_error(parser, text, None)


@FAST
@given(text=st.text(max_size=200).filter(lambda t: "<tool_call>" not in t and "<function=" not in t))
def test_text_without_calls_is_all_thought(text: str) -> None:
    for parser in PARSERS:
        assert parser.parse(text, TOOLS) == ParseResult(text.strip(), [])


# Strings with any unicode and whitespace; XML values cannot hold their own close tag.
free_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30).filter(
    lambda s: "</parameter>" not in s
)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(10**9), 10**9), free_text)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(free_text, inner, max_size=3),
    max_leaves=6,
)
edit_calls = st.fixed_dictionaries(
    {"path": free_text},
    optional={
        "text": free_text,
        "line": st.integers(-(10**12), 10**12),
        "scale": st.floats(allow_nan=False, allow_infinity=False),
        "dry_run": st.booleans(),
        "labels": st.lists(free_text, max_size=4),
        "options": st.dictionaries(free_text, json_value, max_size=3),
    },
).map(lambda args: ToolCall("edit", args))
calls = st.lists(st.one_of(edit_calls, st.just(ToolCall("noop", {}))), min_size=1, max_size=3)
thought = st.text(max_size=30).filter(lambda t: "<tool_call>" not in t and "<function=" not in t)


@FAST
@given(thought=thought, calls=calls, sep=st.sampled_from(["", "\n", "\n\n", " \t\n"]))
def test_round_trip_with_schema(thought: str, calls: list[ToolCall], sep: str) -> None:
    for parser in PARSERS:
        text = thought + "\n" + sep.join(parser.render_call(c) for c in calls)
        assert parser.parse(text, TOOLS) == ParseResult(thought.strip(), calls)


names = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters=">\n"), min_size=1, max_size=12
)


@FAST
@given(
    name=names.filter(lambda n: n.strip() == n and n != ""),
    args=st.dictionaries(names.filter(lambda n: n.strip() == n and n != ""), free_text, max_size=4),
)
def test_round_trip_without_schema(name: str, args: dict[str, str]) -> None:
    """Without tools only string values survive the XML format, so the property uses strings.
    A harmony recipient is one word (`to=functions.NAME`): names with spaces or `<` are not its."""
    for parser in PARSERS:
        if parser.name == "harmony" and any(c.isspace() or c == "<" for c in name):
            continue
        assert parser.parse(parser.render_call(ToolCall(name, args))) == ParseResult(
            "", [ToolCall(name, args)]
        )
