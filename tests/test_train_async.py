"""The async local trainer's invariants, tested without waiting for learning.

A tiny randomly initialised Llama with SmolLM2's real tokenizer stands in for the policy: every
other part is real (LocalEngine with weight sync and partial rollout, bubblewrap sandboxes, the
toy task's verifier, verl's losses, checkpoints). The tiny model writes garbage, so rewards are 0;
what is checked is the machinery: the staleness bound, per-token versions, partial rollout, the
metrics rows, and resume. Learning itself is tests/test_train_learning.py's job.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from engine_helpers import tiny_llama
from uniagent.train.config import build_train_config


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, smol_tokenizer) -> Path:
    """A 2-layer Llama (hidden 64) with SmolLM2's tokenizer and chat template, saved as a model dir."""
    out = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(len(smol_tokenizer), 4096, tie_word_embeddings=True).save_pretrained(out)
    smol_tokenizer.save_pretrained(out)
    return out


def _config(tiny_model: Path, out: Path, *extra: str):
    return build_train_config(
        None,
        [
            f"model.spec={tiny_model}",
            f"trainer.output={out}",
            "trainer.mode=async",
            "tasks.limit=4",
            "trainer.group_size=2",
            "trainer.tasks_per_step=2",
            "trainer.concurrency=8",
            "trainer.steps=4",
            "trainer.save_every=0",
            "trainer.tensorboard=false",
            "model.max_tokens=160",
            "model.temperature=1.0",
            "optim.lr=1e-3",
            *extra,
        ],
    )


PACE_S = 0.01
"""A decode step of the tiny model takes about a millisecond: tests that need generations in flight at
an update pace the engine (`step_delay_s`) so that a turn outlasts an update whatever the machine."""


def _train(cfg, resume: bool = False, pace_s: float = 0.0):
    """Run the trainer; return its rows, the samples each update saw, and the trainer."""
    from uniagent.train.local import LocalTrainer

    trainer = LocalTrainer(cfg, resume=resume)
    trainer.engine.step_delay_s = pace_s
    seen: list[list] = []
    update = trainer.update

    def spy(samples):
        seen.append(list(samples))
        return update(samples)

    trainer.update = spy  # type: ignore[method-assign]
    try:
        rows = asyncio.run(trainer.train())
    finally:
        trainer.close()
    return rows, seen, trainer


def _model_versions(sample) -> list[int]:
    return [
        v
        for seg in sample.result.segments
        for v, m in zip(seg.response_versions, seg.response_mask, strict=True)
        if m
    ]


def test_async_bounds_staleness_tags_every_token_and_interrupts_in_flight_turns(tiny_model, tmp_path) -> None:
    """max_staleness=1: no trained episode has a token more than 1 version behind the update that
    trains it; every model token carries a version, context tokens -1; the weight updates interrupted
    generations in flight (partial rollout) and those episodes hold tokens of two versions."""
    rows, seen, trainer = _train(
        _config(tiny_model, tmp_path / "run", "trainer.max_staleness=1"), pace_s=PACE_S
    )
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    assert trainer.engine.version == 4
    assert all(r["mode"] == "async" for r in rows)
    mixed = 0
    for step, samples in enumerate(seen):
        assert len({s.group for s in samples}) == 2  # tasks_per_step groups
        for s in samples:
            versions = _model_versions(s)
            assert versions, "every model token carries its policy version"
            assert step - min(versions) <= 1, (step, versions)
            assert max(versions) <= step  # never a version the trainer had not published
            for seg in s.result.segments:
                assert len(seg.response_versions) == len(seg.response_ids)
                assert all(
                    v == -1 for v, m in zip(seg.response_versions, seg.response_mask, strict=True) if not m
                )
            mixed += len(set(versions)) > 1
    for r in rows:
        assert r["staleness_max"] <= 1
        assert sum(r["staleness_hist"].values()) == r["episodes"] - r["untrainable"]
        assert 0.0 <= r["trainer_idle_frac"] <= 1.0 and 0.0 <= r["engine_idle_frac"] <= 1.0
    assert sum(r["interrupted"] for r in rows) > 0, "no generation was in flight at any weight update"
    assert mixed > 0, "no trained episode spans a weight update"


def test_async_max_staleness_zero_is_on_policy(tiny_model, tmp_path) -> None:
    """max_staleness=0: the next step's groups start only after the update, so every trained token
    was sampled by the version being updated (the async loop degenerates to sync, as in verl)."""
    rows, seen, _ = _train(
        _config(tiny_model, tmp_path / "run", "trainer.max_staleness=0", "trainer.steps=3")
    )
    for step, samples in enumerate(seen):
        for s in samples:
            assert set(_model_versions(s)) == {step}
    assert all(r["staleness_hist"].keys() <= {"0"} for r in rows)
    assert sum(r["interrupted"] for r in rows) == 0


def test_async_resume_keeps_version_counters_and_groups(tiny_model, tmp_path) -> None:
    """Stop after 2 steps (checkpoint each step), resume to 4: the rows continue 1..4, the version
    continues, the producer's counters and the cumulative staleness histogram come back, and groups
    in flight or finished at the checkpoint are trained after the resume (same serials), none twice."""
    out = tmp_path / "run"
    rows1, seen1, _ = _train(_config(tiny_model, out, "trainer.steps=2", "trainer.save_every=1"))
    state = torch.load(sorted((out / "checkpoints").glob("step_*.pt"))[-1], weights_only=False)
    saved = state["async"]
    assert state["step"] == 2 and saved["groups_started"] >= 4
    pending = {g["serial"] for g in saved["finished"]} | {g["serial"] for g in saved["in_flight"]}
    rows2, seen2, t2 = _train(
        _config(tiny_model, out, "trainer.steps=4", "trainer.save_every=1"), resume=True
    )
    assert [r["step"] for r in rows2] == [3, 4] and t2.engine.version == 4
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4
    trained1 = {s.group for step in seen1 for s in step}
    trained2 = {s.group for step in seen2 for s in step}
    assert not trained1 & trained2, "a group was trained twice across the resume"
    serials2 = {int(g.split("#g")[1]) for g in trained2}
    assert serials2 & pending or not pending, "the checkpoint's pending groups were not taken up"
    assert min(serials2) < saved["groups_started"] or not pending
    assert t2.async_state["staleness_hist_total"] and sum(
        t2.async_state["staleness_hist_total"].values()
    ) == sum(sum(r["staleness_hist"].values()) for r in rows1 + rows2)


def test_async_without_partial_rollout_never_interrupts(tiny_model, tmp_path) -> None:
    """partial_rollout=false: an update waits for running generations; no token is interrupted and
    no generation holds two versions."""
    rows, seen, _ = _train(
        _config(tiny_model, tmp_path / "run", "trainer.partial_rollout=false", "trainer.steps=3")
    )
    assert sum(r["interrupted"] for r in rows) == 0
    for samples in seen:
        for s in samples:
            for seg in s.result.segments:
                turns = [
                    {
                        v
                        for v, m in zip(
                            seg.response_versions[a.start : a.end],
                            seg.response_mask[a.start : a.end],
                            strict=True,
                        )
                        if m
                    }
                    for a in seg.spans
                    if a.kind == "model"
                ]
                assert all(len(t) <= 1 for t in turns)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_dynamic_sampling_without_signal_stops_naming_the_knob(tiny_model, tmp_path, mode) -> None:
    """filter_groups on: the garbage-writing tiny model scores 0 everywhere, so every group has zero
    variance; both loops over-sample up to max_num_gen_batches batches, then stop with TrainingError
    instead of training on nothing or spinning forever."""
    from uniagent.errors import TrainingError

    cfg = _config(
        tiny_model,
        tmp_path / "run",
        f"trainer.mode={mode}",
        "algo.filter_groups.enable=true",
        "algo.filter_groups.max_num_gen_batches=2",
        "model.max_tokens=8",
        "trainer.steps=1",
    )
    with pytest.raises(TrainingError, match="max_num_gen_batches"):
        _train(cfg)


def test_async_keeping_kv_updates_mid_turn_without_prefilling_again(tiny_model, tmp_path) -> None:
    """kv_on_update=keep (PipelineRL's in-flight update): nothing is interrupted, so no prompt token
    is prefilled twice; episodes still span updates, each token tagged with the weights that sampled
    it, within the staleness bound; the step rows say what the engine ran."""
    rows, seen, _ = _train(
        _config(tiny_model, tmp_path / "run", "trainer.kv_on_update=keep", "trainer.steps=3"), pace_s=PACE_S
    )
    assert sum(r["interrupted"] for r in rows) == 0
    assert all(r["engine"]["interrupted"] == 0 and r["engine"]["decode_steps"] > 0 for r in rows)
    mixed = 0
    for step, samples in enumerate(seen):
        for s in samples:
            versions = _model_versions(s)
            assert step - min(versions) <= 1 and max(versions) <= step
            mixed += len(set(versions)) > 1
    assert mixed > 0, "no trained episode spans a weight update"
