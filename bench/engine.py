"""LocalEngine on agent-shaped work, against llama.cpp's `llama-server` and Hugging Face `generate`.

Agent section (the default). `--episodes` episodes run at once, each `--turns` turns, greedy, exactly
`--new-tokens` tokens per turn (no stop ids). The first prompt is a real chat render (ChatCodec, the
model's own template) of a system prompt, a task and a file listing, ~`--first-tokens` tokens; after
each turn the cut assistant turn is closed (`eot_ids`) and a ~`--observation-tokens` tool observation is
appended with `continuation_ids`, exactly what TokenChatModel sends. Same prompts for every engine:

* ``local_old`` -- LocalEngine as it was before prefix reuse (commit b1376d0, loaded from git: DynamicCache,
  head-repeating attention, every turn prefilled in full), all episodes at once.
* ``local_new`` -- LocalEngine now (prefix reuse, SlotCache, GQA attention), all episodes at once;
  ``local_no_reuse`` (opt-in: ``--engines``) is the same with ``prefix_cache_bytes=0``.
* ``llama_server`` -- the `llamacpp:` RemoteEngine over a `LlamaServer` with one slot per episode (its
  own prefix cache per slot), all episodes at once. Skipped, with the reason, when no binary is built
  (`make llama-server`).
* ``hf_generate`` -- `model.generate` on each turn's full prompt, one turn after another
  (`--hf-episodes` episodes only: sequential throughput does not depend on how many run).

Figures per engine: ``aggregate_tokens_per_s`` (all generated tokens / wall time of the whole run),
``ttft_s`` per turn index (request sent -> first token, mean over episodes; LocalEngine streams its
tokens, the others report the whole turn as ``turn_s``), ``episode_s`` (mean wall time of an episode),
``prefill_tokens`` where the engine counts them; then ``new_vs_old`` (goal >= 4) and
``new_vs_llama_server`` (goal >= 0.5). One JSON object per line on stdout; logs on stderr.

Short section (``--short``): the earlier figures -- 8 chat prompts of 30-50 tokens at concurrency 1, 4, 8
vs sequential `generate` (``local_engine_tokens_per_s``, ``concurrent8_vs_single``, ...).

    .venv/bin/python bench/engine.py --quick   # 4 episodes x 3 turns, ~600 -> ~1,600 tokens: ~5 min
    .venv/bin/python bench/engine.py           # 8 x 6, ~1,500 -> ~5,000 tokens: about an hour on
                                               # 2 CPU cores, most of it local_old and hf_generate
    .venv/bin/python bench/engine.py --short   # the short-prompt figures, about 4 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from uniagent.models.base import Generation, SamplingParams
from uniagent.models.loading import load_causal_lm, load_tokenizer, resolve_model
from uniagent.models.local import LocalEngine
from uniagent.tokens import ChatCodec

BENCH = "engine"
OLD_COMMIT = "b1376d0"  # LocalEngine before prefix reuse (issue 13)
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


async def short_section(args: argparse.Namespace) -> None:
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
        "max_tokens": args.short_max_tokens,
        "repeats": args.repeats,
    }
    try:
        log.info("warm-up")
        await engine_run(engine, prompts[:2], 2, 4)

        per_concurrency = {}
        for concurrency in (1, 4, 8):
            runs = []
            for _ in range(args.repeats):
                runs.append(await engine_run(engine, prompts, concurrency, args.short_max_tokens))
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
            runs.append(hf_run(engine.model, prompts, args.short_max_tokens))
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


# ------------------------------------------------------------------------------------ agent section

WORDS = ("def", "class", "return", "import", "self", "value", "config", "error", "path", "test",
         "token", "engine", "batch", "cache", "prefix", "request", "sandbox", "output", "parse")  # fmt: skip


def observation_text(rng: random.Random, tokens: int, codec: ChatCodec) -> str:
    """A tool observation of about `tokens` tokens: numbered source-like lines, different per call."""
    lines: list[str] = []
    while len(codec.encode("\n".join(lines))) < tokens:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10)))
        lines.append(f"{len(lines) + 1:4d}  {words}({rng.randint(0, 999)})")
    return "\n".join(lines)


@dataclass
class Workload:
    first: list[list[int]]  # per episode
    observations: list[list[list[int]]]  # per episode, per turn after the first: continuation ids
    eot: list[int]
    new_tokens: int

    def next_prompt(self, episode: int, turn: int, prompt: list[int], generated: list[int]) -> list[int]:
        return prompt + generated + self.eot + self.observations[episode][turn]


def build_workload(args: argparse.Namespace, codec: ChatCodec) -> Workload:
    rng = random.Random(0)
    first, observations = [], []
    for episode in range(args.episodes):
        messages = [
            {
                "role": "system",
                "content": "You are a coding agent. Call the bash tool to inspect and fix code.",
            },
            {
                "role": "user",
                "content": f"Task {episode}: the tests fail. Here is the module:\n"
                + observation_text(rng, args.first_tokens, codec),
            },
        ]
        first.append(codec.prompt_ids(messages))
        observations.append(
            [
                codec.continuation_ids(
                    [{"role": "tool", "content": observation_text(rng, args.observation_tokens, codec)}]
                )
                for _ in range(args.turns - 1)
            ]
        )
    return Workload(first, observations, list(codec.eot_ids), args.new_tokens)


@dataclass
class Result:
    tokens: int = 0
    wall_s: float = 0.0
    episode_s: list[float] = field(default_factory=list)
    ttft: dict[int, list[float]] = field(default_factory=dict)
    turn_s: dict[int, list[float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


async def drive(generate: Any, work: Workload, episodes: list[int], streams: bool) -> Result:
    """Run `episodes` concurrently through `generate(prompt, sampling, request_id, on_token)`."""
    sampling = SamplingParams(temperature=0.0, max_tokens=work.new_tokens, stop_token_ids=[])
    result = Result()

    async def episode(i: int) -> None:
        began = time.perf_counter()
        prompt = work.first[i]
        for turn in range(len(work.observations[i]) + 1):
            sent = time.perf_counter()
            first: list[float] = []

            def on_token(token: int, logprob: float, first: list[float] = first) -> None:
                if not first:
                    first.append(time.perf_counter())

            gen = await generate(prompt, sampling, f"episode-{i}", on_token if streams else None)
            assert len(gen.token_ids) == work.new_tokens, (len(gen.token_ids), gen.finish_reason)
            done = time.perf_counter()
            result.tokens += len(gen.token_ids)
            result.turn_s.setdefault(turn, []).append(done - sent)
            if first:
                result.ttft.setdefault(turn, []).append(first[0] - sent)
            if turn < len(work.observations[i]):
                prompt = work.next_prompt(i, turn, prompt, gen.token_ids)
        result.episode_s.append(time.perf_counter() - began)

    started = time.perf_counter()
    await asyncio.gather(*(episode(i) for i in episodes))
    result.wall_s = time.perf_counter() - started
    return result


def old_engine_class() -> Any:
    """LocalEngine as of commit b1376d0 (before prefix reuse), loaded from git into a private module."""
    text = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:src/uniagent/models/local.py"],
        cwd=Path(__file__).resolve().parents[1],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("uniagent_bench_old_local")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(text, f"{OLD_COMMIT}:local.py", "exec"), module.__dict__)
    return module.LocalEngine


async def run_local(name: str, args: argparse.Namespace, work: Workload, source: Any) -> Result:
    episodes = list(range(args.episodes))
    if name == "local_old":
        engine = await asyncio.to_thread(old_engine_class(), source, device=args.device)
    else:
        budget = 0 if name == "local_no_reuse" else args.prefix_cache_bytes
        engine = await LocalEngine.create(source, device=args.device, prefix_cache_bytes=budget)
    try:
        await engine.generate(work.first[0][:16], SamplingParams(temperature=0.0, max_tokens=2), "warm-up")

        async def generate(prompt: list[int], sampling: SamplingParams, rid: str, on_token: Any) -> Any:
            return await engine.generate(prompt, sampling, rid, on_token=on_token)

        result = await drive(generate, work, episodes, streams=True)
        stats = engine.stats
        result.extra = {"decode_steps": stats.decode_steps, "max_rows": stats.max_rows}
        for key in ("prefill_tokens", "prefix_hits", "prefix_reused_tokens"):
            if hasattr(stats, key):
                result.extra[key] = getattr(stats, key)
        return result
    finally:
        await engine.aclose()


async def run_llama_server(args: argparse.Namespace, work: Workload) -> Result | str:
    try:
        from uniagent.models.remote.llama_server import LlamaServer, find_binary
        from uniagent.models.remote.llamacpp import build_llamacpp_engine
    except ImportError as exc:
        return f"llama.cpp engine not available: {exc}"
    if find_binary() is None:
        return "no llama-server binary: build it with `make llama-server`"
    longest = max(
        len(f) + sum(len(o) for o in obs) for f, obs in zip(work.first, work.observations, strict=True)
    )
    ctx = longest + work.new_tokens * (len(work.observations[0]) + 2)
    async with LlamaServer(slots=args.episodes, ctx_size=ctx, threads=os.cpu_count()) as server:
        engine = build_llamacpp_engine([server.url])
        try:
            await engine.generate(
                work.first[0][:16], SamplingParams(temperature=0.0, max_tokens=2), "warm-up"
            )

            async def generate(prompt: list[int], sampling: SamplingParams, rid: str, on_token: Any) -> Any:
                return await engine.generate(prompt, sampling, rid)

            return await drive(generate, work, list(range(args.episodes)), streams=False)
        finally:
            await engine.aclose()


async def run_hf(args: argparse.Namespace, work: Workload, source: Any) -> Result:
    """Sequential `generate` on each turn's full prompt, on this thread (blocking the loop: nothing else
    runs), after the engines' threads have exited: the only OpenMP team, as in LocalEngine._main."""
    model = load_causal_lm(source, device=args.device)

    async def generate(prompt: list[int], sampling: SamplingParams, rid: str, on_token: Any) -> Any:
        ids = torch.tensor([prompt], device=model.device)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=sampling.max_tokens,
                min_new_tokens=sampling.max_tokens,
                pad_token_id=0,
            )
        return Generation(out[0, ids.shape[1] :].tolist(), [0.0] * sampling.max_tokens, "length")

    episodes = list(range(min(args.hf_episodes, args.episodes)))
    return await drive(generate, work, episodes, streams=False)


def report(name: str, result: Result, context: dict[str, Any]) -> float:
    rate = result.tokens / result.wall_s
    emit("aggregate_tokens_per_s", round(rate, 2), "tokens/s", engine=name, wall_s=round(result.wall_s, 1),
         tokens=result.tokens, **result.extra, **context)  # fmt: skip
    emit("episode_s", round(statistics.mean(result.episode_s), 1), "s", engine=name, **context)
    for turn in sorted(result.turn_s):
        if turn in result.ttft:
            emit("ttft_s", round(statistics.mean(result.ttft[turn]), 2), "s", engine=name, turn=turn + 1)
        emit("turn_s", round(statistics.mean(result.turn_s[turn]), 2), "s", engine=name, turn=turn + 1)
    return rate


async def agent_section(args: argparse.Namespace) -> None:
    log = logging.getLogger(BENCH)
    source = resolve_model(args.model)
    codec = ChatCodec(load_tokenizer(source))
    work = build_workload(args, codec)
    lengths = [len(work.first[0])]
    for obs in work.observations[0]:
        lengths.append(lengths[-1] + work.new_tokens + len(work.eot) + len(obs))
    context = {
        "episodes": args.episodes,
        "turns": args.turns,
        "new_tokens": args.new_tokens,
        "prompt_tokens_first": lengths[0],
        "prompt_tokens_last": lengths[-1],
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "device": args.device,
    }
    log.info("agent workload: %s", context)
    rates: dict[str, float] = {}
    for name in args.engines:
        log.info("running %s", name)
        if name in ("local_old", "local_new", "local_no_reuse"):
            result: Result | str = await run_local(name, args, work, source)
        elif name == "llama_server":
            result = await run_llama_server(args, work)
        elif name == "hf_generate":
            result = await run_hf(args, work, source)
        else:
            raise SystemExit(f"unknown engine {name!r}")
        if isinstance(result, str):
            emit("skipped", None, None, engine=name, reason=result)
            continue
        rates[name] = report(name, result, context)
        log.info("%s: %.2f tokens/s", name, rates[name])
    if "local_new" in rates and "local_old" in rates:
        ratio = rates["local_new"] / rates["local_old"]
        emit("new_vs_old", round(ratio, 2), "x", goal=4.0, met=ratio >= 4.0, **context)
    if "local_new" in rates and "llama_server" in rates:
        ratio = rates["local_new"] / rates["llama_server"]
        emit("new_vs_llama_server", round(ratio, 2), "x", goal=0.5, met=ratio >= 0.5, **context)
    if "local_new" in rates and "hf_generate" in rates:
        emit("new_vs_hf_generate", round(rates["local_new"] / rates["hf_generate"], 2), "x", **context)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=None, help="model spec for resolve_model (default: packaged SmolLM2)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="4 episodes x 3 turns, shorter prompts")
    parser.add_argument("--short", action="store_true", help="only the short-prompt section")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--first-tokens", type=int, default=1400, help="file listing in the first prompt")
    parser.add_argument("--observation-tokens", type=int, default=500)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--hf-episodes", type=int, default=1)
    parser.add_argument("--prefix-cache-bytes", type=int, default=4 * 1024**3)
    parser.add_argument(
        "--engines",
        default="local_old,local_new,llama_server,hf_generate",
        help="comma-separated: local_old, local_new, local_no_reuse, llama_server, hf_generate",
    )
    parser.add_argument("--short-max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="short section: runs per figure")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.turns, args.first_tokens = 4, 3, 500
        args.observation_tokens, args.new_tokens = 250, 48
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.short:
        await short_section(args)
    else:
        await agent_section(args)


if __name__ == "__main__":
    asyncio.run(main())
