"""Chat template <-> token ids, masks, segments and drift checks. Depends on nothing else of ours."""

from uniagent.tokens.codec import ChatCodec
from uniagent.tokens.conversation import Plan, Reply, Segment, TokenConversation
from uniagent.tokens.trajectory import Trajectory, TurnSpan

__all__ = ["ChatCodec", "Plan", "Reply", "Segment", "TokenConversation", "Trajectory", "TurnSpan"]
