"""The gateway over real engines, driven by the real `openai` SDK and raw HTTP.

LocalEngine runs the real SmolLM2 (session fixture `smol_engine`) where generation itself is under
test (token exactness, streaming, caps); ReplayEngine scripts exact outputs (tool calls, rewritten
histories, 50 concurrent sessions) so those tests are fast and deterministic.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from uniagent.errors import UniAgentError
from uniagent.gateway import Gateway, SessionConfig, check_bind
from uniagent.gateway.server import GatewayServer
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.replay import RecordingEngine, ReplayEngine, ReplayRecord
from uniagent.tokens import ChatCodec

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def scripted(codec: ChatCodec, turns: dict[str, list[str]], **options: Any) -> ReplayEngine:
    """A real ReplayEngine answering each request id with its texts in order (any prompt)."""
    records = []
    for rid, texts in turns.items():
        for i, text in enumerate(texts):
            ids = codec.encode(text) + codec.eot_ids
            records.append(ReplayRecord(rid, Generation(ids, [-0.5] * len(ids), "stop"), i, None, "0" * 64))
    return ReplayEngine(records, match="request", strict=False, **options)


@pytest_asyncio.fixture(loop_scope="session")
async def serve() -> AsyncIterator[Any]:
    servers: list[GatewayServer] = []

    async def start(engine, codec, **options) -> GatewayServer:
        server = GatewayServer(Gateway(engine, codec, **options))
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


async def new_session(server: GatewayServer, token: str | None = None, **config: Any) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
        r = await http.post("/sessions", json=config)
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["base_url"] == server.session_url(body["session_id"])
        return body["session_id"]


async def trajectories(server: GatewayServer, sid: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.get(f"/sessions/{sid}/trajectories")
        assert r.status_code == 200, r.text
        return r.json()


def echo(message: Any) -> dict[str, Any]:
    """What a client sends back: the SDK's message as a dict."""
    return message.model_dump(exclude_none=True)


def model_segments(traj: dict[str, Any]) -> list[list[int]]:
    return [traj["response_ids"][s["start"] : s["end"]] for s in traj["spans"] if s["kind"] == "model"]


# -- token exactness with the real model ---------------------------------------------------------


async def test_openai_sdk_multi_turn_is_token_exact(serve, smol_engine, codec) -> None:
    server = await serve(smol_engine, codec)
    sid = await new_session(server, sampling={"temperature": 0, "max_tokens": 5})
    client = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused")
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Name a colour."}]
    first_prompt = codec.prompt_ids(messages)
    generated: list[list[float]] = []
    for follow_up in ("Another one.", "And a third."):
        resp = await client.chat.completions.create(model="smol", messages=messages, logprobs=True)
        generated.append([t.logprob for t in resp.choices[0].logprobs.content])
        messages += [echo(resp.choices[0].message), {"role": "user", "content": follow_up}]
    resp = await client.chat.completions.create(model="smol", messages=messages)
    assert resp.usage.prompt_tokens > len(first_prompt)

    (traj,) = await trajectories(server, sid)
    assert traj["drift"] is None and traj["num_turns"] == 3
    assert traj["prompt_ids"] == first_prompt
    segments = model_segments(traj)
    assert len(segments) == 3 and len(segments[-1]) == resp.usage.completion_tokens
    # Model tokens keep the engine's logprobs; context tokens are mask 0 with logprob 0.
    logprobs = [
        traj["response_logprobs"][s["start"] : s["end"]] for s in traj["spans"] if s["kind"] == "model"
    ]
    assert logprobs[:2] == generated
    for span in traj["spans"]:
        mask = traj["response_mask"][span["start"] : span["end"]]
        assert set(mask) == {1 if span["kind"] == "model" else 0}
    context = [traj["response_ids"][s["start"] : s["end"]] for s in traj["spans"] if s["kind"] == "context"]
    assert "Another one." in codec.decode([t for seg in context for t in seg])


async def test_streaming_delivers_chunks_as_tokens_are_generated(serve, smol_engine, codec) -> None:
    server = await serve(smol_engine, codec)
    sid = await new_session(
        server, sampling={"temperature": 0, "max_tokens": 10}, client_sampling=["max_tokens"]
    )
    client = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused")
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Tell me about the sea."}]
    started = time.perf_counter()
    arrivals: list[float] = []
    text, finish = "", None
    stream = await client.chat.completions.create(
        model="smol", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    usage = None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta.content or ""
        if delta:
            arrivals.append(time.perf_counter() - started)
            text += delta
        finish = chunk.choices[0].finish_reason or finish
    assert len(arrivals) >= 4, "one chunk per token (or a few), not one at the end"
    # Real streaming: the first content arrives well before the last one (tokens take real time).
    assert arrivals[0] < arrivals[-1] * 0.6
    assert finish == "length" and usage is not None and usage.completion_tokens == 10

    (traj,) = await trajectories(server, sid)
    (segment,) = model_segments(traj)
    assert codec.decode(segment) == text, "the streamed text is exactly the recorded tokens"
    # The conversation continues on the same chain, token-exact.
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Shorter."}]
    await client.chat.completions.create(model="smol", messages=messages, max_tokens=2)
    (traj,) = await trajectories(server, sid)
    assert traj["num_turns"] == 2 and traj["drift"] is None


async def test_local_engine_on_token_streams_every_token_before_the_result(smol_engine, codec) -> None:
    seen: list[tuple[int, float]] = []
    prompt = codec.prompt_ids([{"role": "user", "content": "Hi"}])
    sampling = SamplingParams(temperature=0, max_tokens=4)
    gen = await smol_engine.generate(
        prompt, sampling, "on-token", on_token=lambda t, lp: seen.append((t, lp))
    )
    assert [t for t, _ in seen] == gen.token_ids and [lp for _, lp in seen] == gen.logprobs


async def test_context_cap_ends_the_chain_with_length(serve, smol_engine, codec) -> None:
    server = await serve(smol_engine, codec)
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Count to twenty."}]
    cap = len(codec.prompt_ids(messages)) + 3
    sid = await new_session(server, sampling={"temperature": 0, "max_tokens": 64}, max_context_tokens=cap)
    client = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused", max_retries=0)
    resp = await client.chat.completions.create(model="smol", messages=messages)
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 3
    messages += [echo(resp.choices[0].message), {"role": "user", "content": "Go on."}]
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="smol", messages=messages)
    assert info.value.code == "context_length_exceeded"
    (traj,) = await trajectories(server, sid)
    assert len(traj["prompt_ids"]) + len(traj["response_ids"]) == cap and traj["drift"] is None


# -- scripted outputs ----------------------------------------------------------------------------


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def test_tool_calls_round_trip_token_exact(serve, codec) -> None:
    texts = [
        "I will list the files.\n" + call("bash", command="ls -la"),
        call("bash", command="cat README"),
        "The README says hello.",
    ]
    engine = scripted(codec, {"tools": texts})
    server = await serve(engine, codec)
    sid = await new_session(server, request_id="tools")
    client = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused")
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "What does the README say?"}]

    resp = await client.chat.completions.create(model="m", messages=messages, tools=[BASH])
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will list the files."
    (tc,) = choice.message.tool_calls
    assert tc.function.name == "bash" and json.loads(tc.function.arguments) == {"command": "ls -la"}
    messages += [echo(choice.message), {"role": "tool", "tool_call_id": tc.id, "content": "README\n"}]

    # Streamed: the SDK assembles the call from tool_calls deltas.
    stream = await client.chat.completions.create(model="m", messages=messages, tools=[BASH], stream=True)
    calls: dict[int, dict[str, str]] = {}
    content, finish = "", None
    async for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += d.id or ""
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and "<tool_call>" not in content
    assert calls[0]["name"] == "bash" and json.loads(calls[0]["arguments"]) == {"command": "cat README"}
    messages += [
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {
                    "id": calls[0]["id"],
                    "type": "function",
                    "function": {"name": "bash", "arguments": calls[0]["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "hello"},
    ]
    resp = await client.chat.completions.create(model="m", messages=messages, tools=[BASH])
    assert resp.choices[0].finish_reason == "stop" and resp.choices[0].message.content == texts[2]

    (traj,) = await trajectories(server, sid)
    assert traj["drift"] is None and traj["num_turns"] == 3
    assert model_segments(traj) == [codec.encode(t) + codec.eot_ids for t in texts]
    model = [lp for lp, m in zip(traj["response_logprobs"], traj["response_mask"], strict=True) if m]
    assert set(model) == {-0.5}
    # SmolLM2's template has no native tools: they travel in the system prompt, in the parser's format.
    assert "<tools>" in codec.decode(traj["prompt_ids"])


async def test_rewritten_history_starts_a_new_chain(serve, codec) -> None:
    engine = scripted(codec, {"rw": ["Paris.", "Berlin.", "Rome.", "Madrid."]})
    server = await serve(engine, codec)
    sid = await new_session(server, request_id="rw")
    client = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused")
    base = [SYSTEM, {"role": "user", "content": "Capital of France?"}]
    r1 = await client.chat.completions.create(model="m", messages=base)
    extended = [*base, echo(r1.choices[0].message), {"role": "user", "content": "Of Germany?"}]
    await client.chat.completions.create(model="m", messages=extended)
    # The harness edits an earlier message (e.g. summarizes history): a new chain from scratch.
    rewritten = [SYSTEM, {"role": "user", "content": "Capital of Italy?"}]
    r3 = await client.chat.completions.create(model="m", messages=rewritten)
    # Extending the first chain again still finds it (sub-agents may interleave conversations).
    r2_msg = {"role": "assistant", "content": "Berlin."}
    await client.chat.completions.create(
        model="m", messages=[*extended, r2_msg, {"role": "user", "content": "Of Spain?"}]
    )
    assert r3.choices[0].message.content == "Rome."
    chains = await trajectories(server, sid)
    assert [c["num_turns"] for c in chains] == [3, 1]
    assert all(c["drift"] is None for c in chains)
    assert chains[1]["prompt_ids"] == codec.prompt_ids(rewritten)
    async with httpx.AsyncClient(base_url=server.url) as http:
        summary = (await http.get(f"/sessions/{sid}")).json()
    assert summary["chains"] == 2 and summary["requests"] == 4


async def test_trusted_sampling_overrides_the_client_unless_allowed(serve, codec) -> None:
    recorder = RecordingEngine(scripted(codec, {"s1": ["a"], "s2": ["b"]}))
    server = await serve(recorder, codec)
    trusted = {"temperature": 0.3, "max_tokens": 7, "seed": 11}
    s1 = await new_session(server, request_id="s1", sampling=trusted)
    s2 = await new_session(server, request_id="s2", sampling=trusted, client_sampling=["max_tokens"])
    for sid in (s1, s2):
        client = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused")
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], temperature=1.9, max_tokens=99, seed=5
        )
    used = {r.request_id: r.sampling for r in recorder.records}
    assert used["s1"]["temperature"] == 0.3 and used["s1"]["max_tokens"] == 7 and used["s1"]["seed"] == 11
    assert used["s2"]["temperature"] == 0.3 and used["s2"]["max_tokens"] == 99
    assert codec.stop_token_ids[0] in used["s1"]["stop_token_ids"]


async def test_fifty_concurrent_sessions_keep_their_own_tokens(serve, codec) -> None:
    n = 50
    engine = scripted(codec, {f"c{i}": [f"reply {i} one", f"reply {i} two"] for i in range(n)}, delay_s=0.05)
    server = await serve(engine, codec)

    async def one(i: int) -> tuple[str, str]:
        sid = await new_session(server, request_id=f"c{i}", session_id=f"conc-{i}")
        client = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused")
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"session {i}"}]
        r = await client.chat.completions.create(model="m", messages=messages)
        messages += [echo(r.choices[0].message), {"role": "user", "content": "again"}]
        r = await client.chat.completions.create(model="m", messages=messages, stream=i % 2 == 0)
        if i % 2 == 0:
            text = "".join([c.choices[0].delta.content or "" async for c in r if c.choices])
        else:
            text = r.choices[0].message.content
        return sid, text

    started = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.perf_counter() - started
    assert [text for _, text in results] == [f"reply {i} two" for i in range(n)]
    assert elapsed < 30, f"50 sessions x 2 turns took {elapsed:.1f}s"
    for i, (sid, _) in enumerate(results):
        (traj,) = await trajectories(server, sid)
        assert traj["drift"] is None and traj["num_turns"] == 2
        assert codec.decode(traj["prompt_ids"]).count(f"session {i}") == 1


# -- session API, auth and errors ----------------------------------------------------------------


async def test_finalize_abort_and_idle_expiry(serve, codec) -> None:
    engine = scripted(codec, {"f": ["done"], "a": ["x"]})
    server = await serve(engine, codec, idle_timeout_s=0.3)
    fin = await new_session(server, request_id="f")
    client = AsyncOpenAI(base_url=server.session_url(fin), api_key="unused", max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post(f"/sessions/{fin}/finalize", json={"reward": 1.0})
        assert r.status_code == 200 and r.json()["state"] == "finalized" and r.json()["reward"] == 1.0
        assert r.json()["trajectories"][0]["drift"] is None
        with pytest.raises(openai.ConflictError):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        ab = await new_session(server, request_id="a")
        assert (await http.post(f"/sessions/{ab}/abort")).json()["state"] == "aborted"
        r = await http.post(
            f"/sessions/{ab}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_closed"
        await asyncio.sleep(0.5)
        r = await http.get(f"/sessions/{fin}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"


async def test_malformed_requests_get_openai_style_4xx(serve, codec) -> None:
    server = await serve(scripted(codec, {"m": ["ok"]}), codec)
    sid = await new_session(server, request_id="m")
    url = f"/sessions/{sid}/v1/chat/completions"
    user = [{"role": "user", "content": "hi"}]
    bad_bodies: list[tuple[str, Any, int]] = [
        (url, b"{not json", 400),
        (url, b"", 400),
        (url, b"[1, 2]", 400),
        (url, {"model": "m"}, 400),
        (url, {"messages": "hello"}, 400),
        (url, {"messages": []}, 400),
        (url, {"messages": [{"content": "no role"}]}, 400),
        (url, {"messages": [{"role": "wizard", "content": "x"}]}, 400),
        (url, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400),
        (url, {"messages": [{"role": "user", "content": 5}]}, 400),
        (url, {"messages": user, "n": 3}, 400),
        (url, {"messages": user, "stop": ["\n"]}, 400),
        (url, {"messages": user, "tools": "bash"}, 400),
        (
            url,
            {"messages": user, "tools": [{"type": "function", "function": {"description": "no name"}}]},
            400,
        ),
        (url, {"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": 1}]}]}, 400),
        ("/sessions/nope/v1/chat/completions", {"messages": user}, 404),
        ("/sessions", {"sampling": {"temperature": -1}}, 400),
        ("/sessions", {"unknown_field": 1}, 400),
        ("/sessions", {"client_sampling": ["logit_bias"]}, 400),
        ("/sessions", {"session_id": "has/slash"}, 400),
        (f"/sessions/{sid}/finalize", {"reward": "high"}, 400),
        ("/no/such/route", {}, 404),
    ]
    async with httpx.AsyncClient(base_url=server.url) as http:
        for path, body, status in bad_bodies:
            if isinstance(body, bytes):
                r = await http.post(path, content=body, headers={"content-type": "application/json"})
            else:
                r = await http.post(path, json=body)
            assert r.status_code == status, (path, body, r.status_code, r.text)
            error = r.json()["error"]
            assert error["message"] and error["type"] and "Traceback" not in r.text, (body, r.text)
        r = await http.get(f"/sessions/{sid}/v1/chat/completions")
        assert r.status_code == 405 and "error" in r.json()
        # After all that, the session still works.
        r = await http.post(url, json={"messages": user})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    client = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": 3}])  # type: ignore[misc]


async def test_engine_failure_is_a_json_5xx_without_traceback(serve, codec) -> None:
    engine = ReplayEngine([], match="request", strict=True)  # no recordings: every call fails
    server = await serve(engine, codec)
    sid = await new_session(server)
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post(
            f"/sessions/{sid}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_error" and "Traceback" not in r.text


async def test_token_required_off_loopback_and_checked_when_set(serve, codec) -> None:
    with pytest.raises(UniAgentError, match="token"):
        check_bind("0.0.0.0", None)
    with pytest.raises(UniAgentError, match="token"):
        GatewayServer(Gateway(scripted(codec, {}), codec), host="0.0.0.0")
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", "secret")

    server = await serve(scripted(codec, {"t": ["hi"]}), codec, token="s3cret")
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.post("/sessions", json={})).status_code == 401
        r = await http.post("/sessions", json={}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert (await http.get("/health")).status_code == 200
    sid = await new_session(server, token="s3cret", request_id="t")
    bad = AsyncOpenAI(base_url=server.session_url(sid), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    good = AsyncOpenAI(base_url=server.session_url(sid), api_key="s3cret")
    r = await good.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert r.choices[0].message.content == "hi"


def test_cli_refuses_a_public_bind_without_a_token() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "uniagent.cli", "gateway", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "UNIAGENT_GATEWAY_TOKEN": ""},
    )
    assert proc.returncode == 2 and "token" in proc.stderr and "Traceback" not in proc.stderr


def test_session_config_rejects_unknown_client_sampling() -> None:
    with pytest.raises(ValueError):
        SessionConfig(client_sampling=["stop"])
