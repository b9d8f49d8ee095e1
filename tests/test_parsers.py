"""Tool-call parsers: both formats, coercion, error quality, round trips, registry and prompts."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from uniagent.errors import UniAgentError
from uniagent.parsers import (
    HermesParser,
    ParseResult,
    ToolCall,
    ToolFormatError,
    ToolParser,
    ToolSchemaError,
    UnknownParserError,
    XMLParser,
    available_parsers,
    coerce_value,
    get_parser,
    inject_tools,
    normalize_tools,
    register_parser,
    registry,
    tools_system_prompt,
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
    {  # bare form, no "type"/"function" wrapper
        "name": "write_file",
        "description": "Write a file.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "force": {"type": "boolean"},
                "mode": {"type": ["integer", "null"]},
                "meta": {"type": "object"},
                "ratio": {"type": "number"},
            },
            "required": ["path", "content"],
        },
    },
]
TOOL_NAMES = ["search", "write_file"]
PARAM_NAMES = ["query", "limit", "path", "content", "tags", "force", "mode", "meta", "ratio"]

HERMES = HermesParser()
XML = XMLParser()
PARSERS: list[ToolParser] = [HERMES, XML]


def xml_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def assert_helpful(err: ToolFormatError, parser: ToolParser, fragment: str) -> None:
    """Every format error names the problem, lists all tools and parameters, and shows a working call."""
    msg = str(err)
    assert fragment in msg, msg
    for name in TOOL_NAMES + PARAM_NAMES:
        assert name in msg, f"{name!r} missing from:\n{msg}"
    assert "required" in msg
    example = msg.split("Example of a correct call:\n", 1)[1]
    assert len(parser.parse(example, TOOLS).calls) == 1


# --- hermes -------------------------------------------------------------------------------------


def test_hermes_single_call_keeps_thought() -> None:
    text = 'Let me look.\n\n<tool_call>\n{"name": "search", "arguments": {"query": "cats"}}\n</tool_call>'
    assert HERMES.parse(text, TOOLS) == ParseResult("Let me look.", [ToolCall("search", {"query": "cats"})])


def test_hermes_multiple_calls_with_whitespace_between() -> None:
    text = (
        '<tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>\n\n  \n'
        '<tool_call>\n{"name": "search", "arguments": {"query": "b", "limit": 2}}\n</tool_call>\n'
    )
    result = HERMES.parse(text, TOOLS)
    assert result.thought == ""
    assert [c.arguments for c in result.calls] == [{"query": "a"}, {"query": "b", "limit": 2}]


def test_hermes_no_call_is_not_an_error() -> None:
    assert HERMES.parse("  The answer is 42.\n", TOOLS) == ParseResult("The answer is 42.", [])


def test_hermes_arguments_as_json_string_and_coercion() -> None:
    args = json.dumps({"query": "x", "limit": "7"})
    text = f'<tool_call>{{"name": "search", "arguments": {json.dumps(args)}}}</tool_call>'
    assert HERMES.parse(text, TOOLS).calls == [ToolCall("search", {"query": "x", "limit": 7})]


def test_hermes_null_or_missing_arguments_mean_empty() -> None:
    tools = [{"name": "ping", "parameters": {"type": "object", "properties": {}}}]
    for body in (
        '{"name": "ping"}',
        '{"name": "ping", "arguments": null}',
        '{"name": "ping", "arguments": ""}',
    ):
        assert HERMES.parse(f"<tool_call>{body}</tool_call>", tools).calls == [ToolCall("ping", {})]


def test_hermes_parameters_key_is_accepted() -> None:
    text = '<tool_call>{"name": "search", "parameters": {"query": "x"}}</tool_call>'
    assert HERMES.parse(text, TOOLS).calls == [ToolCall("search", {"query": "x"})]


def test_hermes_unclosed_final_call_with_complete_json() -> None:
    text = 'ok <tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n'
    assert HERMES.parse(text, TOOLS) == ParseResult("ok", [ToolCall("search", {"query": "x"})])


def test_hermes_unclosed_call_followed_by_prose() -> None:
    text = '<tool_call>{"name": " search ", "arguments": {"query": "x"}} and then I wait.'
    assert HERMES.parse(text, TOOLS).calls == [ToolCall("search", {"query": "x"})]


def test_hermes_missing_close_between_calls() -> None:
    text = (
        '<tool_call>{"name": "search", "arguments": {"query": "a"}}\n'
        '<tool_call>{"name": "search", "arguments": {"query": "b"}}</tool_call>'
    )
    assert [c.arguments["query"] for c in HERMES.parse(text, TOOLS).calls] == ["a", "b"]


def test_hermes_string_may_contain_tags() -> None:
    content = 'use </tool_call> then <tool_call> {"x": 1}'
    call = ToolCall("write_file", {"path": "doc.md", "content": content})
    assert HERMES.parse(HERMES.render_call(call), TOOLS).calls == [call]


def test_hermes_truncated_json_is_an_error() -> None:
    with pytest.raises(ToolFormatError) as err:
        HERMES.parse('<tool_call>\n{"name": "search", "arguments": {"query": "x"', TOOLS)
    assert_helpful(err.value, HERMES, "not valid JSON")
    assert "missing its closing </tool_call>" in str(err.value)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("{name: search}", "not valid JSON"),
        ('"search"', "must be a JSON object"),
        ('{"arguments": {"query": "x"}}', 'no "name"'),
        ('{"name": "  ", "arguments": {}}', 'no "name"'),
        ('{"name": "serch", "arguments": {"query": "x"}}', "unknown tool 'serch'"),
        ('{"name": "search", "arguments": {"query": "x", "q": 1}}', "unknown parameter(s) 'q'"),
        ('{"name": "write_file", "arguments": {"path": "a"}}', "missing required parameter(s) 'content'"),
        ('{"name": "search", "arguments": [1]}', '"arguments" must be a JSON object'),
        ('{"name": "search", "arguments": "{bad"}', '"arguments" must be a JSON object'),
        ('{"name": "search", "arguments": {"query": "x"}}}', "unexpected text '}'"),
        ("[" * 100_000, "too large or too deeply nested"),
    ],
)
def test_hermes_errors_are_helpful(body: str, fragment: str) -> None:
    with pytest.raises(ToolFormatError) as err:
        HERMES.parse(f"thinking\n<tool_call>\n{body}\n</tool_call>", TOOLS)
    assert_helpful(err.value, HERMES, fragment)


def test_hermes_error_names_the_failing_call() -> None:
    good = '<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'
    with pytest.raises(ToolFormatError, match="tool call 2"):
        HERMES.parse(good + '<tool_call>{"name": "nope"}</tool_call>', TOOLS)


def test_hermes_example_uses_the_tool_the_model_meant() -> None:
    with pytest.raises(ToolFormatError) as err:
        HERMES.parse('<tool_call>{"name": "write_file", "arguments": {}}</tool_call>', TOOLS)
    example = str(err.value).split("Example of a correct call:\n", 1)[1]
    assert HERMES.parse(example, TOOLS).calls[0].name == "write_file"


def test_without_tools_nothing_is_validated_or_coerced() -> None:
    text = '<tool_call>{"name": "anything", "arguments": {"n": "3"}}</tool_call>'
    assert HERMES.parse(text).calls == [ToolCall("anything", {"n": "3"})]
    assert XML.parse(xml_call("anything", n="3")).calls == [ToolCall("anything", {"n": "3"})]


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
def test_empty_tool_list_rejects_calls(parser: ToolParser) -> None:
    text = parser.render_call(ToolCall("search", {"query": "x"}))
    with pytest.raises(ToolFormatError, match="No tools are available"):
        parser.parse(text, [])


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
def test_error_without_tools_still_shows_the_format(parser: ToolParser) -> None:
    bad = "<tool_call>\n<function=>\n</tool_call>" if parser is XML else "<tool_call>{oops</tool_call>"
    with pytest.raises(ToolFormatError) as err:
        parser.parse(bad)
    example = str(err.value).split("Example of a correct call:\n", 1)[1]
    assert parser.parse(example).calls == [ToolCall("tool_name", {"parameter_name": "value"})]


# --- xml / qwen3_coder --------------------------------------------------------------------------


def test_xml_single_call_keeps_thought_and_raw_text() -> None:
    code = 'def f(x):\n    return "<b>" + x\n\n'
    text = "I'll write it.\n" + xml_call("write_file", path="a.py", content=code)
    result = XML.parse(text, TOOLS)
    assert result == ParseResult(
        "I'll write it.", [ToolCall("write_file", {"path": "a.py", "content": code})]
    )


def test_xml_strips_exactly_one_newline_each_side() -> None:
    text = "<tool_call>\n<function=search>\n<parameter=query>\n\n  x  \n\n</parameter>\n</function>"
    assert XML.parse(text, TOOLS).calls[0].arguments == {"query": "\n  x  \n"}
    inline = "<tool_call><function=search><parameter=query>x</parameter></function></tool_call>"
    assert XML.parse(inline, TOOLS).calls[0].arguments == {"query": "x"}


def test_xml_multiple_calls() -> None:
    text = xml_call("search", query="a") + "\n\n" + xml_call("search", query="b", limit="5")
    calls = XML.parse(text, TOOLS).calls
    assert calls == [ToolCall("search", {"query": "a"}), ToolCall("search", {"query": "b", "limit": 5})]


def test_xml_several_functions_in_one_block() -> None:
    text = (
        "<tool_call>\n<function=search>\n<parameter=query>\na\n</parameter>\n</function>\n"
        "<function=search>\n<parameter=query>\nb\n</parameter>\n</function>\n</tool_call>"
    )
    assert [c.arguments["query"] for c in XML.parse(text, TOOLS).calls] == ["a", "b"]


def test_xml_coerces_by_schema() -> None:
    text = xml_call(
        "write_file",
        path="007",
        content="true",
        tags='["a", "b"]',
        force="True",
        mode="null",
        meta='{"k": [1, 2]}',
        ratio="0.5",
    )
    args = XML.parse(text, TOOLS).calls[0].arguments
    assert args == {
        "path": "007",
        "content": "true",
        "tags": ["a", "b"],
        "force": True,
        "mode": None,
        "meta": {"k": [1, 2]},
        "ratio": 0.5,
    }


def test_xml_value_may_contain_tags_when_closed() -> None:
    content = "<parameter=x>\n</function>\n<tool_call>"
    text = xml_call("write_file", path="t.xml", content=content)
    assert XML.parse(text, TOOLS).calls[0].arguments["content"] == content


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<function=search>\n<parameter=query>\ncats\n</parameter>\n</function>\n",
        "<tool_call>\n<function=search>\n<parameter=query>\ncats\n</parameter>\n",
        "<tool_call>\n<function=search>\n<parameter=query>\ncats\n",
        "<tool_call>\n<function=search>\n<parameter=query>\ncats\n</function>\n</tool_call>",
        "<tool_call>\n<function=search>\n<parameter=query>\ncats\n</parameter>\n</tool_call>",
        "<function=search>\n<parameter=query>\ncats\n</parameter>\n</function>",
    ],
    ids=["no-close-call", "no-close-func", "no-close-param", "param-then-func", "func-then-call", "bare"],
)
def test_xml_unclosed_tags_at_the_end(text: str) -> None:
    assert XML.parse("hm " + text, TOOLS) == ParseResult("hm", [ToolCall("search", {"query": "cats"})])


def test_xml_unclosed_params_are_split_at_the_next_tag() -> None:
    text = "<tool_call>\n<function=search>\n<parameter=query>\ncats\n<parameter=limit>\n3\n"
    assert XML.parse(text, TOOLS).calls == [ToolCall("search", {"query": "cats", "limit": 3})]


def test_xml_no_call_is_not_an_error() -> None:
    assert XML.parse("\nJust text with <b>tags</b>.\n", TOOLS) == ParseResult(
        "Just text with <b>tags</b>.", []
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (xml_call("serch", query="x"), "unknown tool 'serch'"),
        (xml_call("search", query="x", q="1"), "unknown parameter(s) 'q'"),
        (xml_call("write_file", path="a"), "missing required parameter(s) 'content'"),
        (xml_call("search", query="x") + "\n" + xml_call("search"), "tool call 2"),
        ('<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>', "expected <function=NAME>"),
        ("<tool_call>\n</tool_call>", "contains no <function=NAME>"),
        ("<tool_call>\n<function=search\n<parameter=query>\nx\n</parameter>", "malformed tag"),
        ("<tool_call>\n<function=search>\n<parameter=>\nx\n</parameter>", "malformed tag"),
        ("<tool_call>\n<function=search>\nquery: x\n</function>", "expected <parameter=NAME>"),
        (
            "<tool_call><function=search><parameter=query>a</parameter><parameter=query>b</parameter>",
            "given twice",
        ),
    ],
)
def test_xml_errors_are_helpful(text: str, fragment: str) -> None:
    with pytest.raises(ToolFormatError) as err:
        XML.parse(text, TOOLS)
    assert_helpful(err.value, XML, fragment)


# --- coercion -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "schema", "expected"),
    [
        ("3", {"type": "integer"}, 3),
        (" -3 ", {"type": "integer"}, -3),
        ("3.0", {"type": "integer"}, 3),
        ("3.5", {"type": "integer"}, "3.5"),
        ("abc", {"type": "integer"}, "abc"),
        ("9" * 5000, {"type": "integer"}, "9" * 5000),
        ("2", {"type": "number"}, 2),
        ("1e3", {"type": "number"}, 1000.0),
        ("nan", {"type": "number"}, "nan"),
        ("TRUE", {"type": "boolean"}, True),
        ("false", {"type": "boolean"}, False),
        ("yes", {"type": "boolean"}, "yes"),
        ("null", {"type": "null"}, None),
        ("null", {"type": ["integer", "null"]}, None),
        ("4", {"type": ["integer", "null"]}, 4),
        ("4", {"type": ["string", "integer"]}, "4"),
        ("4", {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, 4),
        ("2", {"enum": [1, 2, 3]}, 2),
        ("b", {"enum": ["a", "b"]}, "b"),
        ('["a"]', {"type": "array"}, ["a"]),
        ("['a', None]", {"type": "array"}, ["a", None]),
        ("{1, 2}", {"type": "array"}, "{1, 2}"),
        ('{"a": 1}', {"type": "array"}, '{"a": 1}'),
        ('{"a": "1"}', {"type": "object", "properties": {"a": {"type": "integer"}}}, {"a": 1}),
        (["1", "x"], {"type": "array", "items": {"type": "integer"}}, [1, "x"]),
        ("3", {"type": "string"}, "3"),
        ("3", {}, "3"),
        ("3", None, "3"),
        (5, {"type": "string"}, 5),
    ],
)
def test_coerce_value(value: Any, schema: Any, expected: Any) -> None:
    assert coerce_value(value, schema) == expected
    assert type(coerce_value(value, schema)) is type(expected)


def test_unknown_params_pass_through_when_schema_allows_extra() -> None:
    tools = [{"name": "free", "parameters": {"type": "object"}}]
    assert HERMES.parse('<tool_call>{"name": "free", "arguments": {"x": "1"}}</tool_call>', tools).calls == [
        ToolCall("free", {"x": "1"})
    ]


# --- round trips --------------------------------------------------------------------------------

ROUND_TRIP_CALLS = [
    ToolCall("search", {"query": "héllo wörld ✓", "limit": 10}),
    ToolCall("search", {"query": "  spaced\n\nlines\n"}),
    ToolCall("search", {"query": ""}),
    ToolCall("search", {"query": "42"}),
    ToolCall(
        "write_file",
        {
            "path": "a b/c.txt",
            "content": 'quote " and \\ backslash\n\ttab',
            "tags": ["x", "y"],
            "force": False,
            "mode": None,
            "meta": {"nested": {"k": [1, 2.5, None]}},
            "ratio": 0.25,
        },
    ),
]


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
@pytest.mark.parametrize("call", ROUND_TRIP_CALLS, ids=range(len(ROUND_TRIP_CALLS)))
def test_round_trip(parser: ToolParser, call: ToolCall) -> None:
    assert parser.parse(parser.render_call(call), TOOLS) == ParseResult("", [call])


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
def test_round_trip_many_calls_with_thought(parser: ToolParser) -> None:
    text = "Thinking first.\n" + "\n".join(parser.render_call(c) for c in ROUND_TRIP_CALLS)
    assert parser.parse(text, TOOLS) == ParseResult("Thinking first.", ROUND_TRIP_CALLS)


def test_parsed_call_converts_to_openai() -> None:
    call = XML.parse(xml_call("search", query="é", limit="2"), TOOLS).calls[0]
    assert call.to_openai()["function"] == {"name": "search", "arguments": '{"query": "é", "limit": 2}'}


# --- format instructions and prompts ------------------------------------------------------------


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
def test_format_instructions_are_self_contained(parser: ToolParser) -> None:
    text = parser.format_instructions(TOOLS)
    for word in [
        *TOOL_NAMES,
        *PARAM_NAMES,
        "Search the web.",
        "Write a file.",
        "<tool_call>",
        "</tool_call>",
    ]:
        assert word in text
    example = re.search(r"For example:\n(.*?</tool_call>)", text, re.S)
    assert example is not None
    assert parser.parse(example.group(1), TOOLS).calls[0].name == "search"


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
def test_format_instructions_without_tools(parser: ToolParser) -> None:
    assert "No tools are available" in parser.format_instructions([])


def test_tools_system_prompt_combines_base_and_instructions() -> None:
    prompt = tools_system_prompt(TOOLS, HERMES, "You are helpful.\n")
    assert prompt.startswith("You are helpful.\n\n# Tools")
    assert tools_system_prompt(TOOLS, HERMES, None) == HERMES.format_instructions(TOOLS)
    assert tools_system_prompt(TOOLS, HERMES, "  ") == HERMES.format_instructions(TOOLS)


def test_inject_tools_appends_to_first_system_message() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    out = inject_tools(messages, TOOLS, XML)
    assert out[0]["content"] == tools_system_prompt(TOOLS, XML, "Be brief.")
    assert out[1] == messages[1]
    assert messages[0]["content"] == "Be brief."  # input untouched


def test_inject_tools_inserts_system_message() -> None:
    messages = [{"role": "user", "content": "hi"}]
    out = inject_tools(messages, TOOLS, HERMES)
    assert out == [{"role": "system", "content": HERMES.format_instructions(TOOLS)}, *messages]
    assert len(messages) == 1


def test_inject_tools_handles_content_parts_and_no_tools() -> None:
    messages = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}]
    out = inject_tools(messages, TOOLS, HERMES)
    assert out[0]["content"][0] == {"type": "text", "text": "Be brief."}
    assert "search" in out[0]["content"][1]["text"]
    assert len(messages[0]["content"]) == 1
    assert inject_tools(messages, [], HERMES) == messages


# --- tool schemas and registry ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "fragment"),
    [
        (["search"], "must be a dict"),
        ([{"type": "function", "function": {"description": "x"}}], "has no name"),
        ([{"name": "a"}, {"name": "a"}], "given twice"),
        ([{"name": "a", "parameters": "x"}], "must be a JSON schema object"),
    ],
)
def test_bad_tool_schemas_are_user_errors(tools: list[Any], fragment: str) -> None:
    with pytest.raises(ToolSchemaError, match=fragment) as err:
        normalize_tools(tools)
    assert isinstance(err.value, UniAgentError)


def test_normalize_tools_accepts_both_shapes() -> None:
    specs = normalize_tools(TOOLS)
    assert specs is not None
    assert list(specs) == TOOL_NAMES
    assert specs["write_file"].required == ["path", "content"]
    assert normalize_tools([{"name": "bare"}])["bare"].properties == {}  # type: ignore[index]


def test_registry_builtin_parsers() -> None:
    assert {"hermes", "xml", "qwen3_coder"} <= set(available_parsers())
    assert isinstance(get_parser("hermes"), HermesParser)
    assert isinstance(get_parser("XML"), XMLParser)
    alias = get_parser("qwen3-coder")
    assert isinstance(alias, XMLParser)
    assert alias.name == "qwen3_coder"
    assert get_parser("hermes") is not get_parser("hermes")


def test_registry_unknown_name_lists_known_ones() -> None:
    with pytest.raises(UnknownParserError) as err:
        get_parser("mistral")
    assert isinstance(err.value, UniAgentError)
    assert "'mistral'" in str(err.value)
    for name in ("hermes", "xml", "qwen3_coder"):
        assert name in str(err.value)


def test_register_custom_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    class Custom(HermesParser):
        name = "custom_test"

    monkeypatch.setattr(registry, "PARSERS", registry.PARSERS.copy())  # keep the global registry clean
    register_parser("custom_test", Custom)
    assert isinstance(get_parser("custom_test"), Custom)
    assert "custom_test" in available_parsers()


# -- streaming: what a front may show before the turn is parsed ----------------------------------


def test_streamed_text_stops_at_each_formats_call_marker() -> None:
    from uniagent.parsers.stream import call_markers, visible_prefix

    assert call_markers(get_parser("hermes")) == ("<tool_call>",)
    assert call_markers(get_parser("qwen3_coder")) == ("<tool_call>", "<function=")
    hermes = call_markers(get_parser("hermes"))
    assert visible_prefix("I'll look.\n<tool_call>\n{", hermes) == ("I'll look.\n", True)
    # A partial marker is held back until the next token says whether it is one.
    assert visible_prefix("I'll look.<tool_", hermes) == ("I'll look.", False)
    assert visible_prefix("a < b", hermes) == ("a < b", False)
    # A bare <function= opens a call in the XML format only.
    xml = call_markers(get_parser("xml"))
    assert visible_prefix("ok <function=bash>", xml) == ("ok ", True)
    assert visible_prefix("ok <function=bash>", hermes) == ("ok <function=bash>", False)
    # A partial UTF-8 character (decoded as U+FFFD) waits for its next byte.
    assert visible_prefix("caf\ufffd", hermes) == ("caf", False)
