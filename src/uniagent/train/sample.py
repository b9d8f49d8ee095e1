"""A trainer sample (one episode of a step and its group) and what is computed from samples alone.

Plain data shared by the loops (local.py, async_loop.py), the update (update.py) and checkpoints
(checkpoint.py): its own module, so none of them imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from uniagent.agent.result import EpisodeResult
from uniagent.tasks.base import Task
from uniagent.train import segments


@dataclass
class Sample:
    """One episode of a step and the group it belongs to.

    `start_version` is the policy version the engine served when the episode's group started;
    `oldest_version` the oldest version among its model tokens (with partial rollout an episode's
    tokens can span versions). Staleness is measured from the oldest token: it is what bounds how far
    off-policy the update is."""

    task: Task
    group: str
    result: EpisodeResult
    start_version: int = 0

    @property
    def oldest_version(self) -> int:
        ranges = [r for seg in segments.trained_segments(self.result) if (r := seg.version_range) is not None]
        return min(low for low, _ in ranges) if ranges else self.start_version


def staleness_hist(samples: list[Sample], version: int) -> dict[str, int]:
    """Trainable episodes per lag: how many versions the oldest token of each is behind `version`,
    the policy the update starts from (sync: always 0)."""
    hist: dict[str, int] = {}
    for s in samples:
        if s.result.trainable:
            lag = str(version - s.oldest_version)
            hist[lag] = hist.get(lag, 0) + 1
    return hist
