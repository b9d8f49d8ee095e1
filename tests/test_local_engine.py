"""LocalEngine on the real SmolLM2-135M-Instruct: stopping, sampling, batching, logprobs, failures.

`<|im_end|>` (id 2) is SmolLM2's end of turn; its tokenizer's eos (`<|im_start|>`) is wrong, which is
why every request here passes its stop ids explicitly.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from engine_helpers import IM_END, QUESTIONS, chat_prompt, greedy
from uniagent.errors import EngineError
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.local import LocalEngine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompts(smol_tokenizer) -> list[list[int]]:
    return [chat_prompt(smol_tokenizer, q) for q in QUESTIONS]


def assert_same(alone: Generation, batched: Generation) -> None:
    assert batched.token_ids == alone.token_ids
    assert batched.finish_reason == alone.finish_reason
    diff = max(abs(a - b) for a, b in zip(alone.logprobs, batched.logprobs, strict=True))
    assert diff < 1e-4, diff


async def test_stop_token_ends_generation_and_is_kept(smol_engine, prompts):
    gen = await smol_engine.generate(prompts[0], greedy(32), "stop")
    assert gen.finish_reason == "stop"
    assert gen.token_ids[-1] == IM_END
    assert IM_END not in gen.token_ids[:-1]
    assert len(gen.logprobs) == len(gen.token_ids) < 32


async def test_max_tokens_gives_length(smol_engine, prompts):
    gen = await smol_engine.generate(prompts[2], greedy(5, stop=[]), "length")
    assert gen.finish_reason == "length"
    assert len(gen.token_ids) == 5


async def test_seed_makes_sampling_reproducible(smol_engine, prompts):
    def params(seed: int) -> SamplingParams:
        return SamplingParams(
            temperature=1.0, top_p=0.9, top_k=50, max_tokens=16, seed=seed, stop_token_ids=[]
        )

    first = await smol_engine.generate(prompts[5], params(1234), "seed-a")
    again = await smol_engine.generate(prompts[5], params(1234), "seed-b")
    assert again.token_ids == first.token_ids
    assert again.logprobs == first.logprobs
    others = [await smol_engine.generate(prompts[5], params(s), f"seed-{s}") for s in (1, 2)]
    assert any(o.token_ids != first.token_ids for o in others)


async def test_top_k_1_and_tiny_top_p_leave_only_the_greedy_token(smol_engine, prompts):
    expected = await smol_engine.generate(prompts[4], greedy(8, stop=[]), "filters-greedy")
    for params in ({"top_k": 1}, {"top_p": 1e-6}):
        sampling = SamplingParams(temperature=1.5, max_tokens=8, seed=0, **params)
        gen = await smol_engine.generate(prompts[4], sampling, f"filters-{params}")
        assert gen.token_ids == expected.token_ids
        # Logprobs stay the raw model's, whatever the filters did to the sampling distribution.
        assert max(abs(a - b) for a, b in zip(gen.logprobs, expected.logprobs, strict=True)) < 1e-4


async def test_padding_does_not_change_greedy_results(smol_engine, prompts):
    """Mixed prompt lengths batched together, and requests joining a running batch, match solo runs."""
    chosen = prompts[:4]  # 31..48 tokens: both longer and shorter neighbours for each
    assert len({len(p) for p in chosen}) == 4
    alone = [await smol_engine.generate(p, greedy(), f"solo-{i}") for i, p in enumerate(chosen)]

    together = await asyncio.gather(
        *(smol_engine.generate(p, greedy(), f"pack-{i}") for i, p in enumerate(chosen))
    )
    for a, b in zip(alone, together, strict=True):
        assert_same(a, b)

    async def late(i: int, prompt: list[int]) -> Generation:
        await asyncio.sleep(0.15 * i)  # joins while earlier requests are mid-decode
        return await smol_engine.generate(prompt, greedy(), f"late-{i}")

    before = smol_engine.stats
    staggered = await asyncio.gather(*(late(i, p) for i, p in reversed(list(enumerate(chosen)))))
    after = smol_engine.stats
    for a, b in zip(alone, reversed(staggered), strict=True):
        assert_same(a, b)
    # Joined rows shared decode steps: fewer steps than tokens generated.
    assert after.decode_steps - before.decode_steps < sum(len(g.token_ids) for g in alone) - len(alone)


async def test_logprobs_match_a_teacher_forced_pass(smol_engine, prompts):
    sampling = SamplingParams(
        temperature=0.7, top_p=0.8, top_k=20, max_tokens=20, seed=7, stop_token_ids=[IM_END]
    )
    gen = await smol_engine.generate(prompts[6], sampling, "tf")
    prompt = prompts[6]
    with torch.inference_mode():
        logits = smol_engine.model(torch.tensor([prompt + gen.token_ids])).logits[0].float()
    reference = torch.log_softmax(logits, dim=-1)
    for i, (token, logprob) in enumerate(zip(gen.token_ids, gen.logprobs, strict=True)):
        assert abs(reference[len(prompt) - 1 + i, token].item() - logprob) < 1e-3


async def test_concurrent_requests_share_batches_and_finish_sooner(smol_engine, prompts):
    sampling = greedy(16, stop=[])  # equal lengths: the comparison is about batching only

    started = time.perf_counter()
    sequential = [await smol_engine.generate(p, sampling, f"seq-{i}") for i, p in enumerate(prompts)]
    sequential_s = time.perf_counter() - started

    before = smol_engine.stats
    started = time.perf_counter()
    concurrent = await asyncio.gather(
        *(smol_engine.generate(p, sampling, f"con-{i}") for i, p in enumerate(prompts))
    )
    concurrent_s = time.perf_counter() - started
    after = smol_engine.stats

    assert after.prefill_batches - before.prefill_batches < len(prompts)
    assert after.max_rows > 1
    assert concurrent_s < sequential_s, (concurrent_s, sequential_s)
    assert [g.token_ids for g in concurrent] == [g.token_ids for g in sequential]


async def test_worker_error_reaches_the_caller_and_the_engine_survives(smol_engine, prompts, monkeypatch):
    real_forward = smol_engine._forward
    calls = 0

    def flaky(**inputs):
        nonlocal calls
        calls += 1
        if calls == 3:  # a decode step, after a successful prefill
            raise RuntimeError("boom")
        return real_forward(**inputs)

    monkeypatch.setattr(smol_engine, "_forward", flaky)
    with pytest.raises(EngineError, match="boom") as info:
        await asyncio.wait_for(smol_engine.generate(prompts[0], greedy(8, stop=[]), "doomed"), 30)
    assert "doomed" in str(info.value)

    monkeypatch.setattr(smol_engine, "_forward", real_forward)
    gen = await smol_engine.generate(prompts[0], greedy(4, stop=[]), "after-error")
    assert len(gen.token_ids) == 4


async def test_cancelled_request_does_not_break_the_worker(smol_engine, prompts):
    before = smol_engine.stats
    task = asyncio.create_task(smol_engine.generate(prompts[2], greedy(64, stop=[]), "cancel-me"))
    while smol_engine.stats.decode_steps < before.decode_steps + 2:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gen = await asyncio.wait_for(smol_engine.generate(prompts[3], greedy(4, stop=[]), "after-cancel"), 30)
    assert len(gen.token_ids) == 4
    stats = smol_engine.stats
    assert stats.cancelled == before.cancelled + 1
    assert stats.decode_steps - before.decode_steps < 64  # the cancelled row was dropped, not run out


async def test_an_idle_engine_lets_its_openmp_threads_go(smol_engine, prompts, monkeypatch):
    """Between requests the worker hands back its OpenMP threads, so an update thread (a trainer's) does
    not run throttled beside them (uniagent.cpu.release_openmp_team)."""
    import uniagent.models.local as local

    calls: list[str] = []
    monkeypatch.setattr(local, "release_openmp_team", lambda: calls.append("released") or True)
    await smol_engine.generate(prompts[0], greedy(2, stop=[]), "then-idle")
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert calls  # the worker, now idle, let them go before it blocked


async def test_bad_requests_are_refused_up_front(smol_engine):
    with pytest.raises(EngineError, match="empty prompt"):
        await smol_engine.generate([], greedy(), "empty")
    with pytest.raises(EngineError, match="outside the vocabulary"):
        await smol_engine.generate([1, 10**7], greedy(), "oov")


async def test_shared_weights_and_close(smol_engine, prompts):
    engine = LocalEngine.from_model(smol_engine.model, eos_token_ids=[IM_END])
    assert engine.model is smol_engine.model
    async with engine:
        gen = await engine.generate(prompts[0], greedy(32, stop=[]), "shared")
        assert gen.finish_reason == "stop" and gen.token_ids[-1] == IM_END  # stop came from eos_token_ids
    with pytest.raises(EngineError, match="closed"):
        await engine.generate(prompts[0], greedy(), "too-late")


# ------------------------------------------------------------------------- prefix reuse between turns


def next_turn(prompt: list[int], gen: Generation, text: list[int]) -> list[int]:
    """What TokenChatModel sends next: the running sequence plus the new context tokens."""
    return prompt + gen.token_ids + text


async def test_a_second_turn_prefills_only_its_new_tokens_and_matches_a_fresh_run(smol_engine, prompts):
    first = await smol_engine.generate(prompts[1], greedy(6, stop=[]), "episode-a")
    second_prompt = next_turn(prompts[1], first, prompts[3][1:])
    before = smol_engine.stats
    second = await smol_engine.generate(second_prompt, greedy(6, stop=[]), "episode-a")
    after = smol_engine.stats
    assert after.prefix_hits - before.prefix_hits == 1
    # Everything but the last generated token (sampled, never run through the model) was kept.
    reused = len(prompts[1]) + len(first.token_ids) - 1
    assert after.prefix_reused_tokens - before.prefix_reused_tokens == reused
    assert after.prefill_tokens - before.prefill_tokens == len(second_prompt) - reused
    fresh = await smol_engine.generate(second_prompt, greedy(6, stop=[]), "someone-else")
    assert_same(fresh, second)


async def test_a_changed_prefix_is_reused_only_up_to_the_first_difference(smol_engine, prompts):
    first = await smol_engine.generate(prompts[2], greedy(4, stop=[]), "episode-b")
    edited = list(prompts[2])
    cut = len(edited) // 2
    edited[cut] = prompts[5][cut] if prompts[5][cut] != edited[cut] else edited[cut] + 1
    rewritten = next_turn(edited, first, prompts[0][1:])
    before = smol_engine.stats
    gen = await smol_engine.generate(rewritten, greedy(4, stop=[]), "episode-b")
    after = smol_engine.stats
    assert after.prefix_reused_tokens - before.prefix_reused_tokens == cut
    assert after.prefill_tokens - before.prefill_tokens == len(rewritten) - cut
    fresh = await smol_engine.generate(rewritten, greedy(4, stop=[]), "not-episode-b")
    assert_same(fresh, gen)
    # A history that differs from the first token on is not reused at all.
    before = smol_engine.stats
    await smol_engine.generate([IM_END, *prompts[6][1:]], greedy(2, stop=[]), "episode-b")
    assert smol_engine.stats.prefix_hits == before.prefix_hits


async def test_cancelled_or_failed_requests_leave_no_prefix(smol_engine, prompts, monkeypatch):
    first = await smol_engine.generate(prompts[4], greedy(4, stop=[]), "episode-c")
    second = next_turn(prompts[4], first, prompts[0][1:])
    before = smol_engine.stats
    task = asyncio.create_task(smol_engine.generate(second, greedy(64, stop=[]), "episode-c"))
    while smol_engine.stats.decode_steps < before.decode_steps + 2:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert smol_engine.stats.prefix_hits == before.prefix_hits + 1  # it had taken the prefix over
    # The cancelled turn's prefix is gone: the retry runs its whole prompt, and gets the right answer.
    before = smol_engine.stats
    retry = await smol_engine.generate(second, greedy(4, stop=[]), "episode-c")
    after = smol_engine.stats
    assert after.prefix_hits == before.prefix_hits
    assert after.prefill_tokens - before.prefill_tokens == len(second)
    assert_same(await smol_engine.generate(second, greedy(4, stop=[]), "fresh-c"), retry)

    real_forward = smol_engine._forward
    calls = 0

    def flaky(**inputs):
        nonlocal calls
        calls += 1
        if calls == 2:  # the first decode step of the reused turn
            raise RuntimeError("boom")
        return real_forward(**inputs)

    third = next_turn(second, retry, prompts[3][1:])
    monkeypatch.setattr(smol_engine, "_forward", flaky)
    with pytest.raises(EngineError, match="boom"):
        await smol_engine.generate(third, greedy(4, stop=[]), "episode-c")
    monkeypatch.setattr(smol_engine, "_forward", real_forward)
    before = smol_engine.stats
    await smol_engine.generate(third, greedy(2, stop=[]), "episode-c")
    assert smol_engine.stats.prefix_hits == before.prefix_hits


async def test_prefix_budget_zero_turns_reuse_off(smol_engine, prompts):
    engine = LocalEngine.from_model(smol_engine.model, prefix_cache_bytes=0)
    async with engine:
        first = await engine.generate(prompts[0], greedy(3, stop=[]), "episode-d")
        second = next_turn(prompts[0], first, prompts[3][1:])
        reused = await smol_engine.generate(second, greedy(3, stop=[]), "x")
        gen = await engine.generate(second, greedy(3, stop=[]), "episode-d")
        assert engine.stats.prefix_hits == 0
        assert engine.stats.prefill_tokens == len(prompts[0]) + len(second)
    assert_same(reused, gen)


SYSTEM = (
    "You are a careful assistant inside a sandbox. Answer with one short sentence, never more, and "
    "say plainly when you do not know. Tools: bash (runs a command) and finish (ends the episode)."
)


async def test_fresh_requests_prefilled_together_run_their_common_start_once(smol_engine, smol_tokenizer):
    """A GRPO group's (or every task's) shared prompt start runs once; the rows' numbers are those of
    solo runs; a fresh request that comes later reuses it from the store's shared entry."""
    from uniagent.models.kv_prefix import common_prefix

    chosen = [chat_prompt(smol_tokenizer, q, SYSTEM) for q in QUESTIONS[:4]]
    shared = min(common_prefix(chosen[0], p) for p in chosen[1:])
    assert shared >= 32
    reference = LocalEngine.from_model(smol_engine.model, eos_token_ids=[IM_END], prefix_cache_bytes=0)
    async with reference:
        alone = [await reference.generate(p, greedy(6, stop=[]), f"alone-{i}") for i, p in enumerate(chosen)]
    engine = LocalEngine.from_model(smol_engine.model, eos_token_ids=[IM_END])
    async with engine:
        together = await asyncio.gather(
            *(engine.generate(p, greedy(6, stop=[]), f"row-{i}") for i, p in enumerate(chosen[:3]))
        )
        stats = engine.stats
        assert stats.prefill_tokens == shared + sum(len(p) - shared for p in chosen[:3])
        assert stats.prefix_hits == 3 and stats.prefix_reused_tokens == 3 * shared
        late = await engine.generate(chosen[3], greedy(6, stop=[]), "late")
        assert engine.stats.prefix_reused_tokens - stats.prefix_reused_tokens == shared
        assert engine.stats.prefill_tokens - stats.prefill_tokens == len(chosen[3]) - shared
    for a, b in zip(alone, [*together, late], strict=True):
        assert_same(a, b)


async def test_a_fresh_request_run_alone_leaves_its_prompt_as_the_shared_start(smol_engine, smol_tokenizer):
    """A run's first episode is often admitted alone: its prompt becomes the store's shared entry, so the
    next fresh request runs only what follows the start they share, with the numbers of a solo run."""
    from uniagent.models.kv_prefix import common_prefix

    chosen = [chat_prompt(smol_tokenizer, q, SYSTEM) for q in QUESTIONS[:3]]
    shared = common_prefix(chosen[0], chosen[1])
    assert shared >= 32 and common_prefix(chosen[0], chosen[2]) == shared
    reference = LocalEngine.from_model(smol_engine.model, eos_token_ids=[IM_END], prefix_cache_bytes=0)
    async with reference:
        alone = [await reference.generate(p, greedy(6, stop=[]), f"alone-{i}") for i, p in enumerate(chosen)]
        assert reference.stats.prefix_hits == 0  # no store, nothing kept
    engine = LocalEngine.from_model(smol_engine.model, eos_token_ids=[IM_END])
    async with engine:
        first = await engine.generate(chosen[0], greedy(6, stop=[]), "first")
        assert engine.stats.prefix_hits == 0 and engine.stats.prefill_tokens == len(chosen[0])
        later = await asyncio.gather(*(engine.generate(p, greedy(6, stop=[]), f"later-{i}")
                                       for i, p in enumerate(chosen[1:])))  # fmt: skip
        assert engine.stats.prefix_hits == 2 and engine.stats.prefix_reused_tokens == 2 * shared
        assert engine.stats.prefill_tokens == sum(map(len, chosen)) - 2 * shared
    for a, b in zip(alone, [first, *later], strict=True):
        assert_same(a, b)


async def test_cache_growth_in_small_chunks_matches_solo_runs(smol_engine, prompts, monkeypatch):
    """Tiny spare/chunk sizes make every few decode steps regrow the buffers, joins included."""
    import uniagent.models.kv as kv
    import uniagent.models.local_batch as local_batch

    chosen = prompts[:3]
    alone = [
        await smol_engine.generate(p, greedy(8, stop=[]), f"solo-grow-{i}") for i, p in enumerate(chosen)
    ]
    monkeypatch.setattr(local_batch, "_SPARE", 1)
    monkeypatch.setattr(kv, "_CHUNK", 1)

    async def late(i: int, prompt: list[int]) -> Generation:
        await asyncio.sleep(0.1 * i)
        return await smol_engine.generate(prompt, greedy(8, stop=[]), f"grow-{i}")

    together = await asyncio.gather(*(late(i, p) for i, p in enumerate(chosen)))
    for a, b in zip(alone, together, strict=True):
        assert_same(a, b)


def entry(n: int):
    """A stored prefix of ids 0..n-1: 2 layers x 1 head x n tokens x 4 dims x (keys+values) x 4 bytes."""
    from uniagent.models.kv_prefix import Prefix

    return Prefix(list(range(n)), [torch.zeros(1, n, 4)] * 2, [torch.zeros(1, n, 4)] * 2)


def test_prefix_store_budget_evicts_the_least_recently_used():
    from uniagent.models.kv_prefix import PrefixStore

    store = PrefixStore(budget_bytes=entry(10).nbytes * 2)
    store.put("a", entry(10))
    store.put("b", entry(10))
    assert store.match("a", list(range(20))) == 10
    assert store.match("a", [0, 1, 9]) == 2
    assert store.match("a", list(range(5))) == 4  # the last prompt token always runs
    store.put("c", entry(10))  # over budget: "a" (oldest) goes
    assert store.match("a", list(range(20))) == 0 and len(store) == 2
    store.take("b", list(range(20)))
    store.put("d", entry(10))
    assert {"c", "d"} == {k for k in ("a", "b", "c", "d") if store.match(k, list(range(20)))}
    store.put("e", entry(30))  # larger than the whole budget: not kept, nothing evicted for it
    assert len(store) == 2 and store.nbytes == entry(10).nbytes * 2


def test_prefix_store_shared_entry_is_copied_not_taken_and_evicted_last():
    from uniagent.models.kv_prefix import MIN_SHARED, PrefixStore

    n = MIN_SHARED + 8
    store = PrefixStore(budget_bytes=entry(n).nbytes * 3)
    store.share(entry(n))
    prompt = list(range(2 * n))
    assert store.match("new", prompt) == n
    assert store.match("new", [*range(MIN_SHARED - 1), -1, *range(n)]) == 0  # too short a match to serve
    assert store.take("new", prompt) is store.shared and store.shared is not None  # stays for the next
    store.put("a", entry(n + 5))  # the request's own, longer entry wins over the shared one
    assert store.match("a", prompt) == n + 5 and store.take("a", prompt) is not store.shared
    store.put("b", entry(n))
    store.put("c", entry(n))
    store.put("e", entry(n))  # over budget: "b" (the oldest own entry) goes before the shared one
    assert store.match("b", [*range(n), -1, -2]) == n  # only the shared entry serves "b" now
    assert store.shared is not None and len(store) == 2
    store.put("d", entry(3 * n))  # needs everything: the own entries go first, then the shared one
    assert store.shared is None and store.match("new", prompt) == 0 and len(store) == 1
    store.share(entry(n))
    store.clear()
    assert store.shared is None and store.nbytes == 0


async def test_model_config_sets_the_prefix_budget(monkeypatch):
    """Wiring only (the engine's own behaviour is tested above): `model.prefix_cache_bytes` reaches it."""
    from uniagent.models.config import ModelConfig
    from uniagent.models.local import KIND

    seen = {}

    async def create(model=None, **options):
        seen.update(options)
        return type("Built", (), {"memory_line": "local engine memory budget ..."})()

    monkeypatch.setattr(LocalEngine, "create", create)
    await KIND.build("", ModelConfig(prefix_cache_bytes=12345))
    assert seen["prefix_cache_bytes"] == 12345
    await KIND.build("", ModelConfig(memory_budget_bytes=2**30))
    assert seen["memory_budget_bytes"] == 2**30
    assert ModelConfig().prefix_cache_bytes is None  # a quarter of the memory budget (test_engine_memory)


def test_dequantized_gguf_is_kept_and_loads_the_same_weights(smol_engine, smol_source):
    """The engine's load de-quantized the GGUF once and kept it; a second load reads the copy."""
    from uniagent.models.linear import pack_linears
    from uniagent.models.loading import dequantized_dir, load_causal_lm

    cached = dequantized_dir(smol_source, "float32")
    assert cached is not None and (cached / "model.safetensors").is_file()
    started = time.perf_counter()
    model = load_causal_lm(smol_source)
    assert time.perf_counter() - started < 10  # de-quantizing the GGUF takes ~25 s on 2 cores
    pack_linears(model)  # as the engine did: the same products on both sides
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 2]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, smol_engine.model(ids).logits)


def test_gguf_tokenizer_is_kept_and_encodes_the_same(smol_source, tmp_path, monkeypatch):
    """The tokenizer read from the GGUF (transformers' slow Python reader) is kept once; a later
    load reads the copy in well under the reader's time and tokenizes and templates identically."""
    from uniagent.models.loading import dequantized_dir, load_tokenizer

    monkeypatch.setenv("UNIAGENT_CACHE", str(tmp_path))
    load_tokenizer.cache_clear()
    try:
        from_gguf = load_tokenizer(smol_source)  # reads the GGUF (~23 s on 2 cores), keeps the copy
        cached = dequantized_dir(smol_source, "tokenizer")
        assert cached is not None and (cached / "tokenizer_config.json").is_file()
        load_tokenizer.cache_clear()
        started = time.perf_counter()
        kept = load_tokenizer(smol_source)
        assert time.perf_counter() - started < 8
    finally:
        load_tokenizer.cache_clear()
    text = "def f(x):\n    return x ** 2  # café, 東京, emoji 🙂\n<|im_start|>user\n\ttabs"
    assert kept.encode(text) == from_gguf.encode(text) and len(kept) == len(from_gguf)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    assert kept.apply_chat_template(messages, add_generation_prompt=True) == from_gguf.apply_chat_template(
        messages, add_generation_prompt=True
    )
    assert kept.special_tokens_map == from_gguf.special_tokens_map
    assert kept.eos_token_id == from_gguf.eos_token_id


def test_one_draw_follows_the_distribution_and_never_picks_a_cut_token():
    """`_sample` inverts the cumulative distribution with one uniform number: frequencies match the
    softmax, tokens cut by top-k (probability 0, also at the ends of the vocabulary) never come out, and
    a seeded generator repeats its draws."""
    from uniagent.models.local_batch import _sample

    logits = torch.tensor([-30.0, 0.0, 1.0, 2.0, -1.0, 5.0, -30.0])
    sampling = SamplingParams(temperature=1.0, top_k=4, max_tokens=1)
    gen = torch.Generator().manual_seed(0)
    draws = [_sample(logits, sampling, gen) for _ in range(20000)]
    counts = torch.bincount(torch.tensor(draws), minlength=logits.numel()).double() / len(draws)
    kept = torch.tensor([-float("inf"), 0.0, 1.0, 2.0, -float("inf"), 5.0, -float("inf")]).softmax(-1)
    assert counts[[0, 4, 6]].sum() == 0
    assert (counts - kept.double()).abs().max() < 0.01
    again = torch.Generator().manual_seed(0)
    assert [_sample(logits, sampling, again) for _ in range(50)] == draws[:50]
