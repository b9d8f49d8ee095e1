"""Chat template <-> token ids, masks and drift checks. Depends on nothing else of ours."""

from uniagent.tokens.codec import ChatCodec
from uniagent.tokens.trajectory import Trajectory, TurnSpan

__all__ = ["ChatCodec", "Trajectory", "TurnSpan"]
