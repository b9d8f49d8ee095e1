"""LocalEngine's memory budget (issue 25 part 6): admission keeps the engine's keys/values and kept
prefixes within `memory_budget_bytes` (what does not fit waits, and finishes), long prefills run in
column chunks, and the default budget comes from the machine."""

from __future__ import annotations

import asyncio

import pytest

from engine_helpers import IM_END, QUESTIONS, chat_prompt, greedy
from uniagent.models.config import ModelConfig
from uniagent.models.local import LocalEngine, memory_check
from uniagent.models.local_memory import Incoming, MemoryPlan, Running, machine_available, resolve_budget

# The first six of the shared questions; turns of 16 tokens unless a test says otherwise.
MEMORY_QUESTIONS = QUESTIONS[:6]


@pytest.fixture(scope="module")
def prompts(smol_tokenizer) -> list[list[int]]:
    return [chat_prompt(smol_tokenizer, q) for q in MEMORY_QUESTIONS]


def watch_bytes(engine: LocalEngine) -> list[int]:
    """Record, at every forward pass, the bytes of the cache it runs on plus the kept prefixes."""
    seen: list[int] = []
    forward = engine._forward

    def spy(**inputs):
        seen.append(inputs["past_key_values"].nbytes + engine._prefixes.nbytes)
        return forward(**inputs)

    engine._forward = spy
    return seen


@pytest.mark.slow
async def test_a_small_budget_queues_requests_all_complete_and_match_an_unconstrained_run(
    smol_engine, prompts
):
    free = LocalEngine.from_model(smol_engine.model, eos_token_ids=[IM_END], memory_budget_bytes=1 << 40)
    small = 48 * 2**20  # room for about two of these rows at their widest (each ~15 MiB: see the plan)
    tight = LocalEngine.from_model(smol_engine.model, eos_token_ids=[IM_END], memory_budget_bytes=small)
    try:
        plan = tight._batches.plan
        one = plan.admission_peak(None, [Incoming(max(map(len, prompts)), 0, 16)], tight.max_prefill_tokens)
        assert 2 * one < small < len(prompts) * one  # the budget is what limits the batch
        expected = await asyncio.gather(
            *(free.generate(p, greedy(16), f"free-{i}") for i, p in enumerate(prompts))
        )
        assert free.stats.max_rows == len(prompts)
        seen = watch_bytes(tight)
        got = await asyncio.gather(
            *(tight.generate(p, greedy(16), f"tight-{i}") for i, p in enumerate(prompts))
        )
        stats = tight.stats
        assert stats.completed == len(prompts) and stats.failed == 0
        assert 1 < stats.max_rows < len(prompts)  # requests waited in the queue for rows to finish
        assert max(seen) <= small
        for a, b in zip(expected, got, strict=True):
            assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    finally:
        free.close()
        tight.close()


@pytest.mark.slow
async def test_a_prefill_in_column_chunks_matches_one_forward(smol_engine, prompts):
    chunked = LocalEngine.from_model(smol_engine.model, eos_token_ids=[IM_END], max_prefill_tokens=8)
    try:
        calls: list[int] = []
        forward = chunked._forward
        chunked._forward = lambda **inputs: calls.append(inputs["input_ids"].shape[1]) or forward(**inputs)
        expected = [await smol_engine.generate(p, greedy(8), f"one-{i}") for i, p in enumerate(prompts[:2])]
        got = await asyncio.gather(
            *(chunked.generate(p, greedy(8), f"cut-{i}") for i, p in enumerate(prompts[:2]))
        )
        assert max(calls) <= 16  # 2 rows x 8 columns at most (16 columns: the floor of a chunk)
        for a, b in zip(expected, got, strict=True):
            assert b.token_ids == a.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    finally:
        chunked.close()


def test_the_plan_charges_padding_to_the_widest_row_and_the_admission_copy():
    plan = MemoryPlan(bytes_per_token=100, layers=10, activation_per_token=0, spare=256, chunk=256)
    short = Incoming(prompt=100, reused=0, max_tokens=10)
    long = Incoming(prompt=4000, reused=0, max_tokens=10)
    alone = plan.admission_peak(None, [short], 16384)
    # Next to a long row, a short one costs the long row's width.
    assert plan.admission_peak(None, [short, long], 16384) >= plan.kv(2, 4000 + 10)
    assert plan.admission_peak(None, [short, short], 16384) < plan.kv(2, 4000)
    # Joining a running batch holds the old cache and the prefill's at once.
    running = Running(rows=4, capacity=1000, width=900, remaining=10)
    assert plan.admission_peak(running, [short], 16384) >= plan.kv(4, 1000) + plan.kv(1, 100 + 11)
    assert alone > 0


def test_default_budget_is_half_of_what_the_machine_has_and_doctor_reports_it():
    available, source = machine_available()
    budget, said = resolve_budget(None)
    assert budget == int(available * 0.5) and source in said
    assert resolve_budget(12345) == (12345, "set")
    assert ModelConfig().memory_budget_bytes is None and ModelConfig().prefix_cache_bytes is None
    _, ok, detail = memory_check(ModelConfig(memory_budget_bytes=3 * 1024**3, prefix_cache_bytes=2**30))
    assert ok and "3.00 GiB (set)" in detail and "1.00 GiB" in detail


def test_keys_values_live_in_mappings_of_their_own_that_go_back_when_freed():
    import gc

    import torch

    from uniagent.models.kv import MAPPED_MIN_BYTES, mapped_zeros
    from uniagent.models.local_memory import tune_malloc

    assert tune_malloc()  # glibc here: activations stay in the heap, reused
    cpu = torch.device("cpu")
    small = mapped_zeros((4, 8), torch.bfloat16, cpu)
    assert small.shape == (4, 8) and not small.any()
    rows = 64 << 20  # 64 MiB of bf16, written through so every page is resident
    big = mapped_zeros((2, rows // 4), torch.bfloat16, cpu)
    assert big.numel() * 2 >= MAPPED_MIN_BYTES and big.dtype == torch.bfloat16 and not big.any()
    big.fill_(1.0)
    start = big.data_ptr()
    assert mapping_at(start) >= 64 << 20  # a mapping of its own, not a heap block
    view = big[1, :16]  # a view keeps the mapping alive
    del big
    gc.collect()
    assert float(view.sum()) == 16.0 and mapping_at(start) >= 64 << 20
    del view
    gc.collect()
    assert mapping_at(start) < 64 << 20  # unmapped with the tensor, whatever glibc keeps


def mapping_at(address: int) -> int:
    """The size of the mapping of this process that holds `address` (0: none), from /proc/self/maps:
    exact where RSS would also move with whatever else the process frees meanwhile."""
    from pathlib import Path

    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= address < hi:
            return hi - lo
    return 0
