"""The prefill figure of bench/engine.py: one 4K-token prompt, and 4 concurrent 2K-token prompts, one new
token each, per engine: prefill tokens per second and the fraction of the matmul peak they reach.

Why apart from the agent run: there, prefill and decode of different episodes interleave and the prefix
cache changes how much is prefilled; here every engine runs the same fresh prompts (new text each
repeat, no cache holds them) and the time is the request's whole wall time, so the figure is the
engine's prefill and nothing else.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from common import spread
from engine_peers import Side
from engine_workload import observation_text
from roofline import mfu, transformer_flops
from uniagent.models.base import SamplingParams
from uniagent.tokens import ChatCodec

SHAPES = (("prefill_4k", 1, 4096), ("prefill_4x2k", 4, 2048))  # (figure, prompts at once, tokens each)


def prefill_flops(config: Any, tokens: int, context: float) -> float:
    """Useful FLOPs of prefilling `tokens` positions attending to `context` on average: the model's
    forward (roofline.transformer_flops) without the lm head on all but the last position, whose logits
    no engine needs (SmolLM2: the tied head is a fifth of the weights)."""
    head = 2.0 * config.hidden_size * config.vocab_size * max(tokens - 1, 0)
    return transformer_flops(config, tokens, context=context) - head


def prompts(codec: ChatCodec, count: int, tokens: int, seed: int) -> list[list[int]]:
    """`count` different prompts of exactly `tokens` ids (source-like text, fresh for each `seed`)."""
    rng = random.Random(1000 + seed)
    return [codec.encode(observation_text(rng, tokens + 8, codec))[:tokens] for _ in range(count)]


async def timed(side: Side, batch: list[list[int]], tag: str) -> float:
    """Wall seconds to prefill `batch` at once and sample one token each."""
    sampling = SamplingParams(temperature=0.0, max_tokens=1, stop_token_ids=[])
    side.group[0] = len(batch)
    began = time.perf_counter()
    outs = await asyncio.gather(
        *(side.generate(p, sampling, f"{tag}-{i}", None) for i, p in enumerate(batch))
    )
    spent = time.perf_counter() - began
    if any(len(o.token_ids) != 1 for o in outs):
        raise SystemExit(f"{side.name}: a prefill request did not return its token")
    return spent


def prompt_tokens(full: int, scale: float) -> int:
    """A shape's prompt size at `scale` (smoke tests shrink it, never below 16 tokens)."""
    return max(16, int(full * scale))


async def prefill_repeat(
    side: Side, codec: ChatCodec, config: Any, seed: int, scale: float, peak: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """One repeat of every shape on a freshly started engine: a warm-up on other text, then the timed
    prompts of repeat `seed`. Per shape: tokens/s, MFU against the engine's own dtype peak and against
    the bf16 peak (issue 28's goal). `scale` shrinks the prompts (smoke tests)."""
    out: dict[str, dict[str, float]] = {}
    for figure, count, full in SHAPES:
        tokens = prompt_tokens(full, scale)
        await timed(side, prompts(codec, count, tokens, seed=-1 - seed), f"{figure}-warm")
        flops = count * prefill_flops(config, tokens, context=tokens / 2)
        spent = await timed(side, prompts(codec, count, tokens, seed=seed), f"{figure}-{seed}")
        out[figure] = {
            "rate": count * tokens / spent,
            "mfu": mfu(flops, spent, side.precision, peak) or 0.0,
            "mfu_bf16": mfu(flops, spent, "bfloat16", peak) or 0.0,
        }
    return out


def prefill_summary(runs: list[dict[str, dict[str, float]]], precision: str, scale: float) -> dict[str, Any]:
    """Median and spread over the repeats of `prefill_repeat`, per shape."""
    out: dict[str, dict[str, Any]] = {}
    for figure, count, full in SHAPES:
        got = [run[figure] for run in runs]
        out[figure] = {
            "tokens_per_s": spread([g["rate"] for g in got], 1),
            "mfu": spread([g["mfu"] for g in got], 4) if precision != "q4_1" else None,
            "mfu_of_bf16_peak": spread([g["mfu_bf16"] for g in got], 4),
            "prompts": count,
            "prompt_tokens": prompt_tokens(full, scale),
        }
    return out
