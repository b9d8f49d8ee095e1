"""A reply's text -> its assistant message, on real tokenizers (issue 29, tokens/reply.py).

Qwen3's own template makes the model open each turn with a think block and gpt-oss's with a channel
header: the ReAct loop's `TokenChatModel` and the gateway hand back the answer alone (reasoning in
the template's own field), so the client never shows a header and a history sent back renders
(gpt-oss refuses channel tags in content). Templates without either keep the text unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import real_tokenizers as real
from test_gateway import BASH
from token_checks import Gen, assert_every_generated_token_once
from tokens_sim import model_turn_ids
from uniagent.gateway import Gateway
from uniagent.gateway.server import GatewayServer
from uniagent.models.base import Generation
from uniagent.models.replay import ReplayEngine, ReplayRecord
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser

TASK = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix calc.py."}]


def test_each_real_template_says_where_its_answer_and_reasoning_go() -> None:
    found = {pair: real.codec(pair).reply_format for pair in real.PAIRS}
    assert (found["qwen3-own"].field, found["qwen3-own"].opens) == ("reasoning_content", "<think>\n")
    assert found["qwen3-own"].head == "<think>\n\n</think>\n\n"
    gptoss = found["gptoss-own"]
    assert (gptoss.field, gptoss.head) == ("thinking", "<|channel|>final<|message|>")
    assert gptoss.opens == "<|channel|>analysis<|message|>"
    plain = [p for p in real.PAIRS if p not in ("qwen3-own", "qwen3-Qwen3", "gptoss-own")]
    assert all(not found[p].head and not found[p].field for p in plain)  # the text is the answer


@pytest.mark.parametrize(
    ("pair", "text", "message"),
    [
        ("qwen3-own", "<think>\nhmm\n</think>\n\nDone.", {"content": "Done.", "reasoning_content": "hmm"}),
        ("qwen3-own", "<think>\n\n</think>\n\nDone.", {"content": "Done."}),  # empty: no field
        ("qwen3-own", "Done.", {"content": "Done."}),  # a model that skipped its think block
        (
            "gptoss-own",
            "<|channel|>analysis<|message|>look<|end|><|start|>assistant<|channel|>final<|message|>Done.",
            {"content": "Done.", "thinking": "look"},
        ),
        ("gptoss-own", "<|channel|>final<|message|>Done.", {"content": "Done."}),
        ("gptoss-own", "no header at all", {"content": "no header at all"}),  # nothing is dropped
        ("llama3_1-own", "<think>x</think>Done.", {"content": "<think>x</think>Done."}),
    ],
)
def test_a_reply_splits_as_its_template_renders_it(pair: str, text: str, message: dict[str, Any]) -> None:
    codec = real.codec(pair)
    assert codec.reply_message(text) == {"role": "assistant", **message}


@pytest.mark.parametrize("pair", ["qwen3-own", "gptoss-own"])
def test_the_split_message_renders_back_to_the_generated_tokens(pair: str) -> None:
    """The message handed back renders, after the prompt, exactly as the model's own turn."""
    codec = real.codec(pair)
    for said in ({"content": "Done."}, {"content": "Done.", codec.reply_format.field: "I looked."}):
        ids = model_turn_ids(codec, TASK, {"role": "assistant", **said})
        text = codec.decode(ids[:-1])  # the end-of-turn is cut, as the conversation does
        back = codec.reply_message(text)
        assert back == {"role": "assistant", **said}
        assert model_turn_ids(codec, TASK, back) == ids


def test_streamed_text_never_shows_a_header_or_reasoning() -> None:
    fmt = real.codec("gptoss-own").reply_format
    full = "<|channel|>analysis<|message|>look<|end|><|start|>assistant<|channel|>final<|message|>Done."
    shown = [fmt.answer_so_far(full[:n]) for n in range(len(full) + 1)]
    assert all(s == "" or "Done.".startswith(s) for s in shown) and shown[-1] == "Done."
    assert real.codec("qwen3-own").reply_format.answer_so_far("<thi") == ""
    assert real.codec("llama3_1-own").reply_format.answer_so_far("<thi") == "<thi"


def _call(command: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'bash', 'arguments': {'command': command}})}\n</tool_call>"


@pytest.mark.parametrize(("pair", "parser"), [("qwen3-own", "hermes"), ("gptoss-own", "harmony")])
async def test_the_react_loop_sends_its_own_replies_back_and_they_render(pair: str, parser: str) -> None:
    """The loop appends `turn.message` to its history as is: on gpt-oss a header in the content
    would make the next render fail. Qwen3 calls tools in the hermes format inside its answer,
    gpt-oss in a commentary message of its own (harmony), after its analysis. One segment holds
    every generated token, exactly as the template renders the episode."""
    codec = real.codec(pair)
    gen = Gen(codec)
    calls = [{"command": "ls"}, {"command": "cat calc.py"}]
    if parser == "hermes":
        turns = [gen.turn(_call(a["command"])) for a in calls]
    else:
        turns = [gen.turn("", message=_own_call(a, thought=f"Step {i}.")) for i, a in enumerate(calls)]
    turns.append(gen.turn("Fixed."))
    records = [ReplayRecord("r", Generation(*t, "stop"), i, None, "0" * 64) for i, t in enumerate(turns)]
    engine = ReplayEngine(records, match="request", strict=False)
    model = TokenChatModel(engine, codec, get_parser(parser), request_id="r")
    history = list(TASK)
    for i in range(3):
        turn = await model.query(history, [BASH])
        assert "<|" not in turn.message["content"] and "<think>" not in turn.message["content"]
        history.append(turn.message)
        if i < 2:
            assert [c.arguments for c in turn.tool_calls] == [calls[i]]
            history.append({"role": "tool", "tool_call_id": turn.tool_calls[0].id, "content": f"out {i}"})
    assert turn.message["content"] == "Fixed."
    segments = model.finish(history, [BASH])
    assert_every_generated_token_once(segments, gen)
    assert [s.num_turns for s in segments] == [3]  # one segment: the history it handed out came back
    if parser == "harmony":  # gpt-oss's template drops past analysis once a final answer exists
        assert segments[0].drift_kind == "template"
        assert (
            segments[0].token_ids[: segments[0].drift]
            == codec.encode(codec.render(history, [BASH]))[: segments[0].drift]
        )
    else:
        assert segments[0].drift is None or segments[0].drift_kind == "template"


def _own_call(arguments: dict[str, Any], thought: str = "") -> dict[str, Any]:
    call = {"id": "c", "type": "function", "function": {"name": "bash", "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": thought, "tool_calls": [call]}


async def test_the_gateway_streams_the_answer_without_gpt_oss_headers() -> None:
    codec = real.codec("gptoss-own")
    gen = Gen(codec)
    said = {"role": "assistant", "content": "All done.", "thinking": "Check first."}
    ids = model_turn_ids(codec, TASK, said)
    lps = gen.ids(ids)[1]
    engine = ReplayEngine(
        [ReplayRecord("s", Generation(ids, lps, "stop"), 0, None, "0" * 64)], match="request", strict=False
    )
    server = await GatewayServer(Gateway(engine, codec)).start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            sid = (await http.post("/sessions", json={"request_id": "s"})).json()["session_id"]
            body = {"model": "m", "messages": TASK, "stream": True}
            r = await http.post(f"/sessions/{sid}/v1/chat/completions", json=body)
        deltas = [
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in r.text.splitlines()
            if line.startswith("data: {") and json.loads(line[6:])["choices"]
        ]
        assert "".join(deltas) == "All done."
    finally:
        await server.stop()
