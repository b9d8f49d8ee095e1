"""The gateway's OpenAI Responses front (`/sessions/{id}/v1/responses`), what the Codex CLI speaks.

The wire itself is tested on the real first request Codex 0.171.0 sent (recorded from the real
CLI, `fixtures/gateway/`) and on the items it sends later; the endpoint is driven by the official
`openai` SDK (`client.responses.create`, streamed and not) against the real gateway (uvicorn on
loopback) over the real ReplayEngine (scripted generations) and the real SmolLM2 codec, plus one
real SmolLM2 call (LocalEngine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from test_gateway import call, model_segments, new_session, scripted, serve, trajectories  # noqa: F401  (serve: fixture)
from uniagent.gateway.sessions import GatewayError
from uniagent.gateway.wire.responses import OpenAIResponses
from uniagent.parsers.base import ToolCall
from wire_helpers import events, wire_stand_ins

FIXTURES = Path(__file__).parent / "fixtures" / "gateway"
WIRE = OpenAIResponses()
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}


def codex_request() -> dict[str, Any]:
    return json.loads((FIXTURES / "codex_0.171.0_min.json").read_text())


turn, exchange = wire_stand_ins(prompt_tokens=30, n=5)


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        out.append(data)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


# -- the wire on plain bodies ------------------------------------------------------------------


def test_codexs_real_first_request_parses() -> None:
    req = WIRE.parse(codex_request())  # store, include, reasoning, prompt_cache_key...: ignored
    assert [m["role"] for m in req.messages] == ["system", "user"]  # developer -> system
    assert req.messages[1]["content"] == "Create f.txt containing hi"
    assert [t["function"]["name"] for t in req.tools] == ["exec_command", "write_stdin"]
    assert "strict" not in req.tools[0]["function"]
    assert req.stream and req.sampling == {"temperature": None, "top_p": None, "max_tokens": None}


def test_later_items_map_onto_chat_messages() -> None:
    body = {
        "instructions": "Be brief.",
        "input": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Sys."}],
            },
            {"role": "user", "content": "Create f.txt"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_2",
                "content": [{"type": "output_text", "text": "On it.", "annotations": []}],
            },
            {
                "type": "function_call",
                "id": "fc_call_1",
                "status": "completed",
                "call_id": "call_1",
                "name": "exec_command",
                "arguments": '{"cmd": "echo hi > f.txt"}',
            },
            {
                "type": "function_call_output",
                "id": "fco_1",
                "call_id": "call_1",
                "output": "Process exited with code 0",
            },
            {
                "type": "function_call",
                "call_id": "call_2",
                "name": "exec_command",
                "arguments": '{"cmd": "ls"}',
            },
            {
                "type": "function_call_output",
                "call_id": "call_2",
                "output": [{"type": "input_text", "text": "f.txt"}],
            },
        ],
        "tools": [
            EXEC,
            {"type": "namespace", "name": "multi_agent_v1", "tools": [dict(EXEC, name="spawn_agent")]},
            {"type": "web_search", "external_web_access": True},
        ],
        "max_output_tokens": 64,
        "temperature": 0.5,
    }
    req = WIRE.parse(body)
    roles = [m["role"] for m in req.messages]
    assert roles == ["system", "system", "user", "assistant", "tool", "assistant", "tool"]
    assert req.messages[3]["content"] == "On it."  # the call joins the assistant turn before it
    assert req.messages[3]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "exec_command", "arguments": {"cmd": "echo hi > f.txt"}},
        }
    ]
    assert req.messages[4] == {
        "role": "tool",
        "content": "Process exited with code 0",
        "tool_call_id": "call_1",
    }
    assert req.messages[5]["content"] == "" and req.messages[6]["content"] == "f.txt"
    assert [t["function"]["name"] for t in req.tools] == ["exec_command", "spawn_agent"]
    assert req.sampling == {"temperature": 0.5, "top_p": None, "max_tokens": 64} and not req.stream
    assert WIRE.parse({"input": "hi"}).messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input": []}, "non-empty list"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "'item_reference'"),
        ({"input": [{"role": "tool", "content": "x"}]}, "role must be"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "'input_image'",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "call_id"),
        ({"input": "x", "instructions": 3}, "instructions"),
        ({"input": "x", "previous_response_id": "resp_1"}, "whole history"),
    ],
)
def test_malformed_requests_say_what_to_fix(body: dict[str, Any], says: str) -> None:
    with pytest.raises(GatewayError, match=says):
        WIRE.parse(body)


def test_answers_and_errors_in_the_responses_shape() -> None:
    calls = [ToolCall("exec_command", {"cmd": "ls"}, "call_4")]
    body = WIRE.response(turn("Looking.", calls, "tool_calls"), exchange())
    assert body["object"] == "response" and body["status"] == "completed"
    message, fc = body["output"]
    assert message["content"][0]["text"] == "Looking." and message["role"] == "assistant"
    assert fc == {
        "id": "fc_call_4",
        "type": "function_call",
        "status": "completed",
        "call_id": "call_4",
        "name": "exec_command",
        "arguments": '{"cmd": "ls"}',
    }
    assert body["usage"]["input_tokens"] == 30 and body["usage"]["total_tokens"] == 35
    assert [i["type"] for i in WIRE.response(turn("", calls, "tool_calls"), exchange())["output"]] == [
        "function_call"
    ]
    cut = WIRE.response(turn("cut", finish="length"), exchange())
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
    error = WIRE.error(GatewayError("too long", 400, "context_length_exceeded"))["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "input"


async def test_the_stream_is_the_responses_event_sequence() -> None:
    calls = [ToolCall("exec_command", {"cmd": "ls"}, "call_1")]
    done = turn("On it.", calls, "tool_calls")
    raw = b"".join(
        [b async for b in WIRE.stream(events(("text", "On "), ("text", "it.\n"), ("done", done)), exchange())]
    )
    sse = parse_sse(raw)
    assert [e["type"] for e in sse] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert sse[6]["text"] == "On it.\n" and sse[10]["delta"] == '{"cmd": "ls"}'
    assert sse[9]["output_index"] == 1 and sse[9]["item"]["status"] == "in_progress"
    final = sse[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"] and final["usage"][
        "output_tokens"
    ] == 5
    raw = b"".join(
        [
            b
            async for b in WIRE.stream(
                events(("error", GatewayError("down", 503, "engine_error"))), exchange()
            )
        ]
    )
    failed = parse_sse(raw)[-1]
    assert failed["type"] == "response.failed" and failed["response"]["error"]["code"] == "engine_error"


# -- the endpoint, with the openai SDK as the client -------------------------------------------


def echo(response: Any) -> list[dict[str, Any]]:
    """What Codex sends back: the output items of its last response."""
    return [item.model_dump(exclude_none=True) for item in response.output]


async def test_function_call_conversation_is_token_exact(serve, codec) -> None:  # noqa: F811
    texts = [
        "I'll create it.\n" + call("exec_command", cmd="echo hi > f.txt"),
        call("exec_command", cmd="cat f.txt"),
        "Done: f.txt says hi.",
    ]
    server = await serve(scripted(codec, {"cx": texts}), codec)
    sid = await new_session(server, request_id="cx", sampling={"max_tokens": 64})
    codex = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused", max_retries=0)
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are Codex."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Create f.txt"}]},
    ]
    ask = {"model": "smollm2", "tools": [EXEC], "store": False}

    first = await codex.responses.create(input=items, **ask)
    message, fc = first.output
    assert message.type == "message" and first.status == "completed"
    assert first.output_text == "I'll create it."
    assert fc.type == "function_call" and json.loads(fc.arguments) == {"cmd": "echo hi > f.txt"}
    items += [*echo(first), {"type": "function_call_output", "call_id": fc.call_id, "output": "exit 0"}]

    # Streamed, as Codex always asks: raw events, then the SDK's accumulating stream helper.
    stream = await codex.responses.create(input=items, stream=True, **ask)
    kinds, second = [], None
    async for event in stream:
        kinds.append(event.type)
        second = event.response if event.type == "response.completed" else second
    assert kinds[0] == "response.created" and "response.function_call_arguments.done" in kinds
    (fc2,) = second.output
    assert json.loads(fc2.arguments) == {"cmd": "cat f.txt"} and fc2.call_id != fc.call_id
    items += [*echo(second), {"type": "function_call_output", "call_id": fc2.call_id, "output": "hi"}]
    async with codex.responses.stream(input=items, **ask) as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        third = await stream.get_final_response()
    assert third.output_text == "".join(deltas) == texts[2]

    (traj,) = await trajectories(server, sid)  # one segment: each request extended the last
    assert traj["drift"] is None and traj["num_turns"] == 3 and traj["reason"] == "start"
    assert model_segments(traj) == [codec.encode(t) + codec.eot_ids for t in texts]
    assert third.usage.input_tokens + third.usage.output_tokens == len(traj["prompt_ids"]) + len(
        traj["response_ids"]
    )


async def test_context_error_is_the_one_codex_understands(serve, codec) -> None:  # noqa: F811
    server = await serve(scripted(codec, {"cc": ["hi"]}), codec)
    sid = await new_session(server, request_id="cc", max_context_tokens=30)
    codex = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        await codex.responses.create(
            model="m", input="Please read this long task description carefully. " * 8
        )
    assert info.value.status_code == 400 and info.value.code == "context_length_exceeded"
    assert info.value.param == "input"


async def test_real_smollm2_call(serve, smol_engine, codec) -> None:  # noqa: F811
    server = await serve(smol_engine, codec)
    sid = await new_session(server, sampling={"temperature": 0, "max_tokens": 8})
    codex = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused", max_retries=0)
    response = await codex.responses.create(model="m", input="Count from 1 to 50.", max_output_tokens=32000)
    assert response.status == "incomplete" and response.usage.output_tokens == 8
    (traj,) = await trajectories(server, sid)
    assert traj["prompt_ids"] == codec.prompt_ids([{"role": "user", "content": "Count from 1 to 50."}])
    assert codec.decode(traj["response_ids"]) == response.output_text
