"""The agent-shaped work bench/engine.py gives every engine, the driver that runs it, and the clock that
splits a torch engine's time into prefill and decode.

Why its own module: the engines (engine_peers.py), the prefill figure (engine_prefill.py) and the tests
all build the same prompts and read the same `Result`, and bench/engine.py stays the report.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from uniagent.models.base import Generation, SamplingParams
from uniagent.tokens import ChatCodec

WORDS = ("def", "class", "return", "import", "self", "value", "config", "error", "path", "test",
         "token", "engine", "batch", "cache", "prefix", "request", "sandbox", "output", "parse")  # fmt: skip

# generate(prompt, sampling, request_id, on_token or None) -> Generation
Generate = Callable[[list[int], SamplingParams, str, Any], Awaitable[Generation]]


def observation_text(rng: random.Random, tokens: int, codec: ChatCodec) -> str:
    """A tool observation of about `tokens` tokens: numbered source-like lines, different per call."""
    lines: list[str] = []
    while len(codec.encode("\n".join(lines))) < tokens:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10)))
        lines.append(f"{len(lines) + 1:4d}  {words}({rng.randint(0, 999)})")
    return "\n".join(lines)


@dataclass
class Workload:
    """`episodes` first prompts and, per episode, the continuation ids appended after each turn."""

    first: list[list[int]]  # per episode
    observations: list[list[list[int]]]  # per episode, per turn after the first: continuation ids
    eot: list[int]
    new_tokens: int
    tag: str = ""  # request ids carry it, so no engine reuses a prefix kept from another repeat

    @property
    def turns(self) -> int:
        return len(self.observations[0]) + 1

    def next_prompt(self, episode: int, turn: int, prompt: list[int], generated: list[int]) -> list[int]:
        return prompt + generated + self.eot + self.observations[episode][turn]

    def prompt_lengths(self) -> list[int]:
        """Episode 0's prompt length per turn (every episode is within a few tokens of it)."""
        lengths = [len(self.first[0])]
        for obs in self.observations[0]:
            lengths.append(lengths[-1] + self.new_tokens + len(self.eot) + len(obs))
        return lengths


def build_workload(
    codec: ChatCodec,
    episodes: int,
    turns: int,
    first_tokens: int,
    observation_tokens: int,
    new_tokens: int,
    seed: int,
) -> Workload:
    """Real chat renders (the model's template): a system prompt, a task with a ~`first_tokens` file
    listing; after each turn the cut assistant turn is closed and a tool observation appended, as
    TokenChatModel sends. `seed` gives each repeat fresh text (no cache holds it from an earlier run)."""
    rng = random.Random(seed)
    first, observations = [], []
    for episode in range(episodes):
        messages = [
            {
                "role": "system",
                "content": "You are a coding agent. Call the bash tool to inspect and fix code.",
            },
            {
                "role": "user",
                "content": f"Task {episode}: the tests fail. Here is the module:\n"
                + observation_text(rng, first_tokens, codec),
            },
        ]
        first.append(codec.prompt_ids(messages))
        observations.append(
            [
                codec.continuation_ids(
                    [{"role": "tool", "content": observation_text(rng, observation_tokens, codec)}]
                )
                for _ in range(turns - 1)
            ]
        )
    return Workload(first, observations, list(codec.eot_ids), new_tokens, tag=f"r{seed}")


@dataclass
class Result:
    """One run of a workload on one engine."""

    tokens: int = 0
    expected_tokens: int = 0
    wall_s: float = 0.0
    episode_s: list[float] = field(default_factory=list)
    ttft: dict[int, list[float]] = field(default_factory=dict)
    turn_s: dict[int, list[float]] = field(default_factory=dict)
    # per request: (prompt length, tokens of it the previous turn ran: its prompt and sampled tokens)
    prompts: list[tuple[int, int]] = field(default_factory=list)
    short: list[str] = field(default_factory=list)  # turns that did not produce their tokens
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.short and self.tokens == self.expected_tokens


async def drive(generate: Generate, work: Workload, streams: bool) -> Result:
    """Run every episode of `work` concurrently; each turn asks for exactly `new_tokens` tokens."""
    sampling = SamplingParams(temperature=0.0, max_tokens=work.new_tokens, stop_token_ids=[])
    result = Result(expected_tokens=len(work.first) * work.turns * work.new_tokens)

    async def episode(i: int) -> None:
        began = time.perf_counter()
        prompt, prior = work.first[i], 0
        for turn in range(work.turns):
            sent = time.perf_counter()
            first: list[float] = []

            def on_token(token: int, logprob: float, first: list[float] = first) -> None:
                if not first:
                    first.append(time.perf_counter())

            gen = await generate(prompt, sampling, f"episode-{work.tag}-{i}", on_token if streams else None)
            done = time.perf_counter()
            result.prompts.append((len(prompt), prior))
            result.tokens += len(gen.token_ids)
            if len(gen.token_ids) != work.new_tokens:
                result.short.append(
                    f"episode {i} turn {turn + 1}: {len(gen.token_ids)} ({gen.finish_reason})"
                )
                return
            result.turn_s.setdefault(turn, []).append(done - sent)
            if first:
                result.ttft.setdefault(turn, []).append(first[0] - sent)
            if turn < work.turns - 1:
                prior = len(prompt) + work.new_tokens - 1  # the last sampled token was never fed
                prompt = work.next_prompt(i, turn, prompt, gen.token_ids)
        result.episode_s.append(time.perf_counter() - began)

    started = time.perf_counter()
    await asyncio.gather(*(episode(i) for i in range(len(work.first))))
    result.wall_s = time.perf_counter() - started
    return result


async def warm_up(generate: Generate, work: Workload) -> None:
    """Every episode at once, a 64-token prompt and 2 new tokens: threads, kernels and the batched
    path are warm before anything is timed."""
    sampling = SamplingParams(temperature=0.0, max_tokens=2, stop_token_ids=[])
    await asyncio.gather(*(generate(p[:64], sampling, f"warm-{i}", None) for i, p in enumerate(work.first)))


class ForwardClock:
    """Seconds a torch model spends in forwards over more than one position (prefill) and over one
    (decode steps), through forward hooks: the public torch API, no change to the engine. Forwards
    run on one thread at a time (the engine's worker, or HF's caller), so the sums are wall time."""

    def __init__(self, model: Any) -> None:
        self.prefill_s = self.decode_s = 0.0
        self.prefill_calls = self.decode_calls = 0
        self._began = 0.0
        self._wide = False
        self._handles = [
            model.register_forward_pre_hook(self._pre, with_kwargs=True),
            model.register_forward_hook(self._post, with_kwargs=True),
        ]

    def _pre(self, module: Any, args: Any, kwargs: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        self._wide = ids is not None and ids.shape[1] > 1
        self._began = time.perf_counter()

    def _post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        spent = time.perf_counter() - self._began
        if self._wide:
            self.prefill_s, self.prefill_calls = self.prefill_s + spent, self.prefill_calls + 1
        else:
            self.decode_s, self.decode_calls = self.decode_s + spent, self.decode_calls + 1

    def reset(self) -> None:
        self.prefill_s = self.decode_s = 0.0
        self.prefill_calls = self.decode_calls = 0

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
