"""The gateway's wire protocols, one module each; a protocol is its module plus one line here."""

from __future__ import annotations

from uniagent.gateway.wire.anthropic import AnthropicMessages
from uniagent.gateway.wire.base import Event, Exchange, Wire, WireRequest
from uniagent.gateway.wire.openai_chat import OpenAIChat
from uniagent.gateway.wire.responses import OpenAIResponses

PROTOCOLS: list[Wire] = [
    OpenAIChat(),
    AnthropicMessages(),
    OpenAIResponses(),
]


def wire_for(path: str) -> Wire:
    """The protocol a request path belongs to (its errors are written in that protocol's shape);
    OpenAI chat's for everything else (the session API)."""
    for wire in PROTOCOLS:
        if wire.owns(path):
            return wire
    return PROTOCOLS[0]


__all__ = ["PROTOCOLS", "Event", "Exchange", "Wire", "WireRequest", "wire_for"]
