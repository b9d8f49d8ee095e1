"""What `RemoteEngine` adds per request over a raw HTTP call to the same server (goal: <= 2 ms).

A loopback server in a child process answers every request at once with a fixed completion in the
dialect's documented shape (128 generated tokens with logprobs; vLLM also echoes the prompt ids, as
it does with `return_token_ids`), so generation is taken out and both peers pay the same server and
network cost. Prompts have the shape of agent turns (1,500 and 5,000 token ids).

* ``raw_request_us`` -- the peer: one `httpx.AsyncClient.post(url, json=body)` of a prebuilt body
  plus `response.json()`, on a keep-alive connection.
* ``engine_request_us`` -- `RemoteEngine.generate(prompt_ids, sampling, request_id)`: routing, body
  built by the dialect, serialization, the same POST, parse and validation into a `Generation`.
* ``engine_overhead_us`` -- engine minus raw, medians over `--requests` calls each, run in
  alternating blocks of 20 so drift on the machine hits both alike (on a busy machine this
  difference is noisy, even negative: it is two medians of a few ms each).
* ``engine_own_cpu_us`` -- the same difference without the network: the dialect's body, its
  serialization and the parse/validation of the answer, minus the raw call's serialization of the
  same body and decoding of the same answer (a steady figure for the added work).

One JSON object per line on stdout.

    .venv/bin/python bench/remote.py          # about half a minute on 2 CPU cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import socket
import statistics
import time
from functools import partial
from typing import Any

import httpx

from common import emit as common_emit
from uniagent.models.base import SamplingParams
from uniagent.models.remote.base import RemoteEngine
from uniagent.models.remote.sglang import SGLangDialect
from uniagent.models.remote.vllm import VLLMDialect

BENCH = "remote"
NEW_TOKENS = 128
DIALECTS = {"vllm": VLLMDialect, "sglang": SGLangDialect}


emit = partial(common_emit, BENCH)


def answers(prompt_len: int) -> dict[str, bytes]:
    """The fixed completion each dialect's server returns (documented shapes, see tests/fixtures/remote)."""
    ids = [(i * 7919) % 49000 + 3 for i in range(NEW_TOKENS - 1)] + [2]
    lps = [-0.01 * (i % 50) - 0.001 for i in range(NEW_TOKENS)]
    tokens = [f"token_id:{t}" for t in ids]
    vllm = {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "text": "x" * 400,
                "logprobs": {
                    "text_offset": list(range(0, 12 * NEW_TOKENS, 12)),
                    "token_logprobs": lps,
                    "tokens": tokens,
                    "top_logprobs": [{t: lp} for t, lp in zip(tokens, lps, strict=True)],
                },
                "finish_reason": "stop",
                "stop_reason": 2,
                "token_ids": ids,
                "prompt_token_ids": list(range(3, prompt_len + 3)),
            }
        ],
        "usage": {"prompt_tokens": prompt_len, "completion_tokens": NEW_TOKENS},
    }
    sglang = {
        "text": "x" * 400,
        "output_ids": ids,
        "meta_info": {
            "id": "bench",
            "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": prompt_len,
            "completion_tokens": NEW_TOKENS,
            "output_token_logprobs": [[lp, t, None] for t, lp in zip(ids, lps, strict=True)],
        },
    }
    return {"vllm": json.dumps(vllm).encode(), "sglang": json.dumps(sglang).encode()}


def serve(port: int, prompt_len: int, ready: Any) -> None:
    """The child process: an aiohttp server answering both dialects' generate paths at once."""
    from aiohttp import web

    bodies = answers(prompt_len)

    def answer(kind: str):
        async def handler(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=bodies[kind], content_type="application/json")

        return handler

    async def main() -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for kind, cls in DIALECTS.items():
            app.router.add_post(cls.generate_path, answer(kind))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


async def measure(url: str, kind: str, prompt_len: int, requests: int) -> tuple[float, float]:
    """Medians of the raw call and of `generate`, in alternating blocks of 20 after a warm-up."""
    prompt = [(i * 104729) % 49000 + 3 for i in range(prompt_len)]
    sampling = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, stop_token_ids=[2], seed=7)
    dialect = DIALECTS[kind]()
    body = dialect.request(prompt, sampling, "raw-1")
    raw_times: list[float] = []
    engine_times: list[float] = []
    async with httpx.AsyncClient(timeout=30) as client, RemoteEngine([url], dialect) as engine:

        async def raw() -> None:
            response = await client.post(url + dialect.generate_path, json=body)
            response.raise_for_status()
            response.json()

        async def through_engine(i: int) -> None:
            await engine.generate(prompt, sampling, f"episode-{i % 8}")

        for i in range(10):
            await raw()
            await through_engine(i)
        for block in range(0, requests, 20):
            for _ in range(block, min(block + 20, requests)):
                t0 = time.perf_counter()
                await raw()
                raw_times.append(time.perf_counter() - t0)
            for i in range(block, min(block + 20, requests)):
                t0 = time.perf_counter()
                await through_engine(i)
                engine_times.append(time.perf_counter() - t0)
    return statistics.median(raw_times), statistics.median(engine_times)


def own_work(kind: str, prompt_len: int, repeats: int = 200) -> float:
    """The engine's own CPU per request without the network: its body, serialization and parse,
    minus what the raw call also does (serialize the same body, decode the same answer)."""
    prompt = [(i * 104729) % 49000 + 3 for i in range(prompt_len)]
    sampling = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, stop_token_ids=[2], seed=7)
    dialect = DIALECTS[kind]()
    answer = answers(prompt_len)[kind]
    body = dialect.request(prompt, sampling, "raw-1")
    ours, theirs = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        json.dumps(dialect.request(prompt, sampling, "own-1"), separators=(",", ":")).encode()
        dialect.response(json.loads(answer), sampling)
        t1 = time.perf_counter()
        json.dumps(body).encode()
        json.loads(answer)
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        theirs.append(t2 - t1)
    return statistics.median(ours) - statistics.median(theirs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(args: argparse.Namespace) -> None:
    context = {"cpu_count": os.cpu_count(), "python": platform.python_version(), "new_tokens": NEW_TOKENS}
    spawn = multiprocessing.get_context("spawn")
    for prompt_len in (1500, 5000):
        port = free_port()
        ready = spawn.Event()
        server = spawn.Process(target=serve, args=(port, prompt_len, ready), daemon=True)
        server.start()
        try:
            if not ready.wait(60):
                raise RuntimeError("the loopback server did not start")
            for kind in DIALECTS:
                raw, eng = asyncio.run(measure(f"http://127.0.0.1:{port}", kind, prompt_len, args.requests))
                ctx = {**context, "dialect": kind, "prompt_tokens": prompt_len, "requests": args.requests}
                emit("raw_request_us", round(raw * 1e6, 1), "us", **ctx)
                emit("engine_request_us", round(eng * 1e6, 1), "us", **ctx)
                emit("engine_overhead_us", round((eng - raw) * 1e6, 1), "us", goal_us=2000, **ctx)
                emit("engine_own_cpu_us", round(own_work(kind, prompt_len) * 1e6, 1), "us", **ctx)
        finally:
            server.terminate()
            server.join(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per peer and figure")
    main(parser.parse_args())
