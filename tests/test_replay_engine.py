"""RecordingEngine around the real LocalEngine, then ReplayEngine from the saved JSONL."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from uniagent.errors import EngineError
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.replay import RecordingEngine, ReplayEngine, ReplayRecord, load_records

IM_END = 2
SAMPLING = SamplingParams(temperature=0.8, max_tokens=8, seed=3, stop_token_ids=[IM_END])


def prompt(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
async def recording(smol_engine, smol_tokenizer):
    """Two episodes of two turns each; turn 2 continues from what turn 1 generated."""
    recorder = RecordingEngine(smol_engine)
    prompts = {
        "ep-a": prompt(smol_tokenizer, "Hello there"),
        "ep-b": prompt(smol_tokenizer, "Count to three"),
    }
    calls = []
    for request_id, first in prompts.items():
        gen = await recorder.generate(first, SAMPLING, request_id)
        calls.append((request_id, first, gen))
        second = first + gen.token_ids + prompt(smol_tokenizer, "And then?")
        calls.append((request_id, second, await recorder.generate(second, SAMPLING, request_id)))
    return recorder, calls


async def test_replay_reproduces_recorded_generations(recording, tmp_path):
    recorder, calls = recording
    path = tmp_path / "rec.jsonl"
    recorder.save(path)
    assert len(load_records(path)) == 4
    replay = ReplayEngine(path)
    # Episodes interleaved differently from the recording: order only matters within a request.
    for request_id, prompt_ids, gen in sorted(calls, key=lambda c: c[0], reverse=True):
        again = await replay.generate(prompt_ids, SAMPLING, request_id)
        assert (again.token_ids, again.logprobs, again.finish_reason) == (
            gen.token_ids,
            gen.logprobs,
            gen.finish_reason,
        )
    assert replay.remaining() == 0


async def test_prompt_matching_ignores_request_ids(recording, tmp_path):
    recorder, calls = recording
    recorder.save(tmp_path / "rec.jsonl", include_prompts=False)  # hashes only
    replay = ReplayEngine(tmp_path / "rec.jsonl", match="prompt")
    for n, (_, prompt_ids, gen) in enumerate(reversed(calls)):
        assert (await replay.generate(prompt_ids, SAMPLING, f"other-{n}")).token_ids == gen.token_ids


async def test_strict_replay_names_the_request_and_turn(recording):
    recorder, calls = recording
    replay = ReplayEngine(recorder.records)
    request_id, first, _ = calls[0]
    await replay.generate(first, SAMPLING, request_id)
    _, second, _ = calls[1]
    changed = [*second[:-1], second[-1] + 1]
    with pytest.raises(
        EngineError, match=rf"'{request_id}' turn 1: prompt differs.*first difference at token"
    ):
        await replay.generate(changed, SAMPLING, request_id)
    with pytest.raises(EngineError, match=rf"no recorded generation left for request '{request_id}' turn 2"):
        await replay.generate(second, SAMPLING, request_id)
    with pytest.raises(EngineError, match="never recorded"):
        await ReplayEngine(recorder.records, match="prompt").generate([5, 6, 7], SAMPLING, "x")


async def test_lenient_replay_returns_the_recording_anyway(recording):
    recorder, calls = recording
    replay = ReplayEngine(recorder.records, strict=False)
    request_id, first, gen = calls[0]
    assert (await replay.generate([*first, 99], SAMPLING, request_id)).token_ids == gen.token_ids


async def test_delay_simulates_latency_concurrently(recording):
    recorder, calls = recording
    replay = ReplayEngine(recorder.records, match="prompt", delay_s=0.2)
    started = time.perf_counter()
    await asyncio.gather(*(replay.generate(p, SAMPLING, r) for r, p, _ in calls))
    assert 0.2 <= time.perf_counter() - started < 0.6


def test_malformed_recording_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = ReplayRecord(request_id="r", prompt_ids=[1], generation=Generation([2], [-0.1], "stop"))
    path.write_text(json.dumps(good.to_json()) + "\n{not json}\n")
    with pytest.raises(EngineError, match=r"bad.jsonl:2"):
        ReplayEngine(path)


def test_any_prompt_records_replay_by_request_and_turn_without_hashing(monkeypatch) -> None:
    """Scripted turns (bench/runner.py) whose prompts cannot be known: no hash, no comparison, no
    warning, and not in the prompt pool."""
    import asyncio

    from uniagent.models import replay as replay_module
    from uniagent.models.base import Generation, SamplingParams
    from uniagent.models.replay import ANY_PROMPT, ReplayEngine, ReplayRecord

    records = [ReplayRecord("r", Generation([5 + t], [-0.1], "stop"), t, None, ANY_PROMPT) for t in range(3)]
    engine = ReplayEngine(records, strict=True)

    def no_hash(*_a, **_k):
        raise AssertionError("hashed a prompt of an ANY_PROMPT record")

    monkeypatch.setattr(replay_module._PromptHasher, "digest", no_hash)

    async def go() -> list[int]:
        out = []
        for turn in range(3):
            gen = await engine.generate([1, 2, 3 + turn], SamplingParams(), "r")
            out.extend(gen.token_ids)
        return out

    assert asyncio.run(go()) == [5, 6, 7]
    assert engine.remaining() == 0 and not engine._by_prompt
