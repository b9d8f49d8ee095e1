"""Episodes with several segments as training rows: one row per segment, one advantage per episode.

An episode's token record is a list of segments (`EpisodeResult.segments`): a new one begins when
the history stops being append-only (context condensed, a harness rewrote messages, a template
drops earlier reasoning). Every generated token sits in exactly one segment with mask 1, so
training every segment trains every token the policy produced, each against the exact context it
was generated in; training only the last segment would drop the rest.

How the rows are trained (the design of verl's context-manager / multi-output agent loops and of
SkyRL's step-wise training; verl 0.9's `compute_advantage_for_multi_trajectories` does the same):

- **Rows.** Each segment with at least one model token is one row of the batch, with its own
  prompt ids, response ids, mask and rollout logprobs. Segments with no model token train nothing
  and are left out. Context tokens (mask 0, including earlier generated tokens that reappear in a
  later segment's prompt) get no gradient.
- **Advantage.** The estimator (`algo.adv_estimator`, verl's by name) runs on one row per episode,
  the episode's final trained segment, so the GRPO group of a task holds one sample per *episode*
  however many segments each has, and the outcome reward sits on that segment's last model token.
  The episode's advantage is then broadcast to each of its segments over the segment's own mask.
  An episode of one segment keeps the estimator's row as it is: training is exactly as before.
  A multi-segment episode needs an outcome estimator, one advantage for the whole row (grpo, rloo,
  grpo_passk, ...); one that varies along the row raises `TrainingError`.
- **GSPO's sequence-level ratio is per segment.** verl's `compute_policy_loss_gspo` takes the
  length-normalised ratio over a row's mask-1 tokens, s = exp(mean over the segment's model
  tokens of (log pi_theta - log pi_old)), and clips it per row. A row is a segment, so the ratio
  is the segment's: its tokens were sampled as one sequence under one context, and a ratio over
  tokens of different segments would mix contexts the policy never saw together.
- **Loss aggregation** (`algo.loss_agg_mode`, verl's `agg_loss`, normalised by the whole step's
  token and row counts): `token-mean` (the default) weighs every model token equally, so an episode
  weighs its model tokens whether they come in one segment or five; the `seq-mean-*` modes weigh
  every *row* equally, so an episode with k segments counts k times, as in verl's V1 trainer, where
  every output of a multi-output agent loop is one sequence. We keep verl's aggregation as it is (the
  objective stays verl's) and recommend `token-mean` for episodes that condense their context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from uniagent.agent.result import EpisodeResult
from uniagent.errors import TrainingError
from uniagent.tokens import Trajectory
from uniagent.train import algo


@dataclass
class SegmentRows:
    """The rows of one step: `trajectories[i]` belongs to episode `episode[i]`; `final[k]` is the row of
    episode k's final trained segment, the one its advantage is computed on."""

    trajectories: list[Trajectory]
    episode: list[int]
    final: list[int]

    @property
    def num_episodes(self) -> int:
        return len(self.final)


def trained_segments(result: EpisodeResult) -> list[Trajectory]:
    """The segments of `result` that hold model tokens, in order (the ones a step trains)."""
    return [t for t in result.segments or [] if t.num_model_tokens > 0]


def segment_rows(results: list[EpisodeResult]) -> SegmentRows:
    """One row per trained segment of each episode, episodes in order (each must have one)."""
    rows: list[Trajectory] = []
    episode: list[int] = []
    final: list[int] = []
    for k, result in enumerate(results):
        segments = trained_segments(result)
        if not segments:
            raise ValueError(f"episode {k} has no segment with model tokens")
        rows.extend(segments)
        episode.extend([k] * len(segments))
        final.append(len(rows) - 1)
    return SegmentRows(rows, episode, final)


def episode_advantages(
    estimator: str,
    rows: SegmentRows,
    rewards: list[float],
    groups: list[str],
    response_mask: torch.Tensor,
    norm_adv_by_std_in_grpo: bool = True,
) -> torch.Tensor:
    """Advantages `[rows, response_len]`: verl's `estimator` over each episode's final segment (one
    sample per episode in its group), broadcast to the episode's segments over their own masks."""
    final = algo.compute_advantages(
        estimator, rewards, response_mask[rows.final], groups, norm_adv_by_std_in_grpo
    )
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    members: dict[int, list[int]] = {}
    for i, k in enumerate(rows.episode):
        members.setdefault(k, []).append(i)
    for k, row in enumerate(rows.final):
        if len(members[k]) == 1:
            out[row] = final[k]  # one segment: the estimator's row, exactly as without segments
            continue
        values = final[k][response_mask[row] > 0]
        if not torch.allclose(values, values[0].expand_as(values)):
            raise TrainingError(
                f"algo.adv_estimator={estimator} gives advantages that vary along a sequence; an episode "
                f"of {len(members[k])} segments needs one advantage per episode (grpo, rloo, grpo_passk, ...)"
            )
        for i in members[k]:
            out[i] = values[0] * response_mask[i]
    return out
