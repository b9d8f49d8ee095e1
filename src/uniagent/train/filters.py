"""Which episodes of a step train, and which count in their group's baseline: DAPO's filters.

Three settings (`algo.filter_groups`, `algo.overlong_filter`, `algo.unfinished`), all pure functions
over the trainer's samples (anything with `.group` and `.result`, e.g. `train.sample.Sample`), so the
sync and the async loop apply the same rules and the tests need no model.

- **Dynamic sampling** (DAPO; verl `algorithm.filter_groups`): a GRPO group whose episodes all
  scored the same has advantage zero everywhere and trains nothing, yet costs a forward/backward
  and dilutes `token-mean`; it is dropped and another group is sampled (`DynamicSampling`).
- **Overlong filtering** (DAPO): an episode cut by a length limit (a turn hit `max_tokens`, or the
  context limit) earns a reward that says little about what it would have done; it stays in its
  group's mean/std (the others' advantages are unchanged) but gets no gradient.
- **Unfinished episodes** (`max_turns`, `context_limit`, `format_errors`, `timeout_budget`):
  `count` trains them with their reward (verl), `baseline_only` keeps them in the baseline without
  gradient, `drop` leaves them out of the group. Infrastructure failures (an untrainable exit
  reason, a redacted secret) are never in a group: a broken sandbox is not a zero reward.

The contract with the trainer (`plan_step` then `drop_untrained`): the advantage estimator runs over
`plan.baseline`, every episode in its group's baseline, exactly as verl's estimator would over those
episodes; afterwards the rows of episodes that get no gradient leave the batch. That equals zeroing
their advantage and loss mask, and also keeps them out of the step's token and row counts, which
verl's `agg_loss` divides by (a fully masked row would still count in `seq-mean-*`'s row count).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Generic, Literal, Protocol, TypeVar

import torch

from uniagent.agent.result import EpisodeResult, ExitReason
from uniagent.errors import TrainingError

if TYPE_CHECKING:
    from uniagent.train.algo import Batch
    from uniagent.train.config import AlgoSection
    from uniagent.train.segments import SegmentRows

Unfinished = Literal["count", "baseline_only", "drop"]
Why = Literal["trained", "untrainable", "no_model_tokens", "unfinished_dropped", "unfinished", "overlong"]


class Grouped(Protocol):
    """What the filters read of a trainer sample (`train.sample.Sample` is one; no import, no cycle)."""

    @property
    def group(self) -> str: ...

    @property
    def result(self) -> EpisodeResult: ...


S = TypeVar("S", bound=Grouped)


# ----------------------------------------------------------------------------------- one episode


def is_overlong(result: EpisodeResult) -> bool:
    """Whether a length limit cut the episode: the last model turn of any segment stopped at
    `max_tokens` (finish reason "length"), or the episode ended at the context limit."""
    if result.exit_reason == ExitReason.CONTEXT_LIMIT:
        return True
    return any(t.finish_reasons and t.finish_reasons[-1] == "length" for t in result.segments or [])


def is_unfinished(result: EpisodeResult) -> bool:
    """A trainable episode that ended other than by finishing (out of turns, context, format, budget)."""
    return result.trainable and result.exit_reason != ExitReason.FINISHED


def has_model_tokens(result: EpisodeResult) -> bool:
    """Whether any segment holds a model token: without one an episode is no row of the batch."""
    return any(t.num_model_tokens > 0 for t in result.segments or [])


@dataclass(frozen=True)
class SamplePlan:
    """How one episode enters its step: in its group's mean/std, trained (gets gradient), and why."""

    in_baseline: bool
    trained: bool
    why: Why


def _plan(result: EpisodeResult, overlong_filter: bool, unfinished: Unfinished) -> SamplePlan:
    if not result.trainable:
        return SamplePlan(False, False, "untrainable")
    if not has_model_tokens(result):
        return SamplePlan(False, False, "no_model_tokens")
    if is_unfinished(result):
        if unfinished == "drop":
            return SamplePlan(False, False, "unfinished_dropped")
        if unfinished == "baseline_only":
            return SamplePlan(True, False, "unfinished")
    if overlong_filter and is_overlong(result):
        return SamplePlan(True, False, "overlong")
    return SamplePlan(True, True, "trained")


def plan_sample(result: EpisodeResult, algo: AlgoSection | None = None) -> SamplePlan:
    """The rules, in order: untrainable -> neither; no model token -> neither (nothing to train, no
    row to carry its reward); unfinished with `drop` -> neither; unfinished with `baseline_only` ->
    baseline only; overlong with `overlong_filter` -> baseline only; otherwise both. `algo=None`
    is the defaults (`unfinished=count`, no overlong filter): verl's behaviour."""
    if algo is None:
        return _plan(result, False, "count")
    return _plan(result, algo.overlong_filter, algo.unfinished)


# ----------------------------------------------------------------------------------- groups


def metric_value(result: EpisodeResult, metric: str) -> float:
    """`reward` (verl `score`/`reward`: the verifier's value) or `resolved` (verl `acc`: 0/1)."""
    if metric == "reward":
        return float(result.reward.value) if result.reward is not None else 0.0
    if metric == "resolved":
        return float(result.resolved)
    raise ValueError(f"unknown filter_groups metric {metric!r}: reward or resolved")


def group_has_signal(samples: Sequence[Grouped], metric: str, algo: AlgoSection | None = None) -> bool:
    """Whether a group can train anything: at least 2 episodes in its baseline whose `metric`
    differs, and at least one of them trained.

    Where it matches verl (`ReplayBuffer._dapo_filtered_keys` in 0.9.1; the DAPO recipe's
    `std > 0` test): a group of >= 2 episodes whose metric values are all the same is dropped.
    Where it differs, and why:
    - the values are compared for equality, not `np.std(values) == 0`: the same answer for verl's
      float32 `rm_scores`, but three float64 scores of 0.1 (a `reward_extra_info` metric) have an
      np.std of 1.4e-17, so verl keeps that group and trains it on rounding noise;
    - a group with fewer than 2 episodes in its baseline is dropped; verl keeps a group of one,
      whose GRPO advantage is its raw reward (mean 0, std 1), no comparison with a sibling. Here a
      group of one is what infrastructure failures or `unfinished=drop` left of a larger group;
    - only episodes in the baseline count (infrastructure failures and dropped unfinished ones are
      not in the group, as verl has no trajectory for a failed one), and a group whose members all
      get no gradient (overlong, `baseline_only`) trains nothing either.
    """
    plans = [plan_sample(s.result, algo) for s in samples]
    values = {metric_value(s.result, metric) for s, p in zip(samples, plans, strict=True) if p.in_baseline}
    members = sum(p.in_baseline for p in plans)
    return members >= 2 and len(values) > 1 and any(p.trained for p in plans)


def by_group(samples: Iterable[S]) -> dict[str, list[S]]:
    """Samples keyed by their group, groups and members in arrival order."""
    out: dict[str, list[S]] = {}
    for s in samples:
        out.setdefault(s.group, []).append(s)
    return out


def filter_groups(groups: Mapping[str, list[S]], algo: AlgoSection) -> tuple[dict[str, list[S]], list[str]]:
    """DAPO dynamic sampling's filter: (the groups with signal, the ids of those dropped), in order.
    With `algo.filter_groups.enable` off every group is kept (verl trains zero-advantage groups too)."""
    if not algo.filter_groups.enable:
        return dict(groups), []
    kept: dict[str, list[S]] = {}
    dropped: list[str] = []
    for gid, members in groups.items():
        if group_has_signal(members, algo.filter_groups.metric, algo):
            kept[gid] = members
        else:
            dropped.append(gid)
    return kept, dropped


@dataclass
class DynamicSampling(Generic[S]):
    """The sync step's over-sampling loop (verl's DAPO recipe): generate a batch of groups, keep the
    ones with signal, generate another while fewer than `target` were kept, then train the first
    `target`. More than `filter_groups.max_num_gen_batches` batches (0: no cap) raise
    `TrainingError`, as verl raises: the tasks are too easy or too hard for the policy.

    Usage: ``ds = DynamicSampling(algo, tasks_per_step)``; ``while ds.need_more(): ds.add(await
    rollout(...))``; train on ``ds.take()``; ``ds.groups_dropped`` for the metrics row. With the
    filter off, one batch is always enough. Group ids must be unique across the step's batches
    (they are GRPO's index: two batches of one task under one id would share a baseline).
    """

    algo: AlgoSection
    target: int
    kept: dict[str, list[S]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    batches: int = 0

    def add(self, samples: Iterable[S]) -> list[str]:
        """Filter one generation batch into the kept groups; returns the ids dropped from it."""
        groups = by_group(samples)
        clash = sorted(set(groups) & (set(self.kept) | set(self.dropped)))
        if clash:
            raise ValueError(
                f"group id(s) {clash[:3]} already seen this step; give each batch's groups unique ids"
            )
        self.batches += 1
        kept, dropped = filter_groups(groups, self.algo)
        self.kept.update(kept)
        self.dropped.extend(dropped)
        return dropped

    def need_more(self) -> bool:
        """Whether another batch must be generated; raises when the cap is reached without enough."""
        if self.batches == 0:
            return True
        if not self.algo.filter_groups.enable or len(self.kept) >= self.target:
            return False
        cap = self.algo.filter_groups.max_num_gen_batches
        if cap and self.batches >= cap:
            raise TrainingError(
                f"{self.batches} rollout batches gave {len(self.kept)} of {self.target} groups whose "
                f"{self.algo.filter_groups.metric} varies ({len(self.dropped)} dropped); the tasks are too "
                "easy or too hard for the policy: raise algo.filter_groups.max_num_gen_batches (0: no cap) "
                "or change the tasks"
            )
        return True

    def take(self) -> list[S]:
        """The samples of the first `target` kept groups (the surplus is discarded, as verl does)."""
        chosen = list(self.kept.values())
        if self.algo.filter_groups.enable:
            chosen = chosen[: self.target]
        return [s for members in chosen for s in members]

    @property
    def groups_dropped(self) -> int:
        return len(self.dropped)


# ----------------------------------------------------------------------------------- the step


@dataclass
class StepPlan(Generic[S]):
    """The step's samples as the trainer uses them: `baseline` (in order) are the episodes the
    advantage estimator runs over; `trained[i]` says whether `baseline[i]` gets gradient."""

    baseline: list[S]
    trained: list[bool]
    untrainable: int = 0
    unfinished_dropped: int = 0
    overlong_masked: int = 0
    unfinished_masked: int = 0

    @property
    def no_gradient(self) -> int:
        """Trainable episodes a filter kept from the gradient (masked, or dropped as unfinished)."""
        return self.overlong_masked + self.unfinished_masked + self.unfinished_dropped

    @property
    def num_trained(self) -> int:
        return sum(self.trained)

    def counters(self) -> dict[str, float]:
        """The metrics row's keys for these filters."""
        return {
            "episodes_no_gradient": float(self.no_gradient),
            "episodes_overlong_masked": float(self.overlong_masked),
            "episodes_unfinished_masked": float(self.unfinished_masked),
            "episodes_unfinished_dropped": float(self.unfinished_dropped),
        }


def plan_step(samples: Sequence[S], algo: AlgoSection | None = None) -> StepPlan[S]:
    """Each sample's `plan_sample`, gathered for one update."""
    plan: StepPlan[S] = StepPlan([], [])
    for s in samples:
        p = plan_sample(s.result, algo)
        if p.in_baseline:
            plan.baseline.append(s)
            plan.trained.append(p.trained)
        plan.untrainable += p.why == "untrainable"
        plan.unfinished_dropped += p.why == "unfinished_dropped"
        plan.overlong_masked += p.why == "overlong"
        plan.unfinished_masked += p.why == "unfinished"
    return plan


def drop_untrained(
    batch: Batch, advantages: torch.Tensor, rows: SegmentRows, trained: Sequence[bool]
) -> tuple[Batch, torch.Tensor] | None:
    """The batch and advantages without the rows (segments) of episodes that get no gradient, or
    None when no row is left. Call it after the advantages were computed over every baseline row;
    `trained` is `StepPlan.trained`, aligned with the episodes of `rows`."""
    if len(trained) != rows.num_episodes:
        raise ValueError(f"{len(trained)} trained flags for {rows.num_episodes} episodes")
    keep = [i for i, k in enumerate(rows.episode) if trained[k]]
    if not keep:
        return None
    if len(keep) == len(rows.episode):
        return batch, advantages
    index = torch.tensor(keep, dtype=torch.long)
    picked = type(batch)(**{f.name: getattr(batch, f.name)[index] for f in fields(batch)})
    return picked, advantages[index]
