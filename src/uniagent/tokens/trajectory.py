"""The token record of an episode: exactly what the policy saw and produced.

Model tokens are stored as the engine returned them and never re-tokenized from text; context
tokens (tool results, user turns, turn boundaries) come from the codec. The response mask says
which is which, and the trainer sees exactly this.

Each response token also carries the policy version that produced it (`response_versions`): an
asynchronous trainer samples with weights that lag behind the ones it trains, and a generation
interrupted by a weight update (partial rollout) holds tokens of two versions. The trainer needs
the age of every sample to bound and report staleness; the record needs it to be reproducible.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from uniagent.errors import TrajectoryError

SpanKind = Literal["model", "context"]

SegmentReason = Literal["start", "condensed", "rewritten", "rollback", "template"]
"""Why a segment began: the episode's first (`start`); the context policy condensed the history
(`condensed`); a harness sent a history that no segment extends (`rewritten`, rendered afresh);
a harness rewrote messages after an assistant turn and the exact tokens up to that turn were
kept (`rollback`); the chat template does not render earlier turns as they were generated, e.g.
it strips earlier reasoning (`template`)."""

SEGMENT_REASONS: tuple[str, ...] = ("start", "condensed", "rewritten", "rollback", "template")

DriftKind = Literal["sampled", "template", "bookkeeping"]
"""What a drift index means (uniagent.tokens.drift). `sampled`: the first difference lies in
tokens the model sampled, whose text a fresh encoding would split differently (harmless: the
record keeps the sampled ids). `template`: the template shows earlier turns differently once
more follow (it strips reasoning), and the model kept seeing its own tokens (expected with
`model.history: exact`). `bookkeeping`: our tokens differ from the template's render (a bug)."""


def version_range(versions: list[int], mask: list[int]) -> tuple[int, int] | None:
    """(oldest, newest) version of the model tokens (mask 1) of one response; None when its
    versions are unknown (not one per token) or it has no model token."""
    if len(versions) != len(mask):
        return None
    model = [v for v, m in zip(versions, mask, strict=True) if m]
    return (min(model), max(model)) if model else None


@dataclass
class TurnSpan:
    """A slice `[start, end)` of the response that belongs to one turn and one source.

    `turn` is the index of the model turn the span follows or belongs to (context before the
    second model turn has turn 1); `role` is the chat role the tokens render (assistant, tool,
    user, ...) or "boundary" for template glue.
    """

    start: int
    end: int
    kind: SpanKind
    turn: int
    role: str

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass
class Trajectory:
    """Prompt ids, response ids, response mask (1 = model token), logprobs, versions, spans, drift.

    One trajectory is one *segment* of an episode: an exact, append-only token sequence.
    `reason` says why it began and `chain` which linear conversation it belongs to (a gateway
    session may hold several).

    `response_versions` is aligned with `response_ids`: the policy version that sampled a model
    token, -1 for a context token. An empty list means *unknown*: the engine reported no versions
    (`Generation.versions is None`, e.g. a remote server). Versions are all or nothing per
    segment: once one generation comes without them the list is cleared and stays empty for the
    rest of the segment, so a known version is never next to a guessed one."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    spans: list[TurnSpan] = field(default_factory=list)
    num_turns: int = 0
    drift: int | None = None
    finish_reasons: list[str] = field(default_factory=list)
    reason: str = "start"
    chain: int = 0
    drift_kind: str | None = None
    response_versions: list[int] = field(default_factory=list)

    # -- building -------------------------------------------------------------------------
    def add_generation(
        self,
        token_ids: list[int],
        logprobs: list[float],
        finish_reason: str = "stop",
        versions: list[int] | None = None,
    ) -> None:
        """Append one model turn exactly as generated (mask 1), with the policy version of each
        token (`None`: unknown, which makes the whole segment's versions unknown)."""
        if len(token_ids) != len(logprobs):
            raise TrajectoryError(f"{len(token_ids)} generated tokens but {len(logprobs)} logprobs")
        if versions is not None and len(versions) != len(token_ids):
            raise TrajectoryError(f"{len(token_ids)} generated tokens but {len(versions)} versions")
        if versions is None:
            self.response_versions = []
        elif self.versions_known:
            self.response_versions.extend(int(v) for v in versions)
        self._append(list(token_ids), [float(x) for x in logprobs], "model", self.num_turns, "assistant")
        self.num_turns += 1
        self.finish_reasons.append(finish_reason)

    def add_context(self, token_ids: list[int], role: str = "context") -> None:
        """Append tokens the model did not generate (mask 0, logprob 0.0, version -1)."""
        if self.versions_known:
            self.response_versions.extend([-1] * len(token_ids))
        self._append(list(token_ids), [0.0] * len(token_ids), "context", self.num_turns, role)

    def _append(self, ids: list[int], logprobs: list[float], kind: SpanKind, turn: int, role: str) -> None:
        if not ids:
            return
        start = len(self.response_ids)
        self.response_ids.extend(ids)
        self.response_mask.extend([1 if kind == "model" else 0] * len(ids))
        self.response_logprobs.extend(logprobs)
        self.spans.append(TurnSpan(start, start + len(ids), kind, turn, role))

    # -- views ----------------------------------------------------------------------------
    @property
    def token_ids(self) -> list[int]:
        """The whole running sequence: prompt then response."""
        return self.prompt_ids + self.response_ids

    @property
    def num_model_tokens(self) -> int:
        return sum(self.response_mask)

    @property
    def versions_known(self) -> bool:
        """Whether every response token has its version (trivially so for an empty response)."""
        return len(self.response_versions) == len(self.response_ids)

    @property
    def version_range(self) -> tuple[int, int] | None:
        """(oldest, newest) policy version of the model tokens; None when unknown or none."""
        return version_range(self.response_versions, self.response_mask)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def validate(self) -> None:
        """Raise `TrajectoryError` if lengths, spans or masks are inconsistent."""
        n = len(self.response_ids)
        if not (len(self.response_mask) == len(self.response_logprobs) == n):
            raise TrajectoryError(
                f"response has {n} ids, {len(self.response_mask)} mask entries and "
                f"{len(self.response_logprobs)} logprobs; they must be equal"
            )
        # C-level scans (count, any, min/max over slices): this runs on every stored episode
        if self.response_mask.count(0) + self.response_mask.count(1) != n:
            raise TrajectoryError("response_mask may hold only 0 and 1")
        if self.response_versions and len(self.response_versions) != n:
            raise TrajectoryError(
                f"response has {n} ids but {len(self.response_versions)} versions; "
                "they must be equal (or no versions: unknown)"
            )
        versions = self.response_versions or None
        pos = 0
        for span in self.spans:
            if span.start != pos or span.end <= span.start:
                raise TrajectoryError(f"span {span} does not continue at token {pos}")
            want = 1 if span.kind == "model" else 0
            if self.response_mask[span.start : span.end].count(want) != span.end - span.start:
                raise TrajectoryError(
                    f"mask inside {span.kind} span [{span.start}, {span.end}) is not {want}"
                )
            if span.kind == "context" and any(self.response_logprobs[span.start : span.end]):
                raise TrajectoryError(f"context span [{span.start}, {span.end}) has non-zero logprobs")
            if versions is not None:
                window = versions[span.start : span.end]
                ok = min(window) >= 0 if span.kind == "model" else max(window) < 0
                bad = [] if ok else [v for v in window if (v < 0) == (span.kind == "model")]
                if bad:
                    want = "a version >= 0" if span.kind == "model" else "version -1"
                    where = f"{span.kind} span [{span.start}, {span.end})"
                    raise TrajectoryError(f"{where} needs {want}, has {bad[0]}")
            pos = span.end
        if pos != n:
            raise TrajectoryError(f"spans cover {pos} of {n} response tokens")
        if self.reason not in SEGMENT_REASONS:
            raise TrajectoryError(f"segment reason {self.reason!r} is not one of {SEGMENT_REASONS}")
        # A model turn is one span, or several when a redacted secret cut it (uniagent.redact).
        model_turns = len({s.turn for s in self.spans if s.kind == "model"})
        if model_turns > self.num_turns:
            raise TrajectoryError(f"{model_turns} model turns but num_turns is {self.num_turns}")

    # -- serialization --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_ids": list(self.prompt_ids),
            "response_ids": list(self.response_ids),
            "response_mask": list(self.response_mask),
            "response_logprobs": list(self.response_logprobs),
            "spans": [asdict(s) for s in self.spans],
            "num_turns": self.num_turns,
            "drift": self.drift,
            "finish_reasons": list(self.finish_reasons),
            "reason": self.reason,
            "chain": self.chain,
            "drift_kind": self.drift_kind,
            "response_versions": list(self.response_versions),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        try:
            traj = cls(
                prompt_ids=list(data["prompt_ids"]),
                response_ids=list(data["response_ids"]),
                response_mask=list(data["response_mask"]),
                response_logprobs=[float(x) for x in data["response_logprobs"]],
                spans=[TurnSpan(**s) for s in data.get("spans", [])],
                num_turns=int(data.get("num_turns", 0)),
                drift=data.get("drift"),
                finish_reasons=list(data.get("finish_reasons", [])),
                reason=str(data.get("reason", "start")),
                chain=int(data.get("chain", 0)),
                drift_kind=data.get("drift_kind"),
                response_versions=[int(v) for v in data.get("response_versions") or []],
            )
        except (KeyError, TypeError) as exc:
            raise TrajectoryError(f"not a trajectory dict: {exc}") from exc
        traj.validate()
        return traj

    def summary(self) -> dict[str, Any]:
        """Counts a human wants to see first."""
        return {
            "prompt_tokens": len(self.prompt_ids),
            "response_tokens": len(self.response_ids),
            "model_tokens": self.num_model_tokens,
            "context_tokens": len(self.response_ids) - self.num_model_tokens,
            "num_turns": self.num_turns,
            "drift": self.drift,
            "drift_kind": self.drift_kind,
            "reason": self.reason,
            "versions": self.version_range,
        }
