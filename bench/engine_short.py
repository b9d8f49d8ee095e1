"""The short section of bench/engine.py (``--short``): 8 chat prompts of 30-50 tokens at concurrency 1, 4
and 8 on LocalEngine, against sequential HF `generate` on the same weights (``local_engine_tokens_per_s``,
``concurrent8_vs_single``, ...). Kept apart from the agent section, which is the comparison issue 28 asks
for; this one shows what batching alone gives on chat-sized prompts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import time
from typing import Any

import torch

from common import emit, spread
from uniagent.models.base import SamplingParams
from uniagent.models.loading import load_tokenizer, resolve_model
from uniagent.models.local import LocalEngine

BENCH = "engine"
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain recursion to a child in two sentences.",
    "List three uses of a paperclip.",
    "Why is the sky blue? Keep it short.",
    "Translate 'good morning' into Spanish and German.",
    "Give me a tip for writing clean Python code.",
    "What does a compiler do?",
]


def prompts_for(tokenizer: Any) -> list[list[int]]:
    out = []
    for question in QUESTIONS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


async def engine_run(
    engine: LocalEngine, prompts: list[list[int]], concurrency: int, max_tokens: int
) -> float:
    """Tokens per second for all prompts with at most `concurrency` requests in flight."""
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=[])
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, prompt: list[int]) -> int:
        async with gate:
            return len((await engine.generate(prompt, sampling, f"bench-{i}")).token_ids)

    started = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    elapsed = time.perf_counter() - started
    if tokens != len(prompts) * max_tokens:
        raise SystemExit(f"local engine made {tokens} tokens, not {len(prompts) * max_tokens}")
    return tokens / elapsed


def hf_run(model: Any, prompts: list[list[int]], max_tokens: int) -> float:
    """Tokens per second for sequential `model.generate` calls (greedy, fixed length)."""
    tokens = 0
    started = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=model.device)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                pad_token_id=0,
            )
            tokens += out.shape[1] - ids.shape[1]
    return tokens / (time.perf_counter() - started)


async def short_section(args: Any) -> None:
    log = logging.getLogger(BENCH)
    source = resolve_model(args.model)
    prompts = prompts_for(load_tokenizer(source))
    engine = await LocalEngine.create(source, device=args.device, dtype=args.dtype)
    context = {
        "model": engine.name, "device": args.device, "dtype": args.dtype, "machine": platform.machine(),
        "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(), "prompts": len(prompts),
        "max_tokens": args.short_max_tokens, "repeats": args.repeats,
    }  # fmt: skip
    try:
        await engine_run(engine, prompts[:2], 2, 4)  # warm-up
        per_concurrency = {}
        for concurrency in (1, 4, 8):
            runs = [
                await engine_run(engine, prompts, concurrency, args.short_max_tokens)
                for _ in range(args.repeats)
            ]
            log.info("local engine, concurrency %d: %s tokens/s", concurrency, runs)
            per_concurrency[concurrency] = s = spread(runs, 2)
            emit(
                BENCH,
                "local_engine_tokens_per_s",
                s["median"],
                "tokens/s",
                concurrency=concurrency,
                spread=s,
                **context,
            )
        # The peer runs after the engine's worker thread has exited, on this thread: each side is then
        # the only thread owning an OpenMP team, as the engine is in normal use.
        await engine.aclose()
        hf_run(engine.model, prompts[:2], 4)  # warm-up
        hf = spread([hf_run(engine.model, prompts, args.short_max_tokens) for _ in range(args.repeats)], 2)
        emit(BENCH, "hf_generate_tokens_per_s", hf["median"], "tokens/s", spread=hf, **context)
        ratio = per_concurrency[8]["median"] / per_concurrency[1]["median"]
        emit(BENCH, "concurrent8_vs_single", round(ratio, 2), "x", goal=3.0, met=ratio >= 3.0, **context)
        emit(BENCH, "vs_hf_generate", round(per_concurrency[8]["median"] / hf["median"], 2), "x",
             compares="concurrency 8 vs sequential generate")  # fmt: skip
    finally:
        await engine.aclose()
