"""The gateway's wire protocols, one module each. `WIRES` is a `uniagent.registry.Registry` like
every extension table: a protocol is its module (one `Wire` subclass, see wire/base.py) plus one
line below, keyed by the class's `name`; the app serves every line."""

from __future__ import annotations

from uniagent.gateway.wire.base import Event, Exchange, Wire, WireRequest
from uniagent.registry import Entry, Registry

# One line per protocol; the first one answers paths no protocol owns (the session API).
WIRES = Registry(
    "wire protocol",
    {
        "openai-chat": Entry("uniagent.gateway.wire.openai_chat:OpenAIChat", "/v1/chat/completions"),
        "anthropic": Entry("uniagent.gateway.wire.anthropic:AnthropicMessages", "/v1/messages"),
        "openai-responses": Entry("uniagent.gateway.wire.responses:OpenAIResponses", "/v1/responses"),
    },
)

PROTOCOLS: list[Wire] = [WIRES.load(name)() for name in WIRES]
"""One instance of every registered protocol (wires are pure, so one serves every session)."""


def wire_for(path: str) -> Wire:
    """The protocol a request path belongs to (its errors are written in that protocol's shape);
    OpenAI chat's for everything else (the session API)."""
    for wire in PROTOCOLS:
        if wire.owns(path):
            return wire
    return PROTOCOLS[0]


__all__ = ["PROTOCOLS", "WIRES", "Event", "Exchange", "Wire", "WireRequest", "wire_for"]
