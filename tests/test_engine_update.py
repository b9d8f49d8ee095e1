"""`LocalEngine.update_weights` on the real SmolLM2-135M: version tags, partial rollout, waiting updates.

"New weights" are the real weights with noise added to one layer, so the two versions' logprobs differ
measurably; each token's logprob is checked against a teacher-forced recompute (the trainer's,
`mismatch.recompute_log_probs`) under the weights of the version it is tagged with. An update is
triggered from `on_token` after k tokens: the worker keeps decoding while the callback reaches the event
loop, so the interruption lands at some token k' >= k, which the tests read from the version tags.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable

import pytest
import torch

from test_local_engine import chat_prompt
from uniagent.errors import EngineError
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.loading import load_causal_lm
from uniagent.models.local import LocalEngine
from uniagent.train.mismatch import recompute_log_probs

pytestmark = pytest.mark.slow

NOISY = "model.layers.20.mlp.down_proj.weight"
ATOL = 1e-3  # engine (batched, KV cache) vs teacher-forced pass, as in test_train_local


@pytest.fixture(scope="module")
def models(smol_source) -> dict[int, torch.nn.Module]:
    """Reference copies of the two versions' weights, for teacher-forced recomputes."""
    old = load_causal_lm(smol_source)
    new = copy.deepcopy(old)
    with torch.no_grad():
        weight = new.get_parameter(NOISY)
        noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(0))
        weight.add_(noise * weight.std())
    return {0: old, 1: new}


@pytest.fixture(scope="module")
def states(models) -> dict[int, dict[str, torch.Tensor]]:
    return {v: {k: t.clone() for k, t in m.state_dict().items()} for v, m in models.items()}


@pytest.fixture(scope="module")
def served(smol_source, states):
    engine = LocalEngine(smol_source, batch_wait_s=0.05)
    yield engine
    engine.close()


@pytest.fixture
def engine(served, states):
    """The module's engine, given back with the old weights as version 0 after each test."""
    yield served
    served.update_weights(states[0], 0).result(timeout=120)


@pytest.fixture(scope="module")
def prompts(smol_tokenizer) -> list[list[int]]:
    texts = ["Write a haiku about the sea.", "What is Python?", "Name three colours.", "Tell me a joke."]
    return [chat_prompt(smol_tokenizer, t) for t in texts]


def sampled(max_tokens: int, seed: int | None = 3) -> SamplingParams:
    """No stop ids: every generation runs exactly `max_tokens` (room for an update mid-way)."""
    return SamplingParams(temperature=0.0 if seed is None else 1.0, seed=seed, max_tokens=max_tokens)


def after(k: int, action: Callable[[], object]) -> tuple[Callable[[int, float], None], list]:
    """An `on_token` that calls `action` once, at the k-th token; the list collects (tokens, results)."""
    seen: list = [[], []]

    def on_token(token: int, logprob: float) -> None:
        seen[0].append(token)
        if len(seen[0]) == k:
            seen[1].append(action())

    return on_token, seen


def split(gen: Generation) -> int:
    """How many leading tokens the old version sampled; asserts the tags are [0]*j + [1]*rest, both > 0."""
    assert gen.versions is not None
    j = gen.versions.count(0)
    assert gen.versions == [0] * j + [1] * (len(gen.versions) - j)
    assert 0 < j < len(gen.versions), gen.versions
    return j


def assert_logprobs_of_their_version(models, prompt: list[int], gen: Generation) -> None:
    """Each token's logprob is its own version's teacher-forced one (and the versions measurably differ)."""
    assert gen.versions is not None
    old, new = (recompute_log_probs(models[v], [(prompt, gen.token_ids)])[0] for v in (0, 1))
    for i, (v, logprob) in enumerate(zip(gen.versions, gen.logprobs, strict=True)):
        assert logprob == pytest.approx((old, new)[v][i], abs=ATOL), (i, v)
    assert max(abs(a - b) for a, b in zip(old, new, strict=True)) > 20 * ATOL


async def test_an_interrupted_generation_holds_both_versions_each_with_its_own_logprobs(
    engine, models, states, prompts
):
    before = engine.stats
    on_token, seen = after(4, lambda: engine.update_weights(states[1], 1))
    gen = await engine.generate(prompts[0], sampled(16), "mixed", on_token=on_token)
    report = await asyncio.wrap_future(seen[1][0])
    assert report["interrupted"] == 1 and report["version"] == 1 and engine.version == 1
    assert report["waited_s"] >= 0 and report["apply_s"] > 0
    assert len(gen.token_ids) == 16 and gen.finish_reason == "length"
    assert split(gen) >= 4
    assert seen[0] == gen.token_ids  # streamed once each, in order, across the interruption
    assert_logprobs_of_their_version(models, prompts[0], gen)
    stats = engine.stats
    assert (stats.weight_updates, stats.interrupted) == (before.weight_updates + 1, before.interrupted + 1)
    assert stats.completed == before.completed + 1 and stats.requests == before.requests + 1


async def test_resuming_under_the_same_weights_gives_the_uninterrupted_tokens(engine, states, prompts):
    """The re-prefilled prefix is exactly right: same tokens (greedy, and seeded sampling: the stream is
    kept); an update that interrupts nothing leaves a generation bit-identical."""
    solo = await engine.generate(prompts[2], sampled(8, seed=5), "solo")
    asks = [(prompts[0], sampled(14, seed=None)), (prompts[1], sampled(14, seed=11))]
    plain = await asyncio.gather(*(engine.generate(p, s, f"plain{i}") for i, (p, s) in enumerate(asks)))
    on_token, seen = after(3, lambda: engine.update_weights(states[0], 1))
    resumed = await asyncio.gather(
        engine.generate(*asks[0], "resumed0", on_token=on_token), engine.generate(*asks[1], "resumed1")
    )
    assert (await asyncio.wrap_future(seen[1][0]))["interrupted"] == 2
    for a, b in zip(plain, resumed, strict=True):
        assert a.versions == [0] * 14
        split(b)
        assert b.token_ids == a.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    again = await engine.generate(prompts[2], sampled(8, seed=5), "solo again")
    assert (again.token_ids, again.logprobs, again.versions) == (solo.token_ids, solo.logprobs, [1] * 8)


async def test_without_interrupt_the_update_waits_for_the_running_batch(engine, models, states, prompts):
    queued: list[asyncio.Task[Generation]] = []

    def update_then_queue() -> object:
        future = engine.update_weights(states[1], 1, interrupt=False)
        queued.append(asyncio.ensure_future(engine.generate(prompts[1], sampled(6), "later")))
        return future

    on_token, seen = after(3, update_then_queue)
    first = await engine.generate(prompts[0], sampled(12), "first", on_token=on_token)
    report = await asyncio.wrap_future(seen[1][0])
    later = await queued[0]
    assert first.versions == [0] * 12  # finished under the old weights
    assert later.versions == [1] * 6  # admitted only after the update
    assert report["interrupted"] == 0 and report["waited_s"] > 0
    assert_logprobs_of_their_version(models, prompts[1], later)


async def test_a_bad_state_fails_the_update_and_the_engine_keeps_serving(engine, states, prompts):
    param = engine.model.get_parameter(NOISY)
    kept, before = param.detach().clone(), engine.stats
    wrong_shape = {**states[1], "model.norm.weight": torch.ones(3)}
    missing = {k: v for k, v in states[1].items() if not k.startswith("model.layers.3.")}
    unknown = {**states[1], "model.extra.weight": torch.ones(3)}
    on_token, seen = after(2, lambda: [engine.update_weights(s, 7) for s in (wrong_shape, missing, unknown)])
    gen = await engine.generate(prompts[0], sampled(8), "bad", on_token=on_token)
    for future, word in zip(seen[1][0], ("wrong shape", "missing", "unknown"), strict=True):
        with pytest.raises(EngineError, match=word):
            await asyncio.wrap_future(future)
    assert gen.versions == [0] * 8 and engine.version == 0 and engine.stats.interrupted == before.interrupted
    assert torch.equal(param, kept)  # nothing was copied, not even the entries that fitted
    assert (await engine.generate(prompts[1], sampled(3), "after")).versions == [0] * 3


async def test_concurrent_requests_are_interrupted_together(engine, models, states, prompts):
    on_token, seen = after(3, lambda: engine.update_weights(states[1], 1))
    gens = await asyncio.gather(
        engine.generate(prompts[0], sampled(12, seed=1), "c0", on_token=on_token),
        *(engine.generate(p, sampled(12, seed=i), f"c{i}") for i, p in enumerate(prompts[1:3], 2)),
    )
    assert (await asyncio.wrap_future(seen[1][0]))["interrupted"] == 3
    for prompt, gen in zip(prompts, gens, strict=False):
        split(gen)
        assert_logprobs_of_their_version(models, prompt, gen)


async def test_an_update_while_idle_is_applied_from_any_thread(engine, models, states, prompts):
    report = await asyncio.to_thread(lambda: engine.update_weights(states[1], 1).result(timeout=60))
    assert report["interrupted"] == 0 and engine.version == 1
    gen = await engine.generate(prompts[2], sampled(5), "idle")
    assert gen.versions == [1] * 5
    new = recompute_log_probs(models[1], [(prompts[2], gen.token_ids)])[0]
    assert gen.logprobs == pytest.approx(new, abs=ATOL)


async def test_an_update_drops_every_kept_prefix(engine, models, states, prompts):
    """Keys/values of the old weights are never reused: the next turn prefills its whole prompt."""
    first = await engine.generate(prompts[3], sampled(4), "episode")
    before = engine.stats
    await asyncio.wrap_future(engine.update_weights(states[1], 1))
    turn = prompts[3] + first.token_ids + [198, 28, 940]
    second = await engine.generate(turn, sampled(4), "episode")
    stats = engine.stats
    assert stats.prefix_hits == before.prefix_hits
    assert stats.prefill_tokens - before.prefill_tokens == len(turn)
    assert second.logprobs == pytest.approx(
        recompute_log_probs(models[1], [(turn, second.token_ids)])[0], abs=ATOL
    )


async def test_keeping_kv_applies_mid_batch_and_prefills_nothing_again(engine, models, states, prompts):
    """keep_kv (PipelineRL's in-flight update): the running row is not interrupted and its prompt is run
    once; the tokens before the update are exactly version 0's, those after are tagged 1; a prefix kept
    before the update still serves the episode's next turn."""
    first = await engine.generate(prompts[3], sampled(4), "kept")
    before = engine.stats
    on_token, seen = after(4, lambda: engine.update_weights(states[1], 1, keep_kv=True))
    gen = await engine.generate(prompts[0], sampled(16), "running", on_token=on_token)
    report = await asyncio.wrap_future(seen[1][0])
    assert report["interrupted"] == 0 and engine.version == 1
    j = split(gen)
    stats = engine.stats
    assert stats.prefill_tokens - before.prefill_tokens == len(prompts[0])
    assert stats.interrupted == before.interrupted and len(gen.token_ids) == 16
    old = recompute_log_probs(models[0], [(prompts[0], gen.token_ids)])[0]
    assert gen.logprobs[:j] == pytest.approx(old[:j], abs=ATOL)
    turn = prompts[3] + first.token_ids + [198, 28, 940]
    await engine.generate(turn, sampled(4), "kept")
    assert engine.stats.prefix_hits == stats.prefix_hits + 1
    assert engine.stats.prefill_tokens - stats.prefill_tokens <= len(turn) - len(prompts[3])


async def test_an_interrupted_request_can_be_cancelled(engine, states, prompts):
    before = engine.stats
    on_token, seen = after(3, lambda: engine.update_weights(states[1], 1))
    task = asyncio.ensure_future(engine.generate(prompts[0], sampled(400), "gone", on_token=on_token))
    while not seen[1]:
        await asyncio.sleep(0.01)
    assert (await asyncio.wrap_future(seen[1][0]))["interrupted"] == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gen = await engine.generate(prompts[0], sampled(3), "gone")  # served; nothing of it was kept
    assert gen.versions == [1] * 3
    stats = engine.stats
    assert stats.cancelled == before.cancelled + 1 and stats.prefix_hits == before.prefix_hits


async def test_a_continuation_stops_at_the_model_context(engine, states, prompts):
    limit, engine.max_model_len = engine.max_model_len, len(prompts[1]) + 10
    try:
        on_token, seen = after(3, lambda: engine.update_weights(states[1], 1))
        gen = await engine.generate(prompts[1], sampled(50), "ctx", on_token=on_token)
    finally:
        engine.max_model_len = limit
    await asyncio.wrap_future(seen[1][0])
    split(gen)
    assert len(gen.token_ids) == 10 and gen.finish_reason == "length"


async def test_closing_fails_a_pending_update(models, prompts):
    engine = LocalEngine.from_model(models[0], version=5)
    on_token, seen = after(2, lambda: engine.update_weights(None, 6, interrupt=False))
    task = asyncio.ensure_future(engine.generate(prompts[0], sampled(400), "closing", on_token=on_token))
    while not seen[1]:
        await asyncio.sleep(0.01)
    await engine.aclose()
    with pytest.raises(EngineError, match="version 6 not applied"):
        await asyncio.wrap_future(seen[1][0])
    with pytest.raises(EngineError, match="closed"):
        await task
    with pytest.raises(EngineError, match="closed"):
        engine.update_weights(None, 7).result(timeout=1)
    assert engine.version == 5


async def test_a_copy_that_fails_half_way_stops_the_engine(models, states):
    """Half-copied weights are neither version: the update fails and so does the engine, loudly."""
    engine = LocalEngine.from_model(models[0])
    broken = {**states[0], NOISY: torch.empty(states[0][NOISY].shape, device="meta")}  # copies fail
    with pytest.raises(EngineError, match="version 1 failed"):
        await asyncio.wrap_future(engine.update_weights(broken, 1))
    with pytest.raises(EngineError, match=r"closed|crashed"):  # refused, or failed by the stopping worker
        await engine.generate([1, 2, 3], SamplingParams(max_tokens=1), "after")
    await engine.aclose()
    assert engine.version == 0
