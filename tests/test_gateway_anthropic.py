"""The gateway's Anthropic Messages front (`/sessions/{id}/v1/messages`), what Claude Code speaks.

The wire itself is tested on the real first request Claude Code 2.1.197 sent (recorded from the
real CLI, `fixtures/gateway/`) and on the histories it sends later; the endpoint is driven by the
official `anthropic` SDK against the real gateway (uvicorn on loopback) over the real ReplayEngine
(scripted generations) and the real SmolLM2 codec, plus one real SmolLM2 call (LocalEngine).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from test_gateway import model_segments, new_session, scripted, serve, trajectories  # noqa: F401  (serve: fixture)
from uniagent.gateway.sessions import ContextLengthError, GatewayError
from uniagent.gateway.wire.anthropic import AnthropicMessages
from uniagent.parsers.base import ToolCall
from wire_helpers import events, wire_stand_ins

FIXTURES = Path(__file__).parent / "fixtures" / "gateway"
WIRE = AnthropicMessages()
BASH = {
    "name": "Bash",
    "description": "Run a bash command",
    "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def claude_request() -> dict[str, Any]:
    return json.loads((FIXTURES / "claude_code_2.1.197_tools_bash.json").read_text())


def call(command: str) -> str:
    """Claude Code's Bash call in the hermes format the session's parser reads."""
    return f"<tool_call>\n{json.dumps({'name': 'Bash', 'arguments': {'command': command}})}\n</tool_call>"


turn, exchange = wire_stand_ins(prompt_tokens=42, n=7)


def parse_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        out.append((lines["event"], data))
    return out


# -- the wire on plain bodies ------------------------------------------------------------------


def test_claude_codes_real_first_request_parses() -> None:
    body = claude_request()
    req = WIRE.parse(body)  # thinking, context_management, output_config, metadata: ignored
    system, user = req.messages
    assert system["role"] == "system" and "x-anthropic-billing-header" not in system["content"]
    assert system["content"].startswith("You are a Claude agent, built on Anthropic's Claude Agent SDK.\n")
    assert user["role"] == "user" and user["content"].endswith(
        "</system-reminder>\n\nCreate f.txt containing hi"
    )
    (tool,) = req.tools
    assert tool["function"]["name"] == "Bash" and "$schema" not in tool["function"]["parameters"]
    assert tool["function"]["parameters"]["required"] == ["command"]
    assert req.stream and req.sampling["max_tokens"] == 64000
    # The per-call billing hash and the moving cache_control do not change the history.
    other = copy.deepcopy(body)
    other["system"][0]["text"] = other["system"][0]["text"].replace("b8b", "f00")
    for block in other["messages"][0]["content"]:
        block.pop("cache_control", None)
    other["system"][2]["cache_control"] = {"type": "ephemeral"}
    assert WIRE.parse(other).messages == req.messages


def test_a_later_turn_maps_blocks_onto_chat_messages() -> None:
    body = {
        "max_tokens": 100,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Create f.txt"},
            {"role": "system", "content": "Available agent types: none."},  # mid-conversation system
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "x"},
                    {"type": "text", "text": "I'll create it."},
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "Bash",
                        "input": {"command": "echo hi > f.txt"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_1",
                        "content": [{"type": "text", "text": "ok"}],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_2",
                        "content": "no such file",
                        "is_error": True,
                    },
                    {"type": "text", "text": "<system-reminder>go on</system-reminder>", "cache_control": {}},
                ],
            },
        ],
        "tools": [BASH, {"type": "web_search_20250305", "name": "web_search"}],
    }
    req = WIRE.parse(body)
    assert [m["role"] for m in req.messages] == [
        "system",
        "user",
        "system",
        "assistant",
        "tool",
        "tool",
        "user",
    ]
    assistant = req.messages[3]
    assert assistant["content"] == "I'll create it."
    assert assistant["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "Bash", "arguments": {"command": "echo hi > f.txt"}},
        }
    ]
    assert req.messages[4] == {"role": "tool", "content": "ok", "tool_call_id": "call_1"}
    assert req.messages[5]["content"] == "Error: no such file"
    assert [t["function"]["name"] for t in req.tools] == ["Bash"]  # the server tool runs at Anthropic
    assert not req.stream


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role must be user, assistant or system"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "'image'"),
        ({"messages": [{"role": "user", "content": "x"}], "stop_sequences": ["END"]}, "stop_sequences"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "t"}]}, "input_schema"),
    ],
)
def test_malformed_requests_say_what_to_fix(body: dict[str, Any], says: str) -> None:
    with pytest.raises(GatewayError, match=says):
        WIRE.parse(body)


def test_answers_and_errors_in_anthropics_shape() -> None:
    calls = [ToolCall("Bash", {"command": "ls"}, "call_3")]
    body = WIRE.response(turn("Looking.", calls, "tool_calls"), exchange())
    assert body["content"] == [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "call_3", "name": "Bash", "input": {"command": "ls"}},
    ]
    assert body["stop_reason"] == "tool_use" and body["usage"]["input_tokens"] == 42
    assert body["usage"]["output_tokens"] == 7
    assert WIRE.response(turn("", calls, "tool_calls"), exchange())["content"][0]["type"] == "tool_use"
    assert WIRE.response(turn("cut", finish="length"), exchange())["stop_reason"] == "max_tokens"
    assert WIRE.response(turn("done"), exchange())["stop_reason"] == "end_turn"

    exc = ContextLengthError("too long", 9000, 8192)
    assert WIRE.error(exc) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 9000 tokens > 8192 maximum",
        },
    }
    assert WIRE.error(GatewayError("gone", 404, "session_not_found"))["error"]["type"] == "not_found_error"
    assert WIRE.error(GatewayError("boom", 500, kind="server_error"))["error"]["type"] == "api_error"


async def test_the_stream_is_anthropics_event_sequence() -> None:
    calls = [ToolCall("Bash", {"command": "ls"}, "call_1")]
    done = turn("I'll look.", calls, "tool_calls")
    raw = b"".join(
        [
            b
            async for b in WIRE.stream(
                events(("text", "I'll "), ("text", "look.\n"), ("done", done)), exchange()
            )
        ]
    )
    names = [(name, data.get("index")) for name, data in parse_sse(raw)]
    assert names == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("message_delta", None),
        ("message_stop", None),
    ]
    sse = parse_sse(raw)
    assert sse[0][1]["message"]["usage"]["input_tokens"] == 42
    assert sse[6][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"command": "ls"}'}
    assert sse[8][1]["delta"]["stop_reason"] == "tool_use" and sse[8][1]["usage"] == {"output_tokens": 7}
    # A turn with no streamed text still has one (empty) text block; an error ends the stream.
    raw = b"".join([b async for b in WIRE.stream(events(("done", turn(""))), exchange())])
    assert [n for n, _ in parse_sse(raw)][1:4] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    raw = b"".join(
        [b async for b in WIRE.stream(events(("error", GatewayError("engine down", 503))), exchange())]
    )
    assert parse_sse(raw)[-1][1]["error"] == {"type": "api_error", "message": "engine down"}


# -- the endpoint, with the anthropic SDK as the client ----------------------------------------


def client(server: Any, sid: str, **options: Any) -> anthropic.AsyncAnthropic:
    options = {"api_key": "unused", **options}
    return anthropic.AsyncAnthropic(base_url=f"{server.url}/sessions/{sid}", max_retries=0, **options)


def echo(message: Any) -> dict[str, Any]:
    """What Claude Code sends back: its assistant turn's blocks as it received them."""
    return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}


async def test_tool_use_conversation_is_token_exact(serve, codec) -> None:  # noqa: F811
    texts = ["I'll create it.\n" + call("echo hi > f.txt"), call("cat f.txt"), "Done: f.txt says hi."]
    server = await serve(scripted(codec, {"cc": texts}), codec)
    sid = await new_session(server, request_id="cc", sampling={"max_tokens": 64})
    claude = client(server, sid)
    ask = {"model": "smollm2", "max_tokens": 4096, "system": "You are Claude Code.", "tools": [BASH]}
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Create f.txt"}]}]

    first = await claude.messages.create(messages=messages, **ask)
    assert first.stop_reason == "tool_use" and first.usage.output_tokens == len(codec.encode(texts[0])) + 1
    text, tool = first.content
    assert (
        text.text == "I'll create it."
        and tool.name == "Bash"
        and tool.input == {"command": "echo hi > f.txt"}
    )
    result = {
        "type": "tool_result",
        "tool_use_id": tool.id,
        "content": "",
        "cache_control": {"type": "ephemeral"},
    }
    messages += [echo(first), {"role": "user", "content": [result]}]

    # Streamed, as Claude Code always asks: the SDK assembles the tool_use from input_json_delta.
    async with claude.messages.stream(messages=messages, **ask) as stream:
        second = await stream.get_final_message()
    assert second.stop_reason == "tool_use" and second.content[0].type == "tool_use"
    assert second.content[0].input == {"command": "cat f.txt"} and second.content[0].id != tool.id
    result = {
        "type": "tool_result",
        "tool_use_id": second.content[0].id,
        "content": [{"type": "text", "text": "hi"}],
    }
    messages[-1]["content"][0].pop("cache_control")  # it moves between turns, as Claude Code's does
    messages += [echo(second), {"role": "user", "content": [result]}]
    async with claude.messages.stream(messages=messages, **ask) as stream:
        deltas = [e.delta.text async for e in stream if e.type == "content_block_delta"]
        third = await stream.get_final_message()
    assert third.stop_reason == "end_turn" and third.content[0].text == "".join(deltas) == texts[2]

    (traj,) = await trajectories(server, sid)  # one segment: each request extended the last
    assert traj["drift"] is None and traj["num_turns"] == 3 and traj["reason"] == "start"
    assert model_segments(traj) == [codec.encode(t) + codec.eot_ids for t in texts]
    assert third.usage.input_tokens == len(traj["prompt_ids"]) + len(traj["response_ids"]) - len(
        model_segments(traj)[-1]
    )


async def test_context_error_count_tokens_and_head(serve, codec) -> None:  # noqa: F811
    server = await serve(scripted(codec, {"cx": ["hi"]}), codec)
    sid = await new_session(server, request_id="cx", max_context_tokens=40)
    claude = client(server, sid)
    long = [{"role": "user", "content": "Please read this long task description carefully. " * 8}]
    counted = await claude.messages.count_tokens(model="m", messages=long, system="Be brief.", tools=[BASH])
    with pytest.raises(anthropic.BadRequestError) as info:
        await claude.messages.create(
            model="m", max_tokens=10, messages=long, system="Be brief.", tools=[BASH]
        )
    assert info.value.status_code == 400
    assert info.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {counted.input_tokens} tokens > 40 maximum",
        },
    }
    short = [{"role": "user", "content": "hi"}]
    assert (await claude.messages.count_tokens(model="m", messages=short)).input_tokens == len(
        codec.prompt_ids(short)
    )
    async with httpx.AsyncClient(base_url=server.url) as http:  # Claude Code's probe at start
        assert (await http.head(f"/sessions/{sid}")).status_code == 200
        assert (await http.head("/sessions/nope")).status_code == 404
        r = await http.post(f"/sessions/{sid}/v1/messages?beta=true", json={"max_tokens": 5, "messages": []})
        assert r.status_code == 400 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error"
        r = await http.post("/sessions/nope/v1/messages", json={"max_tokens": 5, "messages": short})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


async def test_the_gateway_token_is_taken_as_x_api_key(serve, codec) -> None:  # noqa: F811
    server = await serve(scripted(codec, {"k": ["hi", "ho"]}), codec, token="s3cret")
    sid = await new_session(server, token="s3cret", request_id="k")
    short = [{"role": "user", "content": "x"}]
    with pytest.raises(anthropic.AuthenticationError) as info:
        await client(server, sid, api_key="wrong").messages.create(model="m", max_tokens=5, messages=short)
    assert info.value.body["error"]["type"] == "authentication_error"
    reply = await client(server, sid, api_key="s3cret").messages.create(
        model="m", max_tokens=5, messages=short
    )
    assert reply.content[0].text == "hi"
    # ANTHROPIC_AUTH_TOKEN (a bearer token) works as well.
    bearer = client(server, sid, api_key=None, auth_token="s3cret")
    assert (await bearer.messages.create(model="m", max_tokens=5, messages=short)).content[0].text == "ho"


async def test_real_smollm2_call_streams_with_max_tokens_clamped(serve, smol_engine, codec) -> None:  # noqa: F811
    server = await serve(smol_engine, codec)
    sampling = {"temperature": 0, "max_tokens": 8}
    sid = await new_session(server, sampling=sampling, client_sampling=["max_tokens"])
    messages = [{"role": "user", "content": "Count from 1 to 50."}]
    async with client(server, sid).messages.stream(model="m", max_tokens=32000, messages=messages) as stream:
        message = await stream.get_final_message()
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
    assert message.usage.input_tokens == len(codec.prompt_ids(messages))
    (traj,) = await trajectories(server, sid)
    assert traj["prompt_ids"] == codec.prompt_ids(messages) and len(traj["response_ids"]) == 8
    assert codec.decode(traj["response_ids"]) == message.content[0].text


async def test_a_rewritten_history_is_a_new_segment(serve, codec) -> None:  # noqa: F811
    texts = [call("ls"), "Two files.", "One file."]
    server = await serve(scripted(codec, {"rw": texts}), codec)
    sid = await new_session(server, request_id="rw")
    claude = client(server, sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "How many files?"}]
    first = await claude.messages.create(model="m", max_tokens=64, messages=messages, tools=[BASH])
    use = first.content[0]
    messages.append(echo(first))
    for output in ("a b", "a"):  # the same call answered twice: the second rewrites the first's result
        result = {"type": "tool_result", "tool_use_id": use.id, "content": output}
        await claude.messages.create(
            model="m",
            max_tokens=64,
            messages=[*messages, {"role": "user", "content": [result]}],
            tools=[BASH],
        )
    async with httpx.AsyncClient(base_url=server.url) as http:
        summary = (await http.get(f"/sessions/{sid}")).json()
    assert [(s["reason"], s["turns"]) for s in summary["segments"]] == [("start", 2), ("rollback", 1)]
    first_segment, rolled = await trajectories(server, sid)
    assert rolled["prompt_ids"][: len(first_segment["prompt_ids"])] == first_segment["prompt_ids"]
