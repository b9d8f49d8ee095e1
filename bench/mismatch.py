"""Train/inference mismatch: llama-server's logprobs against the torch trainer's recompute.

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
"""

from __future__ import annotations

import argparse
import asyncio
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
    for key, value in mismatch_metrics(old, rollout, mask).items():
        figures[f"verl:{key}"] = value
    return figures


def emit(figures: dict[str, float], extra: dict[str, Any]) -> None:
    units = {"model_tokens": "tokens", "sequences": "count"}
    for name, value in figures.items():
        unit = units.get(name, "nats" if "logprob" in name else "")
        print(json.dumps({"bench": BENCH, "figure": name, "value": value, "unit": unit, **extra}), flush=True)


async def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", help="a running llama-server serving the packaged SmolLM2 GGUF (default: start one)"
    )
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from uniagent.models.loading import load_causal_lm, smollm2_source
    from uniagent.models.remote.llama_server import LlamaServer

    with tempfile.TemporaryDirectory() as tmp:
        if args.url:
            sequences = await episodes_through(
                args.url, Path(tmp), args.episodes, args.max_turns, args.max_tokens, args.temperature
            )
        else:
            async with LlamaServer(slots=min(args.episodes, 4)) as server:
                sequences = await episodes_through(
                    server.url, Path(tmp), args.episodes, args.max_turns, args.max_tokens, args.temperature
                )
    model = load_causal_lm(smollm2_source(), dtype="float32")
    figures = measure(model, sequences)
    emit(
        figures,
        {"engine": "llama-server", "model": "SmolLM2-135M-Instruct Q4_1", "temperature": args.temperature},
    )
    if not all(math.isfinite(v) for v in figures.values()):
        raise SystemExit("a mismatch figure is not finite")
    return figures


if __name__ == "__main__":
    asyncio.run(main())
