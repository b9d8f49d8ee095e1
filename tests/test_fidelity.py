"""Fidelity with the real model: what the trainer sees is exactly what the policy did.

SmolLM2 through TokenChatModel + LocalEngine, five turns with tool results in between; every turn
after the first reuses the episode's kept prefix (keys/values), and logprobs must still match a
teacher-forced fp32 recompute.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from uniagent.models.base import SamplingParams
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser
from uniagent.tokens import ChatCodec

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command"}},
                "required": ["command"],
            },
        },
    }
]


class SpyEngine:
    """Records what the real engine returned, to compare with the trajectory."""

    def __init__(self, inner):
        self.inner = inner
        self.generations = []
        self.prompts = []

    async def generate(self, prompt_ids, sampling, request_id):
        self.prompts.append(list(prompt_ids))
        generation = await self.inner.generate(prompt_ids, sampling, request_id)
        self.generations.append(generation)
        return generation


@pytest.fixture
def engine(smol_engine):
    """A LocalEngine of its own on the session's model: its prefix counts are this test's alone (the
    session engine keeps a shared prompt start that earlier tests leave)."""
    from uniagent.models.local import LocalEngine

    own = LocalEngine.from_model(smol_engine.model)
    yield own
    own.close()


async def _episode(engine, codec, temperature: float, max_tokens: int, seed: int = 0):
    spy = SpyEngine(engine)
    chat = TokenChatModel(
        spy,
        codec,
        get_parser("hermes"),
        SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed),
    )
    messages = [
        {"role": "system", "content": "You are a coding agent. Use the bash tool to inspect the repository."},
        {"role": "user", "content": "List the files in the repository, then read README.md."},
    ]
    contexts = []
    for i in range(5):
        turn = await chat.query(messages, TOOLS)
        messages.append(turn.message)
        if i < 4:
            new = [
                {"role": "tool", "content": f"$ ls\nREADME.md\nsrc/\ntests/\n(step {i})", "tool_call_id": "c"}
            ]
            contexts.append(new)
            messages.extend(new)
    (traj,) = chat.finish(messages, TOOLS)
    return spy, chat, traj, messages, contexts


@pytest.mark.parametrize(("temperature", "max_tokens"), [(0.0, 40), (0.8, 24)])
async def test_five_turn_episode_is_token_exact(engine, smol_tokenizer, temperature, max_tokens):
    codec = ChatCodec(smol_tokenizer)
    spy, chat, traj, messages, contexts = await _episode(engine, codec, temperature, max_tokens)
    assert traj.num_turns == 5
    # Turns 2-5 reused the episode's kept prefix (the checks below run with reuse on).
    assert engine.stats.prefix_hits == 4

    # Every mask-1 token is exactly what the engine returned, in order.
    model_spans = [s for s in traj.spans if s.kind == "model"]
    assert [traj.response_ids[s.start : s.end] for s in model_spans] == [g.token_ids for g in spy.generations]
    assert [traj.response_logprobs[s.start : s.end] for s in model_spans] == [
        g.logprobs for g in spy.generations
    ]

    # Every mask-0 token is exactly what the codec rendered: a closing end-of-turn after a
    # generation cut by max_tokens, then the continuation of the new messages.
    context_ids = [traj.response_ids[s.start : s.end] for s in traj.spans if s.kind == "context"]
    expected = []
    for generation, new in zip(spy.generations, contexts, strict=False):
        if generation.finish_reason == "length":
            expected.append(codec.eot_ids)
        expected.append(codec.continuation_ids(new))
    assert context_ids == expected
    # Each prompt the engine saw is the running sequence at that point.
    for prompt in spy.prompts:
        assert traj.token_ids[: len(prompt)] == prompt
    assert spy.prompts[-1] + spy.generations[-1].token_ids == traj.token_ids

    # Logprobs recomputed by one teacher-forced forward pass match the engine's (fp32).
    ids = torch.tensor([traj.token_ids])
    with torch.inference_mode():
        logits = engine.model(ids).logits.float()
    logprobs = torch.log_softmax(logits[0, :-1], dim=-1)
    targets = ids[0, 1:]
    recomputed = logprobs.gather(-1, targets[:, None])[:, 0].tolist()
    start = len(traj.prompt_ids) - 1
    worst = max(
        abs(recomputed[start + i] - lp)
        for i, (lp, m) in enumerate(zip(traj.response_logprobs, traj.response_mask, strict=True))
        if m
    )
    assert worst < 1e-3, worst

    # No drift: the running sequence equals a full render of the conversation.
    if temperature == 0.0:
        assert traj.drift is None
    else:  # sampled text may be tokenized non-canonically; drift must then point at it
        assert (
            traj.drift is None
            or traj.token_ids[: traj.drift]
            == codec.encode(
                codec.render(chat.conversation.full_view(messages, TOOLS)[0], add_generation_prompt=False)
            )[: traj.drift]
        )


async def test_rewritten_history_starts_a_new_segment(smol_engine, smol_tokenizer):
    """A caller that rewrites the history gets a new segment rendered afresh; the first segment
    keeps what was generated in it (nothing is dropped)."""
    codec = ChatCodec(smol_tokenizer)
    chat = TokenChatModel(
        smol_engine, codec, get_parser("hermes"), SamplingParams(temperature=0.0, max_tokens=8)
    )
    messages = [{"role": "user", "content": "Say hi."}]
    turn = await chat.query(messages)
    first = list(chat.trajectory.response_ids)
    messages = [{"role": "user", "content": "Say bye."}, turn.message, {"role": "user", "content": "Again."}]
    await chat.query(messages)
    one, two = chat.finish(messages)
    assert (one.reason, two.reason) == ("start", "rewritten") and one.response_ids == first
    assert two.prompt_ids == codec.prompt_ids(messages)


def _teacher_forced_gap(engine, prompt, generation) -> float:
    ids = torch.tensor([prompt + generation.token_ids])
    with torch.inference_mode():
        logprobs = torch.log_softmax(engine.model(ids).logits[0].float(), dim=-1)
    return max(
        abs(logprobs[len(prompt) - 1 + i, token].item() - lp)
        for i, (token, lp) in enumerate(zip(generation.token_ids, generation.logprobs, strict=True))
    )


async def test_reused_and_fresh_rows_in_one_batch_keep_teacher_forced_logprobs(engine, smol_tokenizer):
    """Turn 2 of one episode (its history's keys/values reused) prefilled and decoded in the same batch
    as turn 1 of another (fresh, different length): both within 1e-3 of a teacher-forced fp32 pass."""
    codec = ChatCodec(smol_tokenizer)
    sampling = SamplingParams(temperature=0.8, max_tokens=8, seed=3, stop_token_ids=[])
    first = codec.prompt_ids([{"role": "user", "content": "List the files, then read README.md please."}])
    gen = await engine.generate(first, sampling, "fid-reused")
    second = (
        first
        + gen.token_ids
        + codec.eot_ids
        + codec.continuation_ids([{"role": "user", "content": "Now show me the tests directory."}])
    )
    other = codec.prompt_ids([{"role": "user", "content": "What is 2+2?"}])
    before = engine.stats
    reused, fresh = await asyncio.gather(
        engine.generate(second, sampling, "fid-reused"),
        engine.generate(other, sampling, "fid-fresh"),
    )
    after = engine.stats
    assert after.prefix_hits - before.prefix_hits == 1
    assert after.prefill_batches - before.prefill_batches == 1  # one prefill for both rows
    assert _teacher_forced_gap(engine, second, reused) < 1e-3
    assert _teacher_forced_gap(engine, other, fresh) < 1e-3


def _bench_mismatch():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "mismatch.py"
    spec = importlib.util.spec_from_file_location("bench_mismatch", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_mismatch_bench_on_the_local_engine_is_exact_in_fp32(engine):
    """bench/mismatch.py --engine local at a tiny size (the bench's smoke test): concurrent multi-turn
    episodes through the engine, recomputed by the trainer's fp32 forward, line up token for token."""
    from uniagent.models.loading import load_causal_lm, smollm2_source

    bench = _bench_mismatch()
    sequences, generated, wall = await bench.episodes_local(engine, 2, 2, 8, 0.8, 3)
    assert generated == sum(sum(mask) for _, _, mask, _ in sequences) > 0 and wall > 0
    figures = bench.measure(load_causal_lm(smollm2_source(), dtype="float32"), sequences)
    assert figures["model_tokens"] == generated
    assert figures["logprob_abs_gap_max"] < 1e-3, figures


def test_a_packed_batch_moves_to_the_policys_device_whole():
    """`pack` builds on the CPU; `Batch.to` carries every tensor (the trainer's GPU path moves each
    micro-batch to the policy's device), values and dtypes unchanged."""
    from uniagent.tokens import Trajectory
    from uniagent.train import algo

    t = Trajectory(prompt_ids=[1, 2, 3])
    t.add_generation([4, 5], [-0.5, -0.25])
    batch = algo.pack([t])
    moved = batch.to("meta")
    for name in (
        "input_ids",
        "attention_mask",
        "prompt_len",
        "response_ids",
        "response_mask",
        "old_log_probs",
    ):
        before, after = getattr(batch, name), getattr(moved, name)
        assert after.device.type == "meta" and after.dtype == before.dtype and after.shape == before.shape
