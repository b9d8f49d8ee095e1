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
    assert_rejected(_traj(), corrupt)


def assert_rejected(traj: Trajectory, corrupt) -> None:
    """`traj`'s dict, corrupted, does not load."""
    d = traj.to_dict()
    corrupt(d)
    with pytest.raises(TrajectoryError):
        Trajectory.from_dict(d)


def test_generation_needs_a_logprob_per_token():
    with pytest.raises(TrajectoryError):
        Trajectory(prompt_ids=[1]).add_generation([1, 2], [0.0])


def _versioned() -> Trajectory:
    """A partial-rollout-like record: the second turn was interrupted by a weight update."""
    t = Trajectory(prompt_ids=[1, 2, 3])
    t.add_generation([10, 11, 2], [-0.1, -0.2, -0.3], versions=[3, 3, 3])
    t.add_context([198, 1, 5], role="tool")
    t.add_generation([12, 13, 14, 2], [-0.4, -0.5, -0.6, -0.7], versions=[3, 3, 4, 4])
    return t


def test_versions_align_with_the_response_and_survive_json():
    t = _versioned()
    t.validate()
    assert t.response_versions == [3, 3, 3, -1, -1, -1, 3, 3, 4, 4]
    assert t.version_range == (3, 4) and t.summary()["versions"] == (3, 4)
    again = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again == t and again.response_versions == t.response_versions


def test_versions_are_unknown_for_the_whole_segment_once_one_generation_lacks_them():
    t = _versioned()
    t.add_context([198], role="user")
    t.add_generation([15, 2], [-0.1, -0.2])  # an engine that does not say (versions=None)
    t.add_context([198], role="user")
    t.add_generation([16, 2], [-0.1, -0.2], versions=[5, 5])
    t.validate()
    assert t.response_versions == [] and t.version_range is None
    assert Trajectory.from_dict(t.to_dict()).response_versions == []


def test_context_before_the_first_generation_gets_version_minus_one():
    t = Trajectory(prompt_ids=[1])
    t.add_context([7, 8], role="user")
    t.add_generation([9, 2], [-0.1, -0.2], versions=[0, 0])
    assert t.response_versions == [-1, -1, 0, 0] and t.version_range == (0, 0)
    assert Trajectory(prompt_ids=[1]).version_range is None


def test_an_old_record_without_versions_reads_as_unknown():
    d = _versioned().to_dict()
    del d["response_versions"]
    t = Trajectory.from_dict(d)
    assert t.response_versions == [] and t.version_range is None and not t.versions_known


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: d["response_versions"].pop(),  # one short: misaligned
        lambda d: d["response_versions"].__setitem__(3, 2),  # a context token with a version
        lambda d: d["response_versions"].__setitem__(0, -1),  # a model token without one
    ],
)
def test_version_invariants_are_enforced(corrupt):
    assert_rejected(_versioned(), corrupt)


def test_generation_needs_a_version_per_token():
    with pytest.raises(TrajectoryError):
        Trajectory(prompt_ids=[1]).add_generation([1, 2], [0.0, 0.0], versions=[0])
