"""Rewritten histories through the gateway (issue 15, part 5): every generated token is kept.

A real gateway (uvicorn on loopback) driven by the real `openai` SDK, over the real ReplayEngine
scripted with generations whose logprobs are unique to each (`token_checks.Gen`), and the real
SmolLM2 codec. Each test sends the histories a harness might send — it drops a reply, rewrites
its last assistant message, rewrites an old tool result, condenses, strips earlier reasoning —
and checks the stored segments: every generated token in exactly one segment with mask 1 and its
engine logprob, no context token with mask 1. The dropped-generation counter uses the real
SmolLM2 LocalEngine, which streams and can be cancelled mid-generation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

import real_tokenizers as real
from test_gateway import BASH
from token_checks import REFUSES_BOOM, Gen, assert_every_generated_token_once
from uniagent.agent.result import EpisodeResult, ExitReason
from uniagent.errors import TemplateError
from uniagent.gateway import Gateway
from uniagent.gateway.server import GatewayServer
from uniagent.harness.session import attach_segments
from uniagent.models.base import Generation
from uniagent.models.replay import ReplayEngine, ReplayRecord
from uniagent.parsers import get_parser
from uniagent.tokens import ChatCodec, Trajectory

# Every real pair: Qwen3's own template (a think block the model writes, dropped from past turns),
# gpt-oss's (a channel header; stateful and rewriting), the append-only ones and Gemma's (no tool
# role), each with its own template and the shared ones of its family.
GATEWAY_PAIRS = tuple(real.PAIRS)


@pytest.fixture(scope="module", params=["smollm2", *GATEWAY_PAIRS])
def codec(request, codec):  # type: ignore[no-untyped-def]
    """SmolLM2's codec and real tokenizers with their templates, behind the gateway."""
    return real.codec_or_smol(request, codec)


@pytest.fixture(scope="module")
def smollm2_codec(smol_tokenizer) -> ChatCodec:  # type: ignore[no-untyped-def]
    """The codec of the real SmolLM2 engine (the tests that stream from it)."""
    return ChatCodec(smol_tokenizer)


def needs_tool_role(codec: ChatCodec) -> None:
    """Gemma's templates raise on a tool message (roles must alternate): those tests skip there.
    gpt-oss's takes a tool result after a call (`codec.renders_tool_role` asks after a plain turn)."""
    call = own_call(bash("ls"))
    try:
        codec.render([TASK, call, {"role": "tool", "tool_call_id": "c", "content": "x"}], [BASH])
    except TemplateError:
        pytest.skip("the template raises on the tool role (Gemma: roles must alternate user/assistant)")


SYSTEM = {"role": "system", "content": "You are an agent."}
TASK = {"role": "user", "content": "Fix the bug in calc.py."}


def opening(codec: ChatCodec) -> list[dict[str, Any]]:
    """The system prompt, where the template has a system role (gemma-2's raises on one)."""
    try:
        codec.render([SYSTEM, TASK])
    except TemplateError:
        return []
    return [SYSTEM]


def bash(command: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'bash', 'arguments': {'command': command}})}\n</tool_call>"


class Harness:
    """One gateway session whose engine answers with `texts` in order, each a unique generation."""

    def __init__(self, server: GatewayServer, sid: str, gen: Gen) -> None:
        self.server, self.sid, self.gen = server, sid, gen
        self.client = AsyncOpenAI(base_url=server.session_url(sid), api_key="unused", max_retries=0)

    async def send(self, messages: list[dict[str, Any]], tools: bool = False) -> dict[str, Any]:
        """The reply, as the client would put it back into its history."""
        extra = {"tools": [BASH]} if tools else {}
        resp = await self.client.chat.completions.create(model="m", messages=messages, **extra)
        return resp.choices[0].message.model_dump(exclude_none=True)

    async def get(self, path: str = "") -> Any:
        async with httpx.AsyncClient(base_url=self.server.url) as http:
            r = await http.get(f"/sessions/{self.sid}{path}")
            assert r.status_code == 200, r.text
            return r.json()

    async def segments(self) -> list[Trajectory]:
        segments = [Trajectory.from_dict(t) for t in await self.get("/trajectories")]
        assert_every_generated_token_once(segments, self.gen)
        summary = await self.get()
        assert summary["generated_tokens"] == sum(s.num_model_tokens for s in segments)
        assert summary["untrainable_tokens"] == 0 and summary["dropped_generations"] == 0
        assert [(s["chain"], s["reason"]) for s in summary["segments"]] == [
            (s.chain, s.reason) for s in segments
        ]
        return segments


# gpt-oss calls a tool in a message of its own (harmony), not in its answer: the scripted
# `bash(...)` turns become its own call turns, read by the session's harmony parser.
OWN_CALL_FORMAT = {"gptoss-own": "harmony"}


def own_call(text: str) -> dict[str, Any] | None:
    """The assistant message calling the tools a hermes-format `text` calls (None: no call)."""
    parsed = get_parser("hermes").parse(text)
    if not parsed.calls:
        return None
    return {
        "role": "assistant",
        "content": parsed.thought,
        "tool_calls": [c.to_openai() for c in parsed.calls],
    }


@pytest_asyncio.fixture(loop_scope="session")
async def harness(codec: ChatCodec, request) -> AsyncIterator[Any]:  # type: ignore[no-untyped-def]
    servers: list[GatewayServer] = []
    call_format = OWN_CALL_FORMAT.get(request.node.callspec.params.get("codec", ""))

    async def start(
        texts: list[str], gateway_codec: ChatCodec | None = None, versions: list[int] | None = None
    ) -> Harness:
        """`versions`: the policy version each generation's tokens carry (default: none given)."""
        gen = Gen(codec)
        records = []
        for i, text in enumerate(texts):
            # as the template renders a model turn saying `text` (a call in its own format)
            ids, lps = gen.turn(text, message=own_call(text) if call_format else None)
            tags = None if versions is None else [versions[i]] * len(ids)
            records.append(ReplayRecord("h", Generation(ids, lps, "stop", tags), i, None, "0" * 64))
        engine = ReplayEngine(records, match="request", strict=False)
        server = await GatewayServer(Gateway(engine, gateway_codec or codec)).start()
        servers.append(server)
        async with httpx.AsyncClient(base_url=server.url) as http:
            r = await http.post("/sessions", json={"request_id": "h", "parser": call_format})
            assert r.status_code == 201, r.text
        return Harness(server, r.json()["session_id"], gen)

    yield start
    for server in servers:
        await server.stop()


def first_turn_end(seg: Trajectory) -> int:
    """Tokens of `seg` up to the end of its first model turn."""
    span = next(s for s in seg.spans if s.kind == "model")
    return len(seg.prompt_ids) + span.end


async def test_rewriting_the_last_assistant_rolls_back_to_the_exact_tokens(harness, codec) -> None:
    h = await harness(["I will read calc.py.", "It subtracts.", "It subtracts instead of adding.", "Fixed."])
    history = [*opening(codec), TASK]
    a1 = await h.send(history)
    history += [a1, {"role": "user", "content": "What did you find?"}]
    await h.send(history)
    # The harness rewrites its last assistant message (a2), then goes on.
    edited = {"role": "assistant", "content": "It subtracts (edited by the harness)."}
    history += [edited, {"role": "user", "content": "Go on."}]
    a3 = await h.send(history)
    history += [a3, {"role": "user", "content": "Finish."}]
    await h.send(history)  # extends the rollback segment

    first, second = await h.segments()
    assert (first.reason, first.chain, first.num_turns) == ("start", 0, 2)
    assert (second.reason, second.chain, second.num_turns) == ("rollback", 0, 2)
    cut = first_turn_end(first)
    # The new segment's prompt starts with the old segment's exact tokens (a1 as sampled) ...
    assert second.prompt_ids[:cut] == first.token_ids[:cut]
    # ... then the rest of the history as context: the rewritten a2 and the next user message.
    assert second.prompt_ids[cut:] == codec.continuation_ids(history[-5:-2])
    # Qwen3's own drops the past think block, gpt-oss ends a past answer with <|end|>: drift
    # of kind `template`, as the ReAct loop records it (test_conversation.py).
    if codec.kind.kind == "rewriting":
        assert all(s.drift is not None and s.drift_kind == "template" for s in (first, second))
    else:
        assert all(s.drift is None for s in (first, second))
    assert (await h.get())["chains"] == 1


async def test_a_dropped_reply_rolls_back_after_the_last_kept_turn(harness, codec) -> None:
    needs_tool_role(codec)
    # mini-swe-agent drops a reply it cannot parse and sends a format error instead.
    h = await harness([bash("ls"), "no tool call here", bash("cat calc.py")])
    history = [*opening(codec), TASK]
    a1 = await h.send(history, tools=True)
    assert a1["tool_calls"][0]["id"] == "call_1"  # one call-id format (parsers.call_id)
    history += [a1, {"role": "tool", "tool_call_id": "call_1", "content": "calc.py"}]
    await h.send(history, tools=True)
    history += [{"role": "user", "content": "Format error: call exactly one tool."}]
    a3 = await h.send(history, tools=True)
    assert a3["tool_calls"][0]["id"] == "call_2"

    first, second = await h.segments()
    assert [(s.reason, s.chain, s.num_turns) for s in (first, second)] == [
        ("start", 0, 2),
        ("rollback", 0, 1),
    ]
    cut = first_turn_end(first)
    assert second.prompt_ids[:cut] == first.token_ids[:cut]
    assert "no tool call here" not in codec.decode(second.token_ids)  # dropped by the harness ...
    assert "no tool call here" in codec.decode(first.response_ids)  # ... kept where it was generated


async def test_a_rewritten_old_tool_result_rolls_back_before_it(harness, codec) -> None:
    needs_tool_role(codec)
    h = await harness([bash("cat calc.py"), bash("sed -i s/-/+/ calc.py"), "Done."])
    history = [*opening(codec), TASK]
    a1 = await h.send(history, tools=True)
    history += [
        a1,
        {"role": "tool", "tool_call_id": "call_1", "content": "def add(a, b):\n    return a - b\n"},
    ]
    a2 = await h.send(history, tools=True)
    # The harness shortens the old tool result (observation truncation), keeps a2, adds its result.
    history[3] = {"role": "tool", "tool_call_id": "call_1", "content": "[output truncated]"}
    history += [a2, {"role": "tool", "tool_call_id": "call_2", "content": ""}]
    await h.send(history, tools=True)

    first, second = await h.segments()
    assert [(s.reason, s.num_turns) for s in (first, second)] == [("start", 2), ("rollback", 1)]
    cut = first_turn_end(first)
    assert second.prompt_ids[:cut] == first.token_ids[:cut]
    context = codec.decode(second.prompt_ids[cut:])
    assert "[output truncated]" in context and "sed -i" in context  # a2 is context here (mask 0)
    assert "return a - b" not in codec.decode(second.token_ids)


async def test_a_condensed_history_starts_a_new_chain_and_the_old_one_is_kept(harness, codec) -> None:
    h = await harness(["Reading.", "Found it.", "Fixing it now.", "Done."])
    history = [*opening(codec), TASK]
    for follow_up in ("Go on.", "Go on."):
        history += [await h.send(history), {"role": "user", "content": follow_up}]
    # The harness condenses: a summary replaces the old turns.
    condensed = [
        *opening(codec),
        {"role": "user", "content": "Summary: you found the bug in calc.py. Fix it."},
    ]
    a3 = await h.send(condensed)
    await h.send([*condensed, a3, {"role": "user", "content": "Finish."}])

    first, second = await h.segments()
    assert [(s.reason, s.chain, s.num_turns) for s in (first, second)] == [
        ("start", 0, 2),
        ("rewritten", 1, 2),
    ]
    assert second.prompt_ids == codec.prompt_ids(condensed)
    assert (await h.get())["chains"] == 2


async def test_stripped_reasoning_keeps_every_reply_with_its_thinking(harness, codec) -> None:
    replies = [f"<think>step {i}: I should look closer</think>Answer {i}." for i in range(3)]
    if "step 0" not in codec.decode(Gen(codec).turn(replies[0])[0]):
        pytest.skip("the template renders no reasoning in a model turn (DeepSeek-V3.1 without thinking)")
    h = await harness(replies)
    history = [*opening(codec), TASK]
    splits = "<think>" in codec.reply_format.opens  # Qwen3's own: the think block is the template's
    for i in range(3):
        reply = await h.send(history)
        if splits:  # the gateway hands the reasoning apart, as vLLM's reasoning parser does
            assert (reply["content"], reply["reasoning_content"]) == (
                f"Answer {i}.",
                f"step {i}: I should look closer",
            )
        else:
            assert reply["content"] == replies[i]
        # Qwen3-style: the harness sends earlier assistant turns with their reasoning removed.
        history += [{"role": "assistant", "content": f"Answer {i}."}, {"role": "user", "content": "Next."}]

    segments = await h.segments()
    if splits:  # the history the client sent back is the one the gateway handed out: one segment
        (seg,) = segments
        assert (seg.reason, seg.num_turns, seg.drift_kind) == ("start", 3, "template")
        assert all(f"step {i}" in codec.decode(seg.response_ids) for i in range(3))
        return
    assert [s.reason for s in segments] == ["start", "rewritten", "rewritten"]
    assert [s.num_turns for s in segments] == [1, 1, 1]
    for i, seg in enumerate(segments):  # each reply trains with its thinking, as generated
        assert f"step {i}" in codec.decode(seg.response_ids)
        assert "step" not in codec.decode(seg.prompt_ids)  # the harness's view: no earlier thinking


async def test_a_history_the_template_cannot_render_is_kept_with_drift_zero(harness, codec) -> None:
    """The same answer as the ReAct loop's (TokenConversation.finish): drift 0, kind bookkeeping."""
    h = await harness(["boom", "BOOM"], ChatCodec(codec.tokenizer, chat_template=REFUSES_BOOM))
    history = [TASK]
    history += [await h.send(history), {"role": "user", "content": "louder"}]
    await h.send(history)
    (seg,) = await h.segments()
    assert (seg.drift, seg.drift_kind, seg.num_turns) == (0, "bookkeeping", 2)


async def test_a_generation_whose_client_went_away_is_counted_as_untrainable(
    smol_engine, smollm2_codec
) -> None:
    codec = smollm2_codec
    server = await GatewayServer(Gateway(smol_engine, codec)).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            r = await http.post("/sessions", json={"sampling": {"temperature": 0, "max_tokens": 200}})
            sid = r.json()["session_id"]
            body = {"messages": [TASK], "stream": True}
            async with http.stream("POST", f"/sessions/{sid}/v1/chat/completions", json=body) as resp:
                chunks = 0
                async for line in resp.aiter_lines():
                    chunks += line.startswith("data:")
                    if chunks >= 2:  # the role chunk, then the first token's
                        break  # the client goes away mid-generation
            for _ in range(200):
                summary = (await http.get(f"/sessions/{sid}")).json()
                if summary["dropped_generations"]:
                    break
                await asyncio.sleep(0.05)
            assert summary["dropped_generations"] == 1 and 1 <= summary["untrainable_tokens"] < 200
            assert summary["segments"] == [] and summary["generated_tokens"] == summary["untrainable_tokens"]
            # The harness episode's metrics carry the counter.
            session = server.gateway.sessions.get(sid)
            result = EpisodeResult([], None, ExitReason.CANCELLED, None, {})
            await attach_segments(session, result)
            assert result.metrics["untrainable_tokens"] == summary["untrainable_tokens"]
            assert result.metrics["dropped_generations"] == 1 and result.segments == []
    finally:
        await server.stop()


async def test_a_generation_cut_by_an_abort_is_counted_and_nothing_is_recorded(smollm2_codec) -> None:
    codec = smollm2_codec
    """A non-streaming engine reports no tokens before it returns: the generation is counted."""
    texts = ["first reply", "never delivered"]
    records = [
        ReplayRecord("a", Generation(*Gen(codec)(t), "stop"), i, None, "0" * 64) for i, t in enumerate(texts)
    ]
    engine = ReplayEngine(records, match="request", strict=False, delay_s=0.5)
    server = await GatewayServer(Gateway(engine, codec)).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            sid = (await http.post("/sessions", json={"request_id": "a"})).json()["session_id"]
            url = f"/sessions/{sid}/v1/chat/completions"
            first = await http.post(url, json={"messages": [TASK]})
            history = [TASK, first.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
            pending = asyncio.create_task(http.post(url, json={"messages": history}))
            await asyncio.sleep(0.2)
            assert (await http.post(f"/sessions/{sid}/abort")).status_code == 200
            assert (await pending).json()["error"]["code"] == "session_closed"
            summary = (await http.get(f"/sessions/{sid}")).json()
        assert summary["dropped_generations"] == 1 and summary["untrainable_tokens"] == 0
        assert [s["turns"] for s in summary["segments"]] == [1]
    finally:
        await server.stop()


async def test_policy_versions_pass_through_the_gateway_into_each_segment(harness, codec) -> None:
    """A harness agent in the trainer talks to the embedded engine through the gateway: the
    version of every generated token reaches the session's segments (context tokens -1)."""
    h = await harness(["I will read calc.py.", "It subtracts.", "Fixed."], versions=[4, 4, 5])
    history = [*opening(codec), TASK]
    a1 = await h.send(history)
    history += [a1, {"role": "user", "content": "What did you find?"}]
    await h.send(history)
    edited = {"role": "assistant", "content": "It subtracts (edited)."}
    await h.send([*history, edited, {"role": "user", "content": "Go on."}])  # a rollback segment
    first, second = await h.segments()
    assert second.reason == "rollback"
    for seg in (first, second):
        assert len(seg.response_versions) == len(seg.response_ids)
        assert all((v >= 0) == bool(m) for v, m in zip(seg.response_versions, seg.response_mask, strict=True))
    assert first.version_range == (4, 4) and second.version_range == (5, 5)
