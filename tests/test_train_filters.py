"""train/filters.py: DAPO dynamic sampling, overlong filtering and how unfinished episodes count.

No model: episodes are built from small Trajectories. The advantages are verl's real
`compute_grpo_outcome_advantage`; the group filter is compared with verl's real replay buffer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import require_module
from uniagent.agent.result import EpisodeResult, ExitReason, Reward
from uniagent.errors import TrainingError
from uniagent.tokens import Trajectory
from uniagent.train import algo, filters, segments
from uniagent.train.config import AlgoSection
from uniagent.train.sample import Sample
from uniagent.train.toy import ToyTask

core_algos = require_module("verl.trainer.ppo.core_algos", "the training losses (pip install -e .[verl])")

TASK = ToyTask({"instance_id": "t", "question": "say hi", "answer": "hi"})
F, MT, CL, FE, SD = (
    ExitReason.FINISHED,
    ExitReason.MAX_TURNS,
    ExitReason.CONTEXT_LIMIT,
    ExitReason.FORMAT_ERRORS,
    ExitReason.SANDBOX_DEAD,
)


def _segment(finishes: list[str], seed: int) -> Trajectory:
    """A segment of len(finishes) model turns of 3 tokens, a 2-token tool result after each but the last."""
    g = torch.Generator().manual_seed(seed)
    t = Trajectory(prompt_ids=torch.randint(10, 1000, (4,), generator=g).tolist())
    for i, finish in enumerate(finishes):
        t.add_generation(torch.randint(10, 1000, (3,), generator=g).tolist(), [-0.5] * 3, finish)
        if i < len(finishes) - 1:
            t.add_context(torch.randint(10, 1000, (2,), generator=g).tolist(), "tool")
    return t


_seed = iter(range(10**6))


def ep(
    group: str,
    reward: float | None,
    exit_reason: ExitReason = F,
    finishes: tuple[list[str], ...] = (["stop", "stop"],),
    resolved: bool | None = None,
) -> Sample:
    """A trainer Sample (the real one) of one episode: one segment per entry of `finishes`."""
    result = EpisodeResult(
        messages=[],
        segments=[_segment(list(f), next(_seed)) for f in finishes],
        exit_reason=exit_reason,
        reward=None if reward is None else Reward(reward, reward == 1.0 if resolved is None else resolved),
    )
    return Sample(TASK, group, result)


def cfg(**kw) -> AlgoSection:
    return AlgoSection(**kw)


# ------------------------------------------------------------------------------------ one episode


def test_overlong_is_a_length_cut_segment_end_or_the_context_limit() -> None:
    assert not filters.is_overlong(ep("g", 1.0).result)
    assert filters.is_overlong(ep("g", 0.0, FE, (["stop", "length"],)).result)
    # a cut turn the episode recovered from (a format error, then a turn that stopped) is no cut episode
    assert not filters.is_overlong(ep("g", 1.0, F, (["length", "stop"],)).result)
    # the first of two segments ended on a cut turn (the history was condensed after it)
    assert filters.is_overlong(ep("g", 1.0, F, (["stop", "length"], ["stop"])).result)
    assert filters.is_overlong(ep("g", 0.0, CL).result)
    assert not filters.is_overlong(ep("g", 0.0, MT, (["stop", "abort"],)).result)


def test_unfinished_is_a_trainable_episode_that_did_not_finish() -> None:
    assert not filters.is_unfinished(ep("g", 1.0, F).result)
    for reason in (MT, CL, FE, ExitReason.TIMEOUT_BUDGET):
        assert filters.is_unfinished(ep("g", 0.0, reason).result)
    assert not filters.is_unfinished(ep("g", None, SD).result)  # an infrastructure failure


@pytest.mark.parametrize(
    ("sample", "settings", "expected"),
    [
        (ep("g", 1.0), {}, (True, True, "trained")),
        (ep("g", 0.0, MT), {}, (True, True, "trained")),  # count: verl's default
        (ep("g", 0.0, MT), {"unfinished": "baseline_only"}, (True, False, "unfinished")),
        (ep("g", 0.0, MT), {"unfinished": "drop"}, (False, False, "unfinished_dropped")),
        (ep("g", 0.0, FE, (["length"],)), {}, (True, True, "trained")),
        (ep("g", 0.0, FE, (["length"],)), {"overlong_filter": True}, (True, False, "overlong")),
        (
            ep("g", 0.0, CL),
            {"overlong_filter": True, "unfinished": "drop"},
            (False, False, "unfinished_dropped"),
        ),
        (
            ep("g", 1.0, F, (["length"],)),
            {"overlong_filter": True, "unfinished": "drop"},
            (True, False, "overlong"),
        ),
        (ep("g", None, SD), {}, (False, False, "untrainable")),
        (ep("g", None, SD), {"unfinished": "baseline_only"}, (False, False, "untrainable")),
        (ep("g", 0.0, F, ()), {}, (False, False, "no_model_tokens")),
    ],
)
def test_plan_sample_rules(sample: Sample, settings: dict, expected: tuple) -> None:
    plan = filters.plan_sample(sample.result, cfg(**settings))
    assert (plan.in_baseline, plan.trained, plan.why) == expected


def test_a_redacted_secret_keeps_an_episode_out_of_its_group() -> None:
    sample = ep("g", 1.0)
    sample.result.metrics["untrainable_reason"] = "secret_redacted"
    assert filters.plan_sample(sample.result, cfg()).why == "untrainable"


def test_plan_step_orders_the_baseline_and_counts_each_rule() -> None:
    samples = [
        ep("a", 1.0),
        ep("a", 0.0, F, (["length"],)),  # finished on a cut turn: overlong, not unfinished
        ep("a", 0.0, MT),
        ep("a", None, SD),
        ep("b", 0.0, CL),
        ep("b", 1.0),
    ]
    plan = filters.plan_step(samples, cfg(overlong_filter=True, unfinished="baseline_only"))
    assert plan.baseline == [samples[0], samples[1], samples[2], samples[4], samples[5]]
    assert plan.trained == [True, False, False, False, True]
    assert (plan.overlong_masked, plan.unfinished_masked, plan.untrainable) == (1, 2, 1)
    assert plan.counters()["episodes_no_gradient"] == 3.0
    dropped = filters.plan_step(samples, cfg(unfinished="drop"))
    assert dropped.baseline == [samples[0], samples[1], samples[5]] and dropped.trained == [True] * 3
    assert dropped.counters()["episodes_unfinished_dropped"] == 2.0 and dropped.no_gradient == 2


# ------------------------------------------------------------------------------------ advantages


def _advantages(samples: list[Sample], settings: AlgoSection):
    """What the trainer does (local.update): plan, rows, verl's GRPO over the baseline, drop untrained."""
    plan = filters.plan_step(samples, settings)
    rows = segments.segment_rows([s.result for s in plan.baseline])
    batch = algo.pack(rows.trajectories)
    adv = segments.episode_advantages(
        "grpo",
        rows,
        [s.result.reward.value for s in plan.baseline],
        [s.group for s in plan.baseline],
        batch.response_mask,
    )
    return plan, rows, batch, adv, filters.drop_untrained(batch, adv, rows, plan.trained)


def _verl_grpo(samples: list[Sample]) -> torch.Tensor:
    """verl's GRPO straight over the samples' final segments, one row per episode."""
    batch = algo.pack([s.result.segments[-1] for s in samples])
    rewards = algo.outcome_rewards([s.result.reward.value for s in samples], batch.response_mask)
    index = np.array([s.group for s in samples], dtype=object)
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, batch.response_mask, index)
    return adv


def test_an_overlong_episode_counts_in_the_baseline_and_gets_zero_advantage() -> None:
    """A group of 4 with one overlong episode (two segments, the first ended on a cut turn): the other
    three get exactly verl's GRPO advantage over all 4; the overlong one's rows leave the batch."""
    group = [
        ep("a", 1.0),
        ep("a", 0.0, F, (["stop", "length"], ["stop"])),
        ep("a", 0.5, F),
        ep("a", 0.0, MT),
    ]
    other = [ep("b", 1.0), ep("b", 0.0)]
    samples = group + other
    plan, rows, batch, adv, kept = _advantages(samples, cfg(overlong_filter=True))
    assert plan.trained == [True, False, True, True, True, True]
    verl = _verl_grpo(samples)
    assert (verl[0] > 0).any() and (verl[3] < 0).any()  # the crafted rewards give real advantages
    # the full view (advantage over the baseline, then zero for the no-gradient episode)
    full = torch.zeros_like(adv)
    kept_batch, kept_adv = kept
    keep = [i for i, k in enumerate(rows.episode) if plan.trained[k]]
    full[keep] = kept_adv
    overlong_rows = [i for i, k in enumerate(rows.episode) if k == 1]
    assert len(overlong_rows) == 2 and torch.count_nonzero(full[overlong_rows]) == 0
    for k in (0, 2, 3, 4, 5):
        (row,) = [i for i, e in enumerate(rows.episode) if e == k]
        width = verl.shape[1]
        assert torch.allclose(full[row, :width], verl[k]) and torch.count_nonzero(full[row, width:]) == 0
    # the kept batch is the trained rows as they were: tokens, masks and logprobs
    assert len(kept_batch) == len(keep) == 5
    assert torch.equal(kept_batch.response_ids, batch.response_ids[keep])
    assert torch.equal(kept_batch.response_mask, batch.response_mask[keep])
    assert torch.equal(kept_batch.old_log_probs, batch.old_log_probs[keep])
    assert torch.equal(kept_batch.input_ids, batch.input_ids[keep])
    # without the filter it trains as before: every row, verl's advantage
    _, _, batch_all, adv_all, kept_all = _advantages(samples, cfg())
    assert kept_all[0] is batch_all and kept_all[1] is adv_all


def test_dropped_unfinished_episodes_leave_the_group_baseline() -> None:
    samples = [ep("a", 1.0), ep("a", 0.0), ep("a", 0.0, MT), ep("a", 0.0, MT)]
    plan, *_, (_, kept_adv) = _advantages(samples, cfg(unfinished="drop"))
    assert plan.baseline == samples[:2]
    verl = _verl_grpo(samples[:2])
    assert torch.allclose(kept_adv[:, : verl.shape[1]], verl)
    as_baseline = _advantages(samples, cfg(unfinished="baseline_only"))
    verl4 = _verl_grpo(samples)
    assert torch.allclose(as_baseline[4][1][:, : verl4.shape[1]], verl4[:2])  # baseline over all 4
    assert not torch.allclose(verl4[0], verl[0])


def test_drop_untrained_edges() -> None:
    samples = [ep("a", 1.0, MT), ep("a", 0.0, MT)]
    *_, kept = _advantages(samples, cfg(unfinished="baseline_only"))
    assert kept is None
    _, rows, batch, adv, _ = _advantages(samples, cfg())
    with pytest.raises(ValueError, match="trained flags"):
        filters.drop_untrained(batch, adv, rows, [True])


# ------------------------------------------------------------------------------------ groups


def test_group_signal_counts_only_the_baseline() -> None:
    assert filters.group_has_signal([ep("g", 1.0), ep("g", 0.0)], "reward")
    assert not filters.group_has_signal([ep("g", 1.0), ep("g", 1.0), ep("g", None, SD)], "reward")
    assert not filters.group_has_signal([ep("g", 1.0), ep("g", None, SD)], "reward")
    mixed = [ep("g", 1.0), ep("g", 0.0, MT)]
    assert filters.group_has_signal(mixed, "reward", cfg(unfinished="baseline_only"))
    assert not filters.group_has_signal(mixed, "reward", cfg(unfinished="drop"))  # one member left
    cut = [ep("g", 1.0, F, (["length"],)), ep("g", 0.0, FE, (["length"],))]
    assert filters.group_has_signal(cut, "reward")
    assert not filters.group_has_signal(cut, "reward", cfg(overlong_filter=True))  # nobody trains
    partial = [ep("g", 0.5), ep("g", 0.25)]
    assert filters.group_has_signal(partial, "reward") and not filters.group_has_signal(partial, "resolved")


def _verl_filtered(samples: list[Sample], metric: str, monkeypatch) -> set[str]:
    """The groups verl's V1 replay buffer (`ReplayBuffer._dapo_filtered_keys`, DAPO) drops.
    FAKE: TransferQueue's store (a Ray controller and storage actors) is replaced by a dict that
    answers `kv_batch_get` with what verl would have stored: `rm_scores` (the float32 reward on the
    last token) or `extra_fields.reward_extra_info[metric]` (`acc`: resolved; else the reward)."""
    import transfer_queue as tq
    from omegaconf import DictConfig
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    stored: dict[str, Sample] = {}
    for k, s in enumerate(samples):
        if s.result.trainable:  # a failed rollout leaves verl no trajectory
            stored[f"{s.group}_{k}"] = s

    def kv_batch_get(keys, partition_id, select_fields):
        assert partition_id == "train"
        if select_fields == ["rm_scores"]:
            return {"rm_scores": [torch.tensor([0.0, 0.0, stored[k].result.reward.value]) for k in keys]}
        value = {
            k: float(stored[k].result.resolved if metric == "acc" else stored[k].result.reward.value)
            for k in keys
        }
        return {"extra_fields": [{"reward_extra_info": {metric: value[k]}} for k in keys]}

    monkeypatch.setattr(tq, "kv_batch_get", kv_batch_get)
    buffer = ReplayBuffer(
        "sync",
        DictConfig({}),
        None,
        "drop",
        DictConfig({}),
        refill_fn=lambda n: None,
        filter_groups_metric=metric,
        train_batch_size=4,
        gen_batch_size=1,
    )
    buffer.finished_keys["train"] = {s.group for s in samples}
    buffer.partitions["train"] = {key: {} for key in stored}
    dropped, _counts = buffer._dapo_filtered_keys("train")
    return dropped


def test_filter_groups_matches_verl_dapo_except_where_documented(monkeypatch) -> None:
    samples = [
        *[ep("allone", 1.0) for _ in range(4)],
        *[ep("mixed", r) for r in (0.0, 1.0, 0.0, 0.0)],
        *[ep("allzero", 0.0) for _ in range(4)],
        *[ep("partial", r) for r in (0.5, 0.25, 0.5, 0.5)],  # unresolved all: acc is constant
        ep("solved", 1.0),
        ep("solved", 0.5),
        *[ep("infra", 1.0), ep("infra", 0.0), ep("infra", None, SD), ep("infra", 1.0)],
        # where we differ: a lone survivor of its group; equal float64 rewards whose np.std is 1.4e-17
        *[ep("lone", 1.0), ep("lone", None, SD)],
        *[ep("tenths", 0.1) for _ in range(3)],
    ]
    groups = filters.by_group(samples)
    ours = {}
    for metric in ("reward", "resolved"):
        kept, dropped = filters.filter_groups(groups, cfg(filter_groups={"enable": True, "metric": metric}))
        assert set(kept) | set(dropped) == set(groups) and not set(kept) & set(dropped)
        assert list(kept) == [g for g in groups if g in kept]  # order kept
        ours[metric] = set(dropped)
    assert ours["reward"] == {"allone", "allzero", "lone", "tenths"}
    assert ours["resolved"] == {"allone", "allzero", "partial", "lone", "tenths"}
    # verl: rm_scores (float32: equal rewards give std 0), acc, and a float64 extra-info score
    assert _verl_filtered(samples, "reward", monkeypatch) == ours["reward"] - {"lone"}
    assert _verl_filtered(samples, "acc", monkeypatch) == ours["resolved"] - {"lone"}
    assert _verl_filtered(samples, "score", monkeypatch) == ours["reward"] - {"lone", "tenths"}
    # off: every group is kept, none dropped (verl trains zero-advantage groups too)
    kept, dropped = filters.filter_groups(groups, cfg())
    assert list(kept) == list(groups) and dropped == []


def _batch(tag: str, rewards: list[list[float]]) -> list[Sample]:
    return [ep(f"{tag}{i}", r) for i, group in enumerate(rewards) for r in group]


def test_dynamic_sampling_over_samples_until_enough_groups_have_signal() -> None:
    settings = cfg(filter_groups={"enable": True, "max_num_gen_batches": 3})
    ds: filters.DynamicSampling[Sample] = filters.DynamicSampling(settings, target=2)
    assert ds.need_more()
    assert ds.add(_batch("x", [[1.0, 0.0], [1.0, 1.0]])) == ["x1"]
    assert ds.need_more()
    second = _batch("y", [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    assert ds.add(second) == ["y0"]
    assert not ds.need_more()
    taken = ds.take()
    assert [s.group for s in taken] == ["x0", "x0", "y1", "y1"]  # the first two kept, surplus y2 discarded
    assert ds.groups_dropped == 2 and ds.batches == 2
    with pytest.raises(ValueError, match="unique ids"):
        ds.add(_batch("x", [[1.0, 0.0]]))


def test_dynamic_sampling_stops_at_max_num_gen_batches() -> None:
    settings = cfg(filter_groups={"enable": True, "max_num_gen_batches": 2})
    ds: filters.DynamicSampling[Sample] = filters.DynamicSampling(settings, target=1)
    ds.add(_batch("a", [[1.0, 1.0]]))
    assert ds.need_more()
    ds.add(_batch("b", [[0.0, 0.0]]))
    with pytest.raises(TrainingError, match="max_num_gen_batches"):
        ds.need_more()
    endless = filters.DynamicSampling(cfg(filter_groups={"enable": True, "max_num_gen_batches": 0}), target=1)
    for i in range(5):
        endless.add(_batch(f"e{i}", [[1.0, 1.0]]))
    assert endless.need_more()


def test_dynamic_sampling_off_takes_one_batch_as_it_is() -> None:
    ds: filters.DynamicSampling[Sample] = filters.DynamicSampling(cfg(), target=4)
    batch = _batch("z", [[1.0, 1.0], [0.0, 1.0]])
    ds.add(batch)
    assert not ds.need_more() and ds.take() == batch and ds.groups_dropped == 0
