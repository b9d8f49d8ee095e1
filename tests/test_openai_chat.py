"""OpenAIChatModel against a stand-in `/v1/chat/completions` server on 127.0.0.1.

Why a stand-in: this machine has no internet, so no real OpenAI-compatible endpoint can be reached,
and the project's own gateway comes later. The stand-in is a real HTTP server (FastAPI + uvicorn)
speaking the chat-completions JSON, so the real `openai` SDK, its HTTP stack and our retry loop all run
for real; only the model behind the endpoint is scripted (replies, failures, delays).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from http_helpers import serve_app
from uniagent.errors import EngineError
from uniagent.models.openai_chat import OpenAIChatModel
from uniagent.parsers import ToolCall, get_parser

SECRET = "sk-test-secret-0123456789"
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


@dataclass
class Script:
    """What the stand-in does next; tests set it, the server thread reads it."""

    failures: list[int] = field(default_factory=list)
    delay_s: float = 0.0
    message: dict[str, Any] = field(default_factory=lambda: {"role": "assistant", "content": "hello"})
    finish_reason: str = "stop"
    seen: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)


def make_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        script.seen.append(body)
        script.auth.append(request.headers.get("authorization"))
        if script.delay_s:
            await asyncio.sleep(script.delay_s)
        if script.failures:
            status = script.failures.pop(0)
            # Echo the key back, as some providers do, to check that we redact it.
            error = {"message": f"scripted failure for key {SECRET}", "type": "scripted", "code": None}
            return JSONResponse({"error": error}, status_code=status)
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": script.message, "finish_reason": script.finish_reason}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        }

    return app


@pytest.fixture(scope="module")
def server():
    script_holder: dict[str, Script] = {"script": Script()}

    class Proxy:
        def __getattr__(self, name: str) -> Any:
            return getattr(script_holder["script"], name)

    with serve_app(make_app(Proxy())) as url:  # type: ignore[arg-type]
        yield f"{url}/v1", script_holder


@pytest.fixture
def endpoint(server):
    base_url, holder = server
    holder["script"] = Script()
    return base_url, holder["script"]


def model(base_url: str, **options: Any) -> OpenAIChatModel:
    options.setdefault("api_key", SECRET)
    options.setdefault("backoff_s", 0.01)
    return OpenAIChatModel("stand-in-model", base_url=base_url, **options)


USER = [{"role": "user", "content": "hi"}]


async def test_plain_reply(endpoint):
    base_url, script = endpoint
    chat = model(base_url, temperature=0.3, max_tokens=50)
    turn = await chat.query(USER)
    assert (turn.text, turn.tool_calls, turn.finish_reason, turn.format_error) == ("hello", [], "stop", None)
    assert turn.message == {"role": "assistant", "content": "hello"}
    assert (turn.prompt_tokens, turn.completion_tokens) == (7, 3)
    assert turn.metrics["latency_s"] > 0 and turn.metrics["attempts"] == 1
    assert chat.trainable is False
    assert script.seen[0]["temperature"] == 0.3 and script.seen[0]["max_tokens"] == 50
    assert "tools" not in script.seen[0]
    assert script.auth == [f"Bearer {SECRET}"]
    await chat.aclose()


async def test_retries_on_429_and_5xx_then_succeeds(endpoint, caplog):
    base_url, script = endpoint
    script.failures = [429, 500, 503]
    with caplog.at_level(logging.WARNING):
        turn = await model(base_url, max_retries=3).query(USER)
    assert turn.text == "hello"
    assert turn.metrics["attempts"] == 4
    assert len(script.seen) == 4
    assert "retrying" in caplog.text and SECRET not in caplog.text


async def test_gives_up_after_max_retries(endpoint, caplog):
    base_url, script = endpoint
    script.failures = [500] * 10
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(EngineError, match="after 3 attempts: HTTP 500") as info,
    ):
        await model(base_url, max_retries=2).query(USER)
    assert len(script.seen) == 3
    assert SECRET not in str(info.value) and SECRET not in caplog.text
    assert info.value.__cause__ is None and info.value.__suppress_context__


async def test_client_errors_are_not_retried(endpoint):
    base_url, script = endpoint
    script.failures = [401]
    with pytest.raises(EngineError, match=r"HTTP 401 \(check the API key\)") as info:
        await model(base_url, max_retries=3).query(USER)
    assert len(script.seen) == 1
    assert SECRET not in str(info.value) and "***" in str(info.value)


async def test_timeout_is_retried_then_reported(endpoint):
    base_url, script = endpoint
    script.delay_s = 2.0
    started = time.perf_counter()
    with pytest.raises(EngineError, match=r"after 2 attempts: request timed out after 0.3s"):
        await model(base_url, timeout=0.3, max_retries=1).query(USER)
    assert time.perf_counter() - started < 1.5
    assert len(script.seen) == 2


async def test_connection_errors_are_retried_then_reported():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here any more
    with pytest.raises(EngineError, match="after 2 attempts: cannot connect"):
        await model(f"http://127.0.0.1:{port}/v1", max_retries=1).query(USER)


async def test_native_tool_calls_round_trip(endpoint):
    base_url, script = endpoint
    wire_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
    }
    script.message = {"role": "assistant", "content": None, "tool_calls": [wire_call]}
    script.finish_reason = "tool_calls"
    chat = model(base_url)
    turn = await chat.query(USER, tools=[BASH_TOOL])
    assert script.seen[0]["tools"] == [BASH_TOOL]
    assert turn.tool_calls == [ToolCall(name="bash", arguments={"command": "ls"}, id="call_1")]
    assert turn.finish_reason == "stop" and turn.format_error is None
    assert turn.message == {"role": "assistant", "content": "", "tool_calls": [wire_call]}

    history = [*USER, turn.message, {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}]
    script.message = {"role": "assistant", "content": "done"}
    script.finish_reason = "stop"
    assert (await chat.query(history, tools=[BASH_TOOL])).text == "done"
    assert script.seen[1]["messages"][1]["tool_calls"] == [wire_call]
    assert script.seen[1]["messages"][2]["tool_call_id"] == "call_1"


async def test_malformed_tool_arguments_become_a_format_error(endpoint):
    base_url, script = endpoint
    bad = {"id": "call_9", "type": "function", "function": {"name": "bash", "arguments": '{"command": '}}
    script.message = {"role": "assistant", "content": None, "tool_calls": [bad]}
    turn = await model(base_url).query(USER, tools=[BASH_TOOL])
    assert turn.tool_calls == []
    assert "not valid JSON" in turn.format_error
    assert turn.message["tool_calls"] == [bad]  # history keeps what the model actually said


async def test_text_parser_for_endpoints_without_tool_support(endpoint):
    base_url, script = endpoint
    parser = get_parser("hermes")
    text = "Let me look.\n" + parser.render_call(ToolCall(name="bash", arguments={"command": "ls"}))
    script.message = {"role": "assistant", "content": text}
    turn = await model(base_url, parser=parser).query(USER, tools=[BASH_TOOL])
    assert "tools" not in script.seen[0]
    assert script.seen[0]["messages"][0]["role"] == "system"
    assert "bash" in script.seen[0]["messages"][0]["content"]
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("bash", {"command": "ls"})]
    assert turn.thought.strip() == "Let me look."
    assert turn.message == {"role": "assistant", "content": text}


async def test_key_from_env_and_never_in_repr(endpoint, monkeypatch):
    base_url, script = endpoint
    monkeypatch.setenv("STAND_IN_KEY", "sk-from-env-42")
    chat = OpenAIChatModel("stand-in-model", base_url=base_url, api_key_env="STAND_IN_KEY")
    await chat.query(USER)
    assert script.auth == ["Bearer sk-from-env-42"]
    assert "sk-from-env-42" not in repr(chat) and "***" in repr(chat)
    assert SECRET not in repr(model(base_url))


def test_missing_key_for_the_official_endpoint_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(EngineError, match="OPENAI_API_KEY"):
        OpenAIChatModel("gpt-x")


def test_backoff_grows_and_is_bounded():
    chat = OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1", backoff_s=1.0, backoff_max_s=5.0)
    delays = [chat._backoff(attempt) for attempt in (1, 2, 3, 10)]
    assert 0.5 <= delays[0] <= 1.0 and 1.0 <= delays[1] <= 2.0 and 2.0 <= delays[2] <= 4.0
    assert 2.5 <= delays[3] <= 5.0
    assert chat._backoff(1, retry_after="3") == 3.0 and chat._backoff(1, retry_after="60") == 5.0
