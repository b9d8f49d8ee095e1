"""LocalEngine's decode step: its weight products on packed weights (models/linear.py) against torch's plain
`F.linear` (bf16 or fp32), in the same engine, on the same cache, alternating.

One engine (`--dtype`, product defaults) holds `--rows` prompts of each `--contexts` length (prefilled
once, kept as each request's prefix). Each repeat decodes `--new-tokens` tokens on every row twice, once
with the linear layers plain and once packed (the order alternates between repeats), and times every
`BatchRunner` decode step. Sampling is on (temperature 0.8, seeded), as in an RL rollout. Figures per
context: ``decode_step_ms`` per side (median step of each repeat; median and spread over repeats),
``packed_vs_plain`` per repeat, and ``decode_bandwidth_util`` (the weights' and the keys'/values' bytes a
step reads, over the step time, over the measured copy bandwidth: bench/roofline.py). Exit 1 when packed
is slower than plain (`--goal`, default 1.0) at any context. On a CPU whose oneDNN cannot lay out weights
of `--dtype` (bf16 on an AVX2-only CPU) it prints one ``skipped`` line with the probe's reason and exits 0.

    .venv/bin/python bench/decode_step.py                         # 8 rows at 64 and 4,000 keys, 3 repeats
    .venv/bin/python bench/decode_step.py --dtype float32 --rows 4   # fp32 (MKL's product against oneDNN's)
    .venv/bin/python bench/decode_step.py --rows 2 --contexts 16 --new-tokens 4 --repeats 1   # smoke size
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from functools import partial
from typing import Any

import torch

from common import emit as common_emit
from common import spread
from roofline import bandwidth_util, peaks, weight_bytes
from uniagent.models import linear
from uniagent.models.base import SamplingParams
from uniagent.models.linear import PackedLinear
from uniagent.models.local import LocalEngine

BENCH = "decode_step"
emit = partial(common_emit, BENCH)


def set_packed(model: torch.nn.Module, packed: bool) -> int:
    """Switch every linear layer of `model` to packed weights or back to torch's plain product."""
    n = 0
    for module in model.modules():
        if type(module) in (torch.nn.Linear, PackedLinear):
            module.__class__ = PackedLinear if packed else torch.nn.Linear
            n += 1
    return n


def kv_bytes(model: torch.nn.Module, rows: int, context: int) -> int:
    """Bytes of keys and values a decode step reads at `rows` x `context` positions."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * element * rows * context


async def decode(engine: LocalEngine, prompts: list[list[int]], tag: str, new_tokens: int) -> list[float]:
    """Decode `new_tokens` on every row (each request reuses its kept prompt); each step's seconds."""
    runner = engine._batches
    plain_decode = runner._decode
    steps: list[float] = []

    def timed(batch: Any) -> None:
        began = time.perf_counter()
        plain_decode(batch)
        steps.append(time.perf_counter() - began)

    runner._decode = timed
    try:
        sampling = SamplingParams(temperature=0.8, max_tokens=new_tokens, seed=1, stop_token_ids=[])
        outs = await asyncio.gather(
            *(engine.generate(p, sampling, f"{tag}-{i}") for i, p in enumerate(prompts))
        )
    finally:
        runner._decode = plain_decode
    if any(len(o.token_ids) != new_tokens for o in outs):
        raise RuntimeError(f"{tag}: a row came short of {new_tokens} tokens")
    return steps


async def run(args: argparse.Namespace) -> bool:
    dtype = getattr(torch, args.dtype)
    if not linear.supported(dtype):  # nothing to compare: the product keeps torch's product on this CPU
        emit("skipped", None, None, reason=linear.choice(dtype).describe(), dtype=args.dtype)
        return True
    engine = LocalEngine(dtype=args.dtype)
    model = engine._model
    peak = peaks()
    met = True
    try:
        layers = set_packed(model, False)
        for context in args.contexts:
            base = [1000 + (i * 7919) % 40000 for i in range(context)]
            prompts = [[7 + r, *base] for r in range(args.rows)]
            warm = SamplingParams(temperature=0.0, max_tokens=1, stop_token_ids=[])
            await asyncio.gather(
                *(engine.generate(p, warm, f"c{context}-{i}") for i, p in enumerate(prompts))
            )
            runs: dict[str, list[float]] = {"plain": [], "packed": []}
            for repeat in range(args.repeats + 1):  # repeat 0 warms both sides up
                order = ("plain", "packed") if repeat % 2 else ("packed", "plain")
                for side in order:
                    set_packed(model, side == "packed")
                    steps = await decode(engine, prompts, f"c{context}", args.new_tokens)
                    if repeat:
                        runs[side].append(statistics.median(steps) * 1e3)
            set_packed(model, False)
            nbytes = weight_bytes(model) + kv_bytes(model, args.rows, context + args.new_tokens // 2)
            context_info = {
                "rows": args.rows,
                "context": context,
                "new_tokens": args.new_tokens,
                "dtype": args.dtype,
            }
            for side, ms in runs.items():
                emit("decode_step_ms", spread(ms, 2), "ms", side=side, **context_info)
                util = [bandwidth_util(nbytes, m / 1e3, peak) or 0.0 for m in ms]
                emit("decode_bandwidth_util", spread(util, 4), "fraction of peak", side=side, **context_info)
            ratios = [p / k for p, k in zip(runs["plain"], runs["packed"], strict=True)]
            ok = statistics.median(ratios) >= args.goal
            met &= ok
            emit(
                "packed_vs_plain",
                spread(ratios, 3),
                "x",
                goal=args.goal,
                met=ok,
                layers=layers,
                **context_info,
            )
    finally:
        engine.close()
    return met


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[64, 4000])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--goal", type=float, default=1.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    met = asyncio.run(run(args))
    if not met:
        print(f"goal missed: packed >= {args.goal}x plain", file=sys.stderr)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
