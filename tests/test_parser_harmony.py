"""gpt-oss's own call format (parsers/harmony.py), checked against gpt-oss's real chat template."""

from __future__ import annotations

import json

import pytest

import real_tokenizers as real
from test_gateway import BASH
from test_parsers import ROUND_TRIP_CALLS, TOOL_NAMES, TOOLS
from uniagent.parsers import ToolCall, ToolFormatError, get_parser
from uniagent.parsers.base import ParseResult
from uniagent.parsers.harmony import HarmonyParser

HARMONY = HarmonyParser()
TASK = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]


def test_it_is_registered() -> None:
    assert isinstance(get_parser("harmony"), HarmonyParser)


@pytest.mark.parametrize("call", ROUND_TRIP_CALLS, ids=range(len(ROUND_TRIP_CALLS)))
def test_round_trip(call: ToolCall) -> None:
    assert HARMONY.parse(HARMONY.render_call(call), TOOLS) == ParseResult("", [call])


@pytest.mark.parametrize(
    "text",
    [
        ' to=functions.search<|channel|>commentary json<|message|>{"query": "x"}',  # gpt-oss's template
        '<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"query": "x"}<|call|>',
        "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant to=functions.search"
        '<|channel|>commentary json<|message|>{"query":"x"}',
    ],
)
def test_both_header_orders_and_the_analysis_as_thought(text: str) -> None:
    result = HARMONY.parse(text, TOOLS)
    assert result.calls == [ToolCall("search", {"query": "x"})]
    assert result.thought == ("Look it up." if "analysis" in text else "")


def test_text_without_a_call_is_the_thought() -> None:
    assert HARMONY.parse("Done.", TOOLS) == ParseResult("Done.", [])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (" to=functions.search<|channel|>commentary json<|message|>{oops", "not valid JSON"),
        (" to=functions.search<|channel|>commentary json<|message|>[1]", "must be a JSON object"),
        (" to=functions.search<|channel|>commentary json", "has no <|message|>"),
        (' to=functions.nope<|channel|>commentary json<|message|>{"a": 1}', "unknown tool"),
    ],
)
def test_malformed_calls_say_what_is_wrong_and_show_a_call_that_parses(text: str, problem: str) -> None:
    with pytest.raises(ToolFormatError, match=problem) as err:
        HARMONY.parse(text, TOOLS)
    example = str(err.value).split("Example of a correct call:\n", 1)[1]
    assert len(HARMONY.parse(example, TOOLS).calls) == 1


def test_format_instructions_list_the_tools_and_an_example_that_parses() -> None:
    text = HARMONY.format_instructions(TOOLS)
    assert all(name in text for name in TOOL_NAMES) and "to=functions." in text
    assert "No tools are available" in HARMONY.format_instructions([])


def test_a_call_renders_as_gpt_oss_own_template_writes_it() -> None:
    """What the parser writes is what the template renders after `<|start|>assistant`, so a
    model prompted in this format and the template agree token for token."""
    codec = real.codec("gptoss-own")
    call = ToolCall("bash", {"command": "ls -la"}, "call_1")
    prompt = codec.render(TASK, [BASH])
    message = {"role": "assistant", "content": "", "tool_calls": [call.to_openai()]}
    full = codec.render([*TASK, message], [BASH], add_generation_prompt=False)
    assert full[len(prompt) :] == HARMONY.render_call(call)
    assert HARMONY.parse(full[len(prompt) :], [BASH]).calls == [ToolCall("bash", {"command": "ls -la"})]
    assert json.loads(call.to_openai()["function"]["arguments"]) == {"command": "ls -la"}
