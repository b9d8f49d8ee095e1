"""Trajectory invariants and serialization."""

from __future__ import annotations

import json

import pytest

from uniagent.errors import TrajectoryError
from uniagent.tokens import Trajectory


def _traj() -> Trajectory:
    t = Trajectory(prompt_ids=[1, 2, 3])
    t.add_generation([10, 11, 2], [-0.1, -0.2, -0.3])
    t.add_context([198, 1, 5], role="tool")
    t.add_generation([12, 2], [-0.4, -0.5], finish_reason="length")
    return t


def test_masks_logprobs_and_spans():
    t = _traj()
    t.validate()
    assert t.response_mask == [1, 1, 1, 0, 0, 0, 1, 1]
    assert t.response_logprobs[3:6] == [0.0, 0.0, 0.0]
    assert [(s.kind, s.turn, s.role, s.start, s.end) for s in t.spans] == [
        ("model", 0, "assistant", 0, 3),
        ("context", 1, "tool", 3, 6),
        ("model", 1, "assistant", 6, 8),
    ]
    assert t.num_turns == 2 and t.finish_reasons == ["stop", "length"]
    assert t.token_ids == [1, 2, 3, 10, 11, 2, 198, 1, 5, 12, 2]
    assert t.summary()["model_tokens"] == 5


def test_round_trip_through_json():
    t = _traj()
    t.drift = 4
    again = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again == t


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: d["response_mask"].pop(),
        lambda d: d["response_logprobs"].append(0.0),
        lambda d: d["response_mask"].__setitem__(3, 1),  # mask 1 on a context token
        lambda d: d["response_mask"].__setitem__(0, 0),  # mask 0 on a model token
        lambda d: d["response_logprobs"].__setitem__(4, -1.0),
        lambda d: d["spans"].pop(),
        lambda d: d.pop("prompt_ids"),
    ],
)
def test_invariants_are_enforced(corrupt):
    d = _traj().to_dict()
    corrupt(d)
    with pytest.raises(TrajectoryError):
        Trajectory.from_dict(d)


def test_generation_needs_a_logprob_per_token():
    with pytest.raises(TrajectoryError):
        Trajectory(prompt_ids=[1]).add_generation([1, 2], [0.0])
