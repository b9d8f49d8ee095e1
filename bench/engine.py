"""Decode throughput of LocalEngine at 1, 4 and 8 concurrent requests, against Hugging Face `generate`.

The same 8 chat prompts (real SmolLM2 tokenizer and chat template, 30-50 tokens each) are generated
greedily to exactly `--max-tokens` tokens (no stop ids, so every request has the same length):

* ``local_engine_tokens_per_s`` at ``concurrency`` 1, 4, 8 -- the 8 requests go through
  `LocalEngine.generate` with at most that many in flight (an `asyncio.Semaphore`), so 1 is a single
  stream and 8 is everything at once, batched by the engine.
* ``hf_generate_tokens_per_s`` -- the peer: the same model object's `model.generate` on the same
  prompts, one after the other, in the same process (`min_new_tokens` = `max_new_tokens`), run after
  the engine is closed so that each side is the only thread using torch's OpenMP pool.
* ``concurrent8_vs_single`` (goal >= 3) and ``vs_hf_generate`` (8 concurrent vs the peer), plus
  ``single_vs_hf_generate`` to show what the engine's per-step overhead costs a lone stream.

Tokens per second count generated tokens over wall time, prefill included. Each figure is the median
of `--repeats` runs after one warm-up. One JSON object per line on stdout; logs on stderr.

    .venv/bin/python bench/engine.py            # about 4 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import time
from typing import Any

import torch

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


def emit(figure: str, value: Any, unit: str | None, **context: Any) -> None:
    print(json.dumps({"bench": BENCH, "figure": figure, "value": value, "unit": unit, **context}), flush=True)


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
    assert tokens == len(prompts) * max_tokens, tokens
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
    elapsed = time.perf_counter() - started
    assert tokens == len(prompts) * max_tokens, tokens
    return tokens / elapsed


def median_of(fn: Any, repeats: int) -> tuple[float, list[float]]:
    runs = [fn() for _ in range(repeats)]
    return statistics.median(runs), [round(r, 2) for r in runs]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=None, help="model spec for resolve_model (default: packaged SmolLM2)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log = logging.getLogger(BENCH)

    source = resolve_model(args.model)
    tokenizer = load_tokenizer(source)
    prompts = prompts_for(tokenizer)
    engine = await LocalEngine.create(source, device=args.device)
    context = {
        "model": engine.name,
        "device": args.device,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
    }
    try:
        log.info("warm-up")
        await engine_run(engine, prompts[:2], 2, 4)

        per_concurrency = {}
        for concurrency in (1, 4, 8):
            runs = []
            for _ in range(args.repeats):
                runs.append(await engine_run(engine, prompts, concurrency, args.max_tokens))
                log.info("local engine, concurrency %d: %.1f tokens/s", concurrency, runs[-1])
            per_concurrency[concurrency] = statistics.median(runs)
            emit(
                "local_engine_tokens_per_s",
                round(per_concurrency[concurrency], 2),
                "tokens/s",
                concurrency=concurrency,
                runs=[round(r, 2) for r in runs],
                **context,
            )
        stats = engine.stats
        # The peer runs after the engine's worker thread has exited, on this thread: each side is then
        # the only thread owning an OpenMP team, as the engine is in normal use (see LocalEngine._main).
        await engine.aclose()
        hf_run(engine.model, prompts[:1], 4)  # warm-up
        runs = []
        for _ in range(args.repeats):
            runs.append(hf_run(engine.model, prompts, args.max_tokens))
            log.info("hf generate: %.1f tokens/s", runs[-1])
        hf = statistics.median(runs)
        emit(
            "hf_generate_tokens_per_s", round(hf, 2), "tokens/s", runs=[round(r, 2) for r in runs], **context
        )

        ratio = per_concurrency[8] / per_concurrency[1]
        emit("concurrent8_vs_single", round(ratio, 2), "x", goal=3.0, met=ratio >= 3.0, **context)
        emit(
            "vs_hf_generate",
            round(per_concurrency[8] / hf, 2),
            "x",
            compares="concurrency 8 vs sequential generate",
        )
        emit(
            "single_vs_hf_generate",
            round(per_concurrency[1] / hf, 2),
            "x",
            compares="concurrency 1 vs generate",
        )
        emit(
            "engine_batches",
            stats.prefill_batches,
            "prefills",
            requests=stats.requests,
            decode_steps=stats.decode_steps,
            max_rows=stats.max_rows,
        )
    finally:
        await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main())
