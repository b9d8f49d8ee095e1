"""What the gateway adds per chat request, with generation taken out.

The engine is a zero-latency `TokenEngine` (it answers every prompt at once with the same few
tokens), so every figure is overhead: HTTP, JSON, session bookkeeping, the codec's continuation
render and tokenization, and the tool-call parse. Conversations are append-only and grow by one
user message (~30 tokens) per turn, as a harness's do. The real SmolLM2 tokenizer and template.

* ``direct_engine_us`` -- the peer: `engine.generate(prompt_ids)` called directly (the floor).
* ``token_chat_model_us`` -- the in-process peer: `TokenChatModel.query` over the same engine
  (same codec work, no HTTP).
* ``gateway_request_us`` at ``sessions`` 1 and 50 -- one `POST /sessions/{id}/v1/chat/completions`
  through aiohttp (keep-alive) to a gateway served by uvicorn in this process; 50 sessions run their
  conversations concurrently. Median latency per request, and ``gateway_requests_per_s``.
* ``gateway_overhead_us`` -- gateway median minus direct-engine median at each concurrency.
* ``gateway_handler_us`` -- the part spent in the gateway's own chat handler (session lookup, history
  match, codec continuation, engine call, parse, response body), without HTTP.

Client and server share this process and its event loop, so at 50 sessions a request's latency also
waits for the other 49 sessions' client and server work: it is a queueing figure, and throughput
(requests/s, or its inverse ``gateway_us_per_request_at_load``) is the one to compare. Each figure
is the median over `--repeats` runs after one warm-up. One JSON object per line on stdout.

    .venv/bin/python bench/gateway.py          # about a minute on 2 CPU cores
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import statistics
import time
from functools import partial
from typing import Any

import aiohttp

from common import emit as common_emit
from uniagent.gateway import Gateway
from uniagent.gateway.server import GatewayServer
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.loading import load_tokenizer, smollm2_source
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser
from uniagent.tokens import ChatCodec

BENCH = "gateway"
SYSTEM = {"role": "system", "content": "You are a careful assistant working in a sandbox."}


emit = partial(common_emit, BENCH)


class InstantEngine:
    """A zero-latency TokenEngine: the same short reply (ending with the end-of-turn) at once."""

    def __init__(self, reply_ids: list[int]) -> None:
        self.reply = reply_ids
        self.calls = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> Generation:
        self.calls += 1
        return Generation(list(self.reply), [-0.1] * len(self.reply), "stop")


def user(turn: int, session: int) -> dict[str, str]:
    return {
        "role": "user",
        "content": f"Step {turn} of session {session}: run the next command and report what it printed.",
    }


async def direct(engine: InstantEngine, codec: ChatCodec, turns: int) -> list[float]:
    prompt = codec.prompt_ids([SYSTEM, user(0, 0)])
    sampling = SamplingParams(max_tokens=16, stop_token_ids=codec.stop_token_ids)
    out = []
    for _ in range(turns):
        t0 = time.perf_counter()
        await engine.generate(prompt, sampling, "direct")
        out.append(time.perf_counter() - t0)
    return out


async def in_process(engine: InstantEngine, codec: ChatCodec, turns: int) -> list[float]:
    model = TokenChatModel(engine, codec, get_parser("hermes"), SamplingParams(max_tokens=16))
    messages: list[dict[str, Any]] = [SYSTEM, user(0, 0)]
    out = []
    for turn in range(turns):
        t0 = time.perf_counter()
        reply = await model.query(messages)
        out.append(time.perf_counter() - t0)
        messages += [reply.message, user(turn + 1, 0)]
    return out


async def conversation(http: aiohttp.ClientSession, base: str, session: int, turns: int) -> list[float]:
    async with http.post(f"{base}/sessions", json={"sampling": {"max_tokens": 16}}) as r:
        sid = (await r.json())["session_id"]
    url = f"{base}/sessions/{sid}/v1/chat/completions"
    messages: list[dict[str, Any]] = [SYSTEM, user(0, session)]
    out = []
    for turn in range(turns):
        t0 = time.perf_counter()
        async with http.post(url, json={"model": "bench", "messages": messages}) as r:
            r.raise_for_status()
            body = await r.json()
        out.append(time.perf_counter() - t0)
        messages += [body["choices"][0]["message"], user(turn + 1, session)]
    async with http.get(f"{base}/sessions/{sid}/trajectories") as r:
        r.raise_for_status()
    async with http.delete(f"{base}/sessions/{sid}") as r:
        r.raise_for_status()
    return out


async def through_gateway(server: GatewayServer, sessions: int, turns: int) -> tuple[list[float], float]:
    connector = aiohttp.TCPConnector(limit=sessions + 4)
    async with aiohttp.ClientSession(connector=connector) as http:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(conversation(http, server.url, i, turns) for i in range(sessions)))
        wall = time.perf_counter() - t0
    latencies = [x for r in results for x in r]
    return latencies, len(latencies) / wall


async def main(args: argparse.Namespace) -> None:
    codec = ChatCodec(load_tokenizer(smollm2_source()))
    engine = InstantEngine(codec.encode("Done: the command printed 42.") + codec.eot_ids)
    context = {"turns": args.turns, "cpu_count": os.cpu_count(), "python": platform.python_version()}

    medians: dict[str, list[float]] = {"direct": [], "in_process": []}
    for rep in range(args.repeats + 1):
        d = statistics.median(await direct(engine, codec, args.turns * 10))
        p = statistics.median(await in_process(engine, codec, args.turns))
        if rep:  # the first run is a warm-up
            medians["direct"].append(d)
            medians["in_process"].append(p)
    direct_us = statistics.median(medians["direct"]) * 1e6
    emit("direct_engine_us", round(direct_us, 2), "us", **context)
    emit("token_chat_model_us", round(statistics.median(medians["in_process"]) * 1e6, 1), "us", **context)

    gateway = Gateway(engine, codec)
    handler: list[float] = []
    serve = gateway.calls.serve  # every protocol route's handler, looked up per request

    async def timed_serve(wire: Any, session: Any, body: dict[str, Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return await serve(wire, session, body)
        finally:
            handler.append(time.perf_counter() - t0)

    gateway.calls.serve = timed_serve  # type: ignore[method-assign]
    async with GatewayServer(gateway) as server:
        for sessions in (1, 50):
            lat, rps, inside = [], [], []
            for rep in range(args.repeats + 1):
                handler.clear()
                latencies, per_s = await through_gateway(server, sessions, args.turns)
                if rep:
                    lat.append(statistics.median(latencies))
                    rps.append(per_s)
                    inside.append(statistics.median(handler))
            med = statistics.median(lat) * 1e6
            ctx = {**context, "sessions": sessions}
            emit("gateway_request_us", round(med, 1), "us", **ctx)
            emit("gateway_overhead_us", round(med - direct_us, 1), "us", **ctx)
            emit("gateway_requests_per_s", round(statistics.median(rps), 1), "1/s", **ctx)
            # Wall time per request at full load: client + server work per request, without queueing.
            emit("gateway_us_per_request_at_load", round(1e6 / statistics.median(rps), 1), "us", **ctx)
            emit("gateway_handler_us", round(statistics.median(inside) * 1e6, 1), "us", **ctx)
    logging.info("engine calls: %d", engine.calls)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=8, help="requests per conversation")
    parser.add_argument("--repeats", type=int, default=3)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    asyncio.run(main(parser.parse_args()))
