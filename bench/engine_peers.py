"""The engines bench/engine.py runs, each behind one `generate(prompt, sampling, request_id, on_token)`.

* ``local_new`` -- LocalEngine (public API: `LocalEngine.create(source, device=, dtype=)`, product
  defaults: prefix cache None = a quarter of the memory budget), all episodes at once;
  ``local_no_reuse`` the same with ``prefix_cache_bytes=0``; ``local_old`` (opt-in) LocalEngine as of
  commit b1376d0, before prefix reuse, loaded from git.
* ``llama_server`` -- llama.cpp's server on the packaged GGUF re-written at the run's precision
  (engine_gguf.py: F32 or BF16), one slot per episode, OpenMP threads spinning as torch's do
  (OpenMP's default); ``llama_server_passive`` the same with passive waits (the product's default for
  a shared machine); ``llama_server_q4_1`` the packaged 4-bit file (a labelled extra line, not the
  comparison). Requests go straight to `/completion` with `ignore_eos` (every engine makes exactly the
  asked tokens) and the same logprob request as the product's llamacpp dialect; the server's per-request
  `timings` give its prefill and decode time.
* ``hf_generate`` -- `model.generate` batched per turn: all episodes' turn-k prompts left-padded into one
  greedy call of exactly `new_tokens` tokens, so it does the same work as the batched engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import types
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine_gguf import gguf_for
from engine_workload import ForwardClock, Generate
from uniagent.cpu import release_openmp_team
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.loading import load_causal_lm
from uniagent.models.local import LocalEngine

OLD_COMMIT = "b1376d0"  # LocalEngine before prefix reuse (issue 13)
LOCAL = ("local_new", "local_no_reuse", "local_old")
LLAMA = ("llama_server", "llama_server_passive", "llama_server_q4_1")


@dataclass
class Side:
    """One engine, started and ready: how to call it and how to read its time split."""

    name: str
    generate: Generate
    streams: bool
    weight_bytes: int
    precision: str  # float32 | bfloat16 | q4_1
    reuses_prefix: bool
    clock: ForwardClock | None = None
    timings: list[dict[str, Any]] = field(default_factory=list)  # llama-server, per request
    stats: Callable[[], dict[str, Any]] | None = None  # the engine's counters now
    group: list[int] = field(default_factory=lambda: [1])  # hf_generate: prompts per generate call

    def reset(self) -> None:
        if self.clock is not None:
            self.clock.reset()
        self.timings.clear()


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


@contextlib.asynccontextmanager
async def open_side(name: str, args: Any, source: Any, slots: int, ctx: int) -> AsyncIterator[Side]:
    """Start engine `name` (`args.dtype`, `args.device`), yield it, stop it (threads and process gone)."""
    if name in LOCAL:
        async with _local(name, args, source) as side:
            yield side
    elif name in LLAMA:
        async with _llama(name, args, slots, ctx) as side:
            yield side
    elif name == "hf_generate":
        try:
            yield _hf(args, source)
        finally:  # its forwards ran on this thread: their threads would throttle the next engine's
            release_openmp_team()
    else:
        raise SystemExit(f"unknown engine {name!r}; one of {', '.join((*LOCAL, *LLAMA, 'hf_generate'))}")


@contextlib.asynccontextmanager
async def _local(name: str, args: Any, source: Any) -> AsyncIterator[Side]:
    from roofline import weight_bytes

    if name == "local_old":
        engine: Any = await asyncio.to_thread(old_engine_class(), source, device=args.device)
    else:
        options: dict[str, Any] = {"device": args.device, "dtype": args.dtype}
        budget = 0 if name == "local_no_reuse" else args.prefix_cache_bytes
        if budget is not None:
            options["prefix_cache_bytes"] = budget
        engine = await LocalEngine.create(source, **options)
    clock = ForwardClock(engine.model)

    async def generate(prompt: list[int], sampling: SamplingParams, rid: str, on_token: Any) -> Generation:
        return await engine.generate(prompt, sampling, rid, on_token=on_token)

    def stats() -> dict[str, Any]:
        got = engine.stats
        keys = ("decode_steps", "max_rows", "prefill_tokens", "prefix_hits", "prefix_reused_tokens")
        return {k: getattr(got, k) for k in keys if hasattr(got, k)}

    precision = "float32" if name == "local_old" else args.dtype
    try:
        yield Side(
            name,
            generate,
            True,
            weight_bytes(engine.model),
            precision,
            name == "local_new",
            clock,
            stats=stats,
        )
    finally:
        clock.close()
        await engine.aclose()


@contextlib.asynccontextmanager
async def _llama(name: str, args: Any, slots: int, ctx: int) -> AsyncIterator[Side]:
    import httpx

    from uniagent.models.remote.llama_server import LlamaServer, require_binary
    from uniagent.models.remote.llamacpp import LlamaCppDialect

    require_binary()
    gguf = None if name == "llama_server_q4_1" else gguf_for(args.dtype)
    server = LlamaServer(
        gguf, slots=slots, ctx_size=ctx, threads=os.cpu_count(), spin=name != "llama_server_passive"
    )
    precision = "q4_1" if gguf is None else args.dtype
    dialect = LlamaCppDialect()
    timings: list[dict[str, Any]] = []
    async with server, httpx.AsyncClient(base_url=server.url, timeout=3600.0) as client:

        async def generate(
            prompt: list[int], sampling: SamplingParams, rid: str, on_token: Any
        ) -> Generation:
            body = dialect.request(prompt, sampling, rid)
            body["ignore_eos"] = True  # exactly max_tokens, as the other engines make
            body["response_fields"] = [*body["response_fields"], "timings"]
            reply = await client.post("/completion", json=body)
            reply.raise_for_status()
            data = reply.json()
            timings.append({"prompt_len": len(prompt), **data.get("timings", {})})
            return Generation(list(data["tokens"]), [0.0] * len(data["tokens"]), "length")

        nbytes = Path(server.gguf).stat().st_size  # every weight read once a step (tied embedding once)
        yield Side(name, generate, False, nbytes, precision, True, timings=timings)


def _hf(args: Any, source: Any) -> Side:
    """HF `generate` batched per call group: requests wait until `group[0]` have come, then run as one
    left-padded greedy call on this thread (the engines' threads have exited: the only OpenMP team)."""
    from roofline import weight_bytes

    model = load_causal_lm(source, device=args.device, dtype=args.dtype)
    clock = ForwardClock(model)
    group = [1]
    waiting: list[tuple[list[int], asyncio.Future[Generation]]] = []

    def run(prompts: list[list[int]], new: int) -> list[list[int]]:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=0,
            )
        return out[:, width:].tolist()

    async def generate(prompt: list[int], sampling: SamplingParams, rid: str, on_token: Any) -> Generation:
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        waiting.append((prompt, future))
        if len(waiting) >= group[0]:
            batch = waiting[:]
            waiting.clear()
            for (_, fut), ids in zip(batch, run([p for p, _ in batch], sampling.max_tokens), strict=True):
                fut.set_result(Generation(ids, [0.0] * len(ids), "length"))
        return await future

    return Side("hf_generate", generate, False, weight_bytes(model), args.dtype, False, clock, group=group)
