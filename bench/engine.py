"""LocalEngine on agent-shaped work, against llama.cpp's `llama-server` and Hugging Face `generate`, at
the same precision, on the same prompts, each warmed up, each repeated.

Agent section (the default). `--episodes` episodes run at once, each `--turns` turns, greedy, exactly
`--new-tokens` tokens per turn; the first prompt is a real chat render of ~`--first-tokens` tokens, each
later turn appends the cut assistant turn and a ~`--observation-tokens` tool observation, as
TokenChatModel sends (engine_workload.py). Every repeat gets fresh text (no cache holds it from an
earlier repeat) and every engine the same repeat's text. The engines (engine_peers.py): ``local_new``
(LocalEngine, product defaults; `--dtype auto`, the default, runs every engine at the precision the
product picks on this machine and says why), ``llama_server`` (the packaged GGUF re-written at the same
precision, engine_gguf.py; OpenMP threads spinning like torch's), ``hf_generate`` (batched per turn),
and the labelled extra ``llama_server_q4_1`` (the packaged 4-bit file); opt-in: ``llama_server_passive``,
``local_no_reuse``, ``local_old``. Repeats interleave the engines (forwards, then backwards): in each,
every engine is started afresh, warmed up (every episode at once, on text no repeat times), runs that
repeat's workload and prefill prompts, and is stopped before the next starts. So only one engine's
threads exist at a time, and a machine that drifts during the run moves every engine alike.

Figures per engine (median and spread over repeats; null when an episode came short of its tokens):
``aggregate_tokens_per_s`` (all tokens / wall time), ``prefill_mfu`` (useful prefill FLOPs of the prompt
tokens the engine ran -- roofline.transformer_flops without the lm head of all but the last position --
/ time spent prefilling -- forward hooks for torch engines; for llama-server its per-request timings,
the slowest request of each turn -- / the dtype's measured matmul peak), ``decode_bandwidth_util``
(weight bytes x decode steps / decode time / measured copy bandwidth), ``ttft_s`` and ``turn_s`` per
turn; then ``prefill_4k`` and ``prefill_4x2k`` (engine_prefill.py: tokens/s, MFU, MFU of the bf16
peak) and the ratios per repeat and their median.
Goals (issue 28): local_new >= 54 tokens/s (3x 18) and >= 2x llama_server; its 4K prefill >= 30 % of the
bf16 peak. Exit 1 when a goal is missed or an episode came short (``--no-goals``: exit 0 anyway).

    .venv/bin/python bench/engine.py --dtype bfloat16        # 8 x 6, ~1,500 -> ~5,000 tokens, 3 repeats
    .venv/bin/python bench/engine.py --quick                 # 4 x 3, ~600 -> ~1,600 tokens
    .venv/bin/python bench/engine.py --short                 # short chat prompts at 1/4/8 concurrent
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from common import emit, spread
from engine_peers import LLAMA, Side, open_side
from engine_prefill import prefill_flops, prefill_repeat, prefill_summary
from engine_short import short_section
from engine_workload import Result, Workload, build_workload, drive, warm_up
from roofline import bandwidth_util, ceiling, mfu, peaks
from uniagent.models.loading import load_tokenizer, resolve_model
from uniagent.models.precision import resolve as resolve_precision
from uniagent.tokens import ChatCodec

BENCH = "engine"
TODAY_TOKENS_PER_S = 18.0  # issue 28: the agent bench's LocalEngine aggregate before the bf16 work
log = logging.getLogger(BENCH)


def run_prefill_flops(side: Side, config: Any, result: Result, counted: int | None) -> float:
    """FLOPs of the prefill the engine ran: llama-server says per request how many prompt tokens it
    ran; a torch engine that reuses prefixes runs what the previous turn did not (scaled to the prompt
    tokens it counts); one that does not runs every prompt in full."""
    if side.timings:
        pairs = [
            (t["prompt_len"], t["prompt_len"] - t.get("prompt_n", t["prompt_len"])) for t in side.timings
        ]
    else:
        pairs = [(length, prior if side.reuses_prefix else 0) for length, prior in result.prompts]
    flops = sum(prefill_flops(config, n - r, context=r + (n - r) / 2) for n, r in pairs)
    ran = sum(n - r for n, r in pairs)
    return flops * (counted / ran) if counted and ran else flops


def time_split(side: Side, work: Workload) -> tuple[float, float, int] | None:
    """(prefill seconds, decode seconds, decode steps) of the last run, or None if not measurable."""
    if side.clock is not None and side.clock.prefill_calls:
        return side.clock.prefill_s, side.clock.decode_s, side.clock.decode_calls
    if side.timings:  # the slots of a turn run together: a turn's time is its slowest request's
        ordered = sorted(side.timings, key=lambda t: t["prompt_len"])
        n = len(work.first)
        turns = [ordered[i : i + n] for i in range(0, len(ordered), n)]
        prefill = sum(max(t.get("prompt_ms", 0.0) for t in turn) for turn in turns) / 1e3
        decode = sum(max(t.get("predicted_ms", 0.0) for t in turn) for turn in turns) / 1e3
        return prefill, decode, len(turns) * (work.new_tokens - 1)
    return None


def peak_dtype(precision: str) -> str:
    """The peak a figure is measured against: its own dtype's, the bf16 one for a quantized file."""
    return precision if precision in ("float32", "bfloat16") else "bfloat16"


@dataclass
class Runs:
    """One engine's figures, a repeat at a time."""

    rows: dict[str, list[float]] = field(
        default_factory=lambda: {"rate": [], "prefill_mfu": [], "decode_bw": []}
    )
    results: list[Result] = field(default_factory=list)
    prefill: list[dict[str, dict[str, float]]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


async def run_repeat(name: str, args: argparse.Namespace, work: Workload, seed: int, env: dict[str, Any],
                     runs: Runs, ctx: int) -> None:  # fmt: skip
    """Start `name`, warm it up, run one repeat's workload and its prefill figure, stop it; add the
    figures to `runs`. `env`: source, codec, config, peak, context."""
    config, peak = env["config"], env["peak"]
    async with open_side(name, args, env["source"], slots=max(args.episodes, 4), ctx=ctx) as side:
        side.group[0] = args.episodes
        await warm_up(side.generate, env["warm"])
        side.group[0] = args.episodes
        side.reset()
        before = side.stats() if side.stats else {}
        result = await drive(side.generate, work, side.streams)
        after = side.stats() if side.stats else {}
        runs.results.append(result)
        runs.rows["rate"].append(result.tokens / result.wall_s)
        split = time_split(side, work)
        if split is not None:
            counted = after.get("prefill_tokens", 0) - before.get("prefill_tokens", 0) or None
            flops = run_prefill_flops(side, config, result, counted)
            runs.rows["prefill_mfu"].append(mfu(flops, split[0], peak_dtype(side.precision), peak) or 0.0)
            runs.rows["decode_bw"].append(bandwidth_util(side.weight_bytes * split[2], split[1], peak) or 0.0)
        log.info("%s %s: %.2f tokens/s %s", name, work.tag, runs.rows["rate"][-1], result.short or "")
        if not args.no_prefill:
            runs.prefill.append(
                await prefill_repeat(side, env["codec"], config, seed, args.prefill_scale, peak)
            )
        counters = {k: v - before.get(k, 0) for k, v in after.items() if k != "max_rows"}  # the last repeat
        runs.extra = {"precision": side.precision, "weight_bytes": side.weight_bytes, "last_repeat": counters}
    if name.startswith("llama_server"):
        runs.extra["omp_wait"] = (
            "passive" if name == "llama_server_passive" else "spin (OpenMP default, as torch)"
        )


def engine_order(engines: list[str], repeat: int) -> list[str]:
    """Every repeat runs each engine once, forwards on even repeats and backwards on odd ones, so a
    machine that drifts over the run (other work, heat) shifts every engine alike instead of landing
    in the ratios; each engine is started afresh and stopped before the next starts."""
    return list(engines) if repeat % 2 == 0 else list(reversed(engines))


def report(name: str, runs: Runs, args: argparse.Namespace, context: dict[str, Any]) -> dict[str, Any]:
    """One engine's lines: the aggregate gated on every episode making its tokens, then the rest; what
    the goals need."""
    rows, results, turns = runs.rows, runs.results, args.turns
    context = {**runs.extra, **context}
    prefill = (
        prefill_summary(runs.prefill, context["precision"], args.prefill_scale) if runs.prefill else None
    )
    complete = all(r.complete for r in results)
    rate = spread(rows["rate"], 2)
    short = [s for r in results for s in r.short][:8]
    value = rate["median"] if complete else None
    emit(BENCH, "aggregate_tokens_per_s", value, "tokens/s", engine=name, spread=rate, complete=complete,
         short=short, **context)  # fmt: skip
    precision = context["precision"]
    if rows["prefill_mfu"]:
        emit(BENCH, "prefill_mfu", spread(rows["prefill_mfu"], 4), "fraction of peak", engine=name,
             precision=precision, peak=peak_dtype(precision))  # fmt: skip
        emit(BENCH, "decode_bandwidth_util", spread(rows["decode_bw"], 4), "fraction of peak", engine=name)
    episode_s = [s for r in results for s in r.episode_s]
    emit(BENCH, "episode_s", round(statistics.mean(episode_s), 1) if episode_s else None, "s", engine=name)
    for turn in range(turns):
        ttft = [x for r in results for x in r.ttft.get(turn, [])]
        if ttft:
            emit(BENCH, "ttft_s", round(statistics.mean(ttft), 2), "s", engine=name, turn=turn + 1)
        turn_s = [x for r in results for x in r.turn_s.get(turn, [])]
        value = round(statistics.mean(turn_s), 2) if turn_s else None
        emit(BENCH, "turn_s", value, "s", engine=name, turn=turn + 1)
    for figure, found in (prefill or {}).items():
        rate = found["tokens_per_s"]["median"]
        emit(BENCH, figure, rate, "tokens/s", engine=name, precision=precision, **found)
    return {"rates": rows["rate"], "complete": complete, "prefill": prefill}


def goals(got: dict[str, dict[str, Any]], args: argparse.Namespace, context: dict[str, Any]) -> list[str]:
    """Emit the ratios and goal lines; return the goals missed."""
    missed = []
    new = got.get("local_new")
    for peer in [e for e in args.engines if e != "local_new"]:
        other = got.get(peer)
        if not new or not other:
            if peer == "llama_server" and new:
                missed.append("new_vs_llama_server (llama_server not measured)")
            continue
        per = [a / b for a, b in zip(new["rates"], other["rates"], strict=True)]
        ok = new["complete"] and other["complete"]
        goal = 2.0 if peer == "llama_server" else None
        met = None if goal is None else ok and statistics.median(per) >= goal
        value = round(statistics.median(per), 2) if ok else None
        emit(BENCH, f"new_vs_{peer.removeprefix('local_')}", value, "x", spread=spread(per, 2), goal=goal,
             met=met, compares="per repeat, same prompts", **context)  # fmt: skip
        if met is False:
            missed.append(f"new_vs_{peer}")
    if new:
        rate = statistics.median(new["rates"]) if new["complete"] else 0.0
        met = rate >= 3 * TODAY_TOKENS_PER_S
        emit(
            BENCH,
            "goal_tokens_per_s",
            round(rate, 2),
            "tokens/s",
            goal=3 * TODAY_TOKENS_PER_S,
            met=met,
            **context,
        )
        missed += [] if met else ["local_new aggregate >= 54 tokens/s"]
        if new["prefill"]:
            frac = new["prefill"]["prefill_4k"]["mfu_of_bf16_peak"]["median"]
            emit(BENCH, "goal_prefill_of_bf16_peak", frac, "fraction", goal=0.30, met=frac >= 0.30, **context)
            missed += [] if frac >= 0.30 else ["local_new 4K prefill >= 30 % of the bf16 peak"]
    return missed


async def agent_section(args: argparse.Namespace) -> int:
    from transformers import AutoConfig

    source = resolve_model(args.model)
    codec = ChatCodec(load_tokenizer(source))
    config = AutoConfig.from_pretrained(source.path, **source.kwargs())
    sizes = (args.episodes, args.turns, args.first_tokens, args.observation_tokens, args.new_tokens)
    works = [build_workload(codec, *sizes, seed=r) for r in range(args.repeats)]
    lengths = works[0].prompt_lengths()
    peak = peaks()
    context = {
        "episodes": args.episodes, "turns": args.turns, "new_tokens": args.new_tokens, "dtype": args.dtype,
        "dtype_why": args.dtype_why,
        "prompt_tokens_first": lengths[0], "prompt_tokens_last": lengths[-1], "repeats": args.repeats,
        "engine_order": "interleaved per repeat, forwards then backwards (fresh start each)",
        "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(), "device": args.device,
        "load_avg_at_start": round(os.getloadavg()[0], 2), "peak_bf16_gflops": ceiling(peak, "bf16"),
        "peak_fp32_gflops": peak.get("fp32_gflops"), "peak_memory_gbps": peak.get("memory_gbps"),
    }  # fmt: skip
    warm = build_workload(codec, *sizes, seed=-1)  # text no timed repeat sends
    env = {"source": source, "codec": codec, "config": config, "peak": peak, "context": context, "warm": warm}
    log.info("agent workload: %s", context)
    longest = max(len(w.first[0]) + sum(len(o) for o in w.observations[0]) for w in works) + 64
    ctx = max(longest + args.new_tokens * (args.turns + 1), int(4096 * args.prefill_scale) + 64)
    engines = [e for e in args.engines if not (e in LLAMA and not source.gguf_file)]
    for name in sorted(set(args.engines) - set(engines)):
        emit(BENCH, "skipped", None, None, engine=name, reason="llama-server needs a GGUF model")
    runs = {name: Runs() for name in engines}
    for r, work in enumerate(works):
        for name in engine_order([e for e in engines if e in runs], r):
            log.info("repeat %d: running %s", r + 1, name)
            try:
                await run_repeat(name, args, work, r, env, runs[name], ctx)
            except Exception as exc:  # one engine failing to start is a line, not a lost run
                if name not in LLAMA:
                    raise
                emit(BENCH, "skipped", None, None, engine=name, reason=str(exc).splitlines()[0][:300])
                del runs[name]
    got = {name: report(name, found, args, context) for name, found in runs.items()}
    incomplete = not all(found["complete"] for found in got.values())
    missed = goals(got, args, context)
    if incomplete:
        missed.append("an episode came short of its tokens")
    for why in missed:
        log.error("goal missed: %s", why)
    return 1 if missed and not args.no_goals else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--model", default=None, help="model spec for resolve_model (default: packaged SmolLM2)")
    add("--device", default="cpu")
    add("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
        help="LocalEngine, HF and the GGUF (auto: what the product picks on this machine)")  # fmt: skip
    add("--quick", action="store_true", help="4 episodes x 3 turns, shorter prompts")
    add("--short", action="store_true", help="only the short-prompt section (engine_short.py)")
    add("--episodes", type=int, default=8)
    add("--turns", type=int, default=6)
    add("--first-tokens", type=int, default=1400, help="file listing in the first prompt")
    add("--observation-tokens", type=int, default=500)
    add("--new-tokens", type=int, default=128)
    add("--prefix-cache-bytes", type=int, default=None, help="LocalEngine's cap (default: the product's)")
    add("--engines", default="local_new,llama_server,hf_generate,llama_server_q4_1",
        help="comma-separated: local_new, llama_server, hf_generate, llama_server_q4_1, "
        "llama_server_passive, local_no_reuse, local_old")  # fmt: skip
    add("--repeats", type=int, default=3, help="runs per engine (median and spread)")
    add("--prefill-scale", type=float, default=1.0, help="prefill figure: prompt sizes x this (tests)")
    add("--no-prefill", action="store_true", help="skip the 4K / 4x2K prefill figure")
    add("--no-goals", action="store_true", help="exit 0 even when a goal is missed (exploratory runs)")
    add("--short-max-tokens", type=int, default=64)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if parser.parse_args(argv).quick:  # smaller defaults; flags given still win
        parser.set_defaults(episodes=4, turns=3, first_tokens=500, observation_tokens=250, new_tokens=48)
    args = parser.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    precision = resolve_precision(args.dtype, args.device)  # every engine runs the product's choice
    args.dtype, args.dtype_why = precision.dtype, precision.why
    log.info("dtype %s (%s)", args.dtype, args.dtype_why)
    if args.short:
        asyncio.run(short_section(args))
        return 0
    return asyncio.run(agent_section(args))


if __name__ == "__main__":
    sys.exit(main())
