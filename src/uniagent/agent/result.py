"""How an episode ended and what it earned.

Exactly one `ExitReason` per episode. Its `trainable` flag is the line between "the policy
did this" (finished, ran out of turns or context, could not follow the format, spent its
timeout budget, broke its own sandbox or destroyed its own workspace: all legitimate training
signal, reward included) and "the infrastructure failed" (a sandbox that died of something outside
the agent's reach, endpoint failed, verifier crashed, cancelled, a bug of ours): those episodes
carry no reward and must never be trained on as if they scored zero.

Why the agent's own wreckage is trainable: were `kill -9 -1`, a fork bomb or `rm -rf .git`
masked like a crashed backend, a failing policy could make its failure vanish from the loss by
wrecking its environment, and RL would never learn not to. `uniagent.tasks.grading` tells the two
apart from evidence the sandbox gives (`Sandbox.breakage`: its cgroup's OOM kills and pids-limit
hits, its init ended from inside rather than killed from the host) and from the workspace's
repository (its base commit gone).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from uniagent.tokens import Trajectory


class ExitReason(StrEnum):
    FINISHED = "finished"
    MAX_TURNS = "max_turns"
    CONTEXT_LIMIT = "context_limit"
    FORMAT_ERRORS = "format_errors"
    TIMEOUT_BUDGET = "timeout_budget"
    SANDBOX_DEAD = "sandbox_dead"
    MODEL_ERROR = "model_error"
    VERIFIER_ERROR = "verifier_error"
    CANCELLED = "cancelled"
    INTERNAL_ERROR = "internal_error"
    SANDBOX_BROKEN = "sandbox_broken"
    """The agent's own commands broke its sandbox: killed its processes (`kill -9 -1`), exhausted
    its own memory or pids limit (an OOM kill, a fork bomb). Reward 0, trained on."""
    WORKSPACE_DESTROYED = "workspace_destroyed"
    """The agent destroyed what grading needs: its repository or git metadata (`rm -rf .git`),
    so its patch cannot be computed. Reward 0, trained on."""

    @property
    def trainable(self) -> bool:
        return self in _TRAINABLE


_TRAINABLE = frozenset(
    {
        ExitReason.FINISHED,
        ExitReason.MAX_TURNS,
        ExitReason.CONTEXT_LIMIT,
        ExitReason.FORMAT_ERRORS,
        ExitReason.TIMEOUT_BUDGET,
        ExitReason.SANDBOX_BROKEN,
        ExitReason.WORKSPACE_DESTROYED,
    }
)


@dataclass
class Reward:
    """A verifier's verdict. `details` holds its report (test statuses, logs, match scores)."""

    value: float
    resolved: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EpisodeResult:
    """Everything an episode produced; the runner stores it, the trainer reads it.

    `segments` is the episode's token record: one exact `Trajectory` per segment, in the order
    they began (a new one when the history stopped being append-only). Every generated token is
    in exactly one segment with mask 1; none is dropped. `None` is taken for "no segment"."""

    messages: list[dict[str, Any]]
    segments: list[Trajectory] | None
    exit_reason: ExitReason
    reward: Reward | None
    metrics: dict[str, Any] = field(default_factory=dict)
    patch: str | None = None
    answer: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        self.segments = list(self.segments or [])

    @property
    def trajectory(self) -> Trajectory | None:
        """The last segment (the whole record when the history stayed append-only)."""
        return self.segments[-1] if self.segments else None

    @property
    def trainable(self) -> bool:
        """`metrics.untrainable_reason` (a secret's tokens replaced, a text-only model) overrides a
        trainable exit reason: the token record is not what the policy produced."""
        return (
            self.exit_reason.trainable
            and self.reward is not None
            and not self.metrics.get("untrainable_reason")
        )

    @property
    def resolved(self) -> bool:
        return bool(self.reward and self.reward.resolved)

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_reason": self.exit_reason.value,
            "trainable": self.trainable,
            "reward": None if self.reward is None else self.reward.to_dict(),
            "resolved": self.resolved,
            "messages": self.messages,
            "segments": [t.to_dict() for t in self.segments or []],
            "metrics": self.metrics,
            "patch": self.patch,
            "answer": self.answer,
            "error": self.error,
        }


def check_infra_failures(
    episodes: list[tuple[ExitReason, str | None]], max_share: float, setting: str, where: str = "the step"
) -> None:
    """Raise `TrainingError` when more than `max_share` of `episodes` (exit reason, error) ended in an
    infrastructure failure. Why: dropping them and training on what is left hides a broken sandbox or
    endpoint behind a run that looks healthy; the local trainer and the verl loop both call this."""
    from uniagent.errors import TrainingError

    failed = [(reason, error) for reason, error in episodes if not reason.trainable]
    if not episodes or len(failed) <= max_share * len(episodes):
        return
    counts: dict[str, int] = {}
    for reason, _ in failed:
        counts[reason.value] = counts.get(reason.value, 0) + 1
    by_reason = ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    first = next((error for _, error in failed if error), None)
    hint = f"; first error: {first.splitlines()[0][:200]}" if first else ""
    raise TrainingError(
        f"{where}: {len(failed)} of {len(episodes)} episodes are infrastructure failures ({by_reason}), "
        f"more than {setting}={max_share:g}; fix the cause or raise {setting}{hint}"
    )
