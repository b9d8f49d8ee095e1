"""Train/inference mismatch: an engine's logprobs against the torch trainer's recompute.

Real agent episodes (starter tasks, bubblewrap sandboxes, the runner) are generated through
llama.cpp's `llama-server` serving the packaged SmolLM2 GGUF (Q4_1 weights; llama.cpp multiplies
them with 8-bit-quantized activations), then every model token of every episode is scored again by
one teacher-forced fp32 forward of the same GGUF through transformers (de-quantized weights), with
the trainer's own function (`uniagent.train.mismatch.recompute_log_probs`, the forward the local
trainer's loss uses). The difference is the train/inference mismatch a real cluster has.

Figures (one JSON object per line on stdout): `logprob_abs_gap_mean` / `_max` / `_p99` over model
tokens (|llama.cpp - torch|, nats), `logprob_gap_mean` (signed: llama.cpp - torch), and verl's own
mismatch metrics on the same tensors (`rollout_corr/kl`, `rollout_corr/k3_kl`, `rollout_corr/
chi2_token`, `training/rollout_probs_diff_mean|max`, ...) as `verl:<name>`.

    .venv/bin/python bench/mismatch.py                  # a server of its own; ~1 minute on 2 cores
    .venv/bin/python bench/mismatch.py --url http://127.0.0.1:8080 --episodes 8 --max-turns 4

`--engine local` measures uniagent's own `LocalEngine` instead, on `--device` (cpu, cuda) with
weights in `--dtype` (float32: the exactness case; bfloat16: the fast one, whose gap truncated IS
corrects): `--episodes` multi-turn episodes run concurrently through `TokenChatModel` (each turn's
tool result is appended, so prompts grow and later turns reuse the kept prefix), then the trainer
recomputes them in fp32 on the same device. It also reports the engine's generated tokens per second
over those episodes (`engine_tokens_per_s`). No sandbox: the tool results are fixed text, so the
figure is the engine's alone and runs on a bare GPU host.

    .venv/bin/python bench/mismatch.py --engine local --device cuda --dtype bfloat16 --episodes 16
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

BENCH = "mismatch"
Sequences = list[tuple[list[int], list[int], list[int], list[float]]]  # prompt, response, mask, logprobs


async def episodes_through(
    url: str, out: Path, episodes: int, max_turns: int, max_tokens: int, temperature: float
) -> Sequences:
    """Run `episodes` starter tasks through the llamacpp engine at `url`; their token records."""
    from uniagent.runner import RunStore, build_config, run

    config = build_config(
        None,
        [
            f"model.spec=llamacpp:{url}",
            f"model.max_tokens={max_tokens}",
            f"model.temperature={temperature}",
            f"agent.max_turns={max_turns}",
            f"tasks.limit={episodes}",
            f"runner.output={out}",
            f"runner.concurrency={min(episodes, 4)}",
        ],
    )
    await run(config)
    sequences: Sequences = []
    for row in RunStore(out / "run.db", readonly=True).rows():
        for traj in row["segments"]:  # every segment is its own sequence
            if sum(traj["response_mask"]):
                keys = ("prompt_ids", "response_ids", "response_mask", "response_logprobs")
                sequences.append(tuple(traj[k] for k in keys))
    return sequences


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


async def episodes_local(
    engine: Any, episodes: int, max_turns: int, max_tokens: int, temperature: float, tool_lines: int
) -> tuple[Sequences, int, float]:
    """`episodes` concurrent multi-turn episodes through `engine` (a LocalEngine); their token
    records (every segment), the tokens generated and the wall seconds they took."""
    import time

    from uniagent.models.base import SamplingParams
    from uniagent.models.loading import load_tokenizer, smollm2_source
    from uniagent.models.token_chat import TokenChatModel
    from uniagent.parsers import get_parser
    from uniagent.tokens import ChatCodec

    codec = ChatCodec(load_tokenizer(smollm2_source()))

    async def one(index: int) -> list[Any]:
        sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=index)
        chat = TokenChatModel(engine, codec, get_parser("hermes"), sampling)
        messages = [
            {
                "role": "system",
                "content": "You are a coding agent. Use the bash tool to inspect the repository.",
            },
            {"role": "user", "content": f"Find the file that defines task {index}, then read it."},
        ]
        for turn in range(max_turns):
            reply = await chat.query(messages, TOOLS)
            messages.append(reply.message)
            listing = "\n".join(f"src/pkg{index}/module_{turn}_{i}.py" for i in range(tool_lines))
            messages.append({"role": "tool", "content": f"$ ls -R\n{listing}", "tool_call_id": "c"})
        return chat.finish(messages, TOOLS)

    start = time.perf_counter()
    finished = await asyncio.gather(*(one(i) for i in range(episodes)))
    wall = time.perf_counter() - start
    sequences: Sequences = []
    generated = 0
    for segments in finished:
        for traj in segments:
            generated += int(sum(traj.response_mask))
            sequences.append((traj.prompt_ids, traj.response_ids, traj.response_mask, traj.response_logprobs))
    return sequences, generated, wall


def measure(model: torch.nn.Module, sequences: Sequences) -> dict[str, float]:
    """Gap figures over every model token (mask 1) of `sequences`; verl's metrics as `verl:<name>`."""
    from uniagent.train.mismatch import mismatch_metrics, recompute_log_probs

    if not sequences:
        raise ValueError("no model tokens to compare")
    torch_lp = recompute_log_probs(model, [(p, r) for p, r, _, _ in sequences], micro_batch_size=1)
    width = max(len(r) for _, r, _, _ in sequences)
    old = torch.zeros(len(sequences), width)
    rollout = torch.zeros(len(sequences), width)
    mask = torch.zeros(len(sequences), width)
    for i, ((_, response, m, lp), recomputed) in enumerate(zip(sequences, torch_lp, strict=True)):
        n = len(response)
        old[i, :n] = torch.tensor(recomputed)
        rollout[i, :n] = torch.tensor(lp, dtype=torch.float32)
        mask[i, :n] = torch.tensor(m, dtype=torch.float32)
    gap = (rollout - old)[mask.bool()]
    figures = {
        "model_tokens": float(gap.numel()),
        "sequences": float(len(sequences)),
        "logprob_abs_gap_mean": float(gap.abs().mean()),
        "logprob_abs_gap_max": float(gap.abs().max()),
        "logprob_abs_gap_p99": float(gap.abs().quantile(0.99)) if gap.numel() > 1 else float(gap.abs().max()),
        "logprob_gap_mean": float(gap.mean()),
    }
    if importlib.util.find_spec("verl") is None:  # a bare GPU host: the gap figures stand alone
        logging.getLogger(BENCH).warning("verl is not installed: its mismatch metrics are left out")
        return figures
    for key, value in mismatch_metrics(old, rollout, mask).items():
        figures[f"verl:{key}"] = value
    return figures


def emit(figures: dict[str, float], extra: dict[str, Any]) -> None:
    units = {
        "model_tokens": "tokens",
        "sequences": "count",
        "engine_tokens_per_s": "tokens/s",
        "engine_wall_s": "s",
    }
    for name, value in figures.items():
        unit = units.get(name, "nats" if "logprob" in name else "")
        print(json.dumps({"bench": BENCH, "figure": name, "value": value, "unit": unit, **extra}), flush=True)


async def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("llama-server", "local"), default="llama-server")
    parser.add_argument(
        "--url", help="a running llama-server serving the packaged SmolLM2 GGUF (default: start one)"
    )
    parser.add_argument("--device", default="cpu", help="--engine local: cpu or cuda (the trainer's too)")
    parser.add_argument("--dtype", default="float32", help="--engine local: the engine's weights")
    parser.add_argument("--tool-lines", type=int, default=20, help="--engine local: lines per tool result")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from uniagent.models.loading import load_causal_lm, smollm2_source

    extra: dict[str, Any] = {"engine": args.engine, "temperature": args.temperature}
    if args.engine == "local":
        from uniagent.models.local import LocalEngine

        engine = LocalEngine(
            smollm2_source(), device=args.device, dtype=args.dtype, max_batch_size=args.episodes
        )
        try:  # warm-up: the first batch pays for kernel selection and allocation
            await episodes_local(engine, 2, 1, 8, args.temperature, args.tool_lines)
            sequences, generated, wall = await episodes_local(
                engine, args.episodes, args.max_turns, args.max_tokens, args.temperature, args.tool_lines
            )
        finally:
            engine.close()
        extra.update(model="SmolLM2-135M-Instruct (Q4_1 de-quantized)", device=args.device, dtype=args.dtype)
        speed = {"engine_tokens_per_s": generated / wall, "engine_wall_s": wall}
    else:
        from uniagent.models.remote.llama_server import LlamaServer

        extra["model"] = "SmolLM2-135M-Instruct Q4_1"
        speed = {}
        with tempfile.TemporaryDirectory() as tmp:
            if args.url:
                sequences = await episodes_through(
                    args.url, Path(tmp), args.episodes, args.max_turns, args.max_tokens, args.temperature
                )
            else:
                async with LlamaServer(slots=min(args.episodes, 4)) as server:
                    sequences = await episodes_through(
                        server.url,
                        Path(tmp),
                        args.episodes,
                        args.max_turns,
                        args.max_tokens,
                        args.temperature,
                    )
    model = load_causal_lm(smollm2_source(), device=args.device, dtype="float32")
    figures = {**measure(model, sequences), **speed}
    emit(figures, extra)
    if not all(math.isfinite(v) for v in figures.values()):
        raise SystemExit("a mismatch figure is not finite")
    return figures


if __name__ == "__main__":
    asyncio.run(main())
