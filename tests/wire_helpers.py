"""Stand-ins for the wire-protocol tests (Anthropic Messages, OpenAI Responses): a finished turn,
the exchange it answers, and a stream of session events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

from uniagent.gateway.sessions import Turn
from uniagent.gateway.wire.base import Exchange, WireRequest
from uniagent.models.base import Generation
from uniagent.parsers import ToolCall


def _turn(
    prompt_tokens: int, content: str, calls: Sequence[ToolCall] = (), finish: str = "stop", n: int = 5
) -> Turn:
    """A turn of `n` generated tokens after a prompt of `prompt_tokens`."""
    gen = Generation([1] * n, [-0.1] * n, "stop")
    return Turn(content, content, list(calls), None, finish, gen, prompt_tokens, 0)


def _exchange(prompt_tokens: int) -> Exchange:
    return Exchange("uniagent", prompt_tokens, WireRequest([], None), lambda ids: "")


def wire_stand_ins(prompt_tokens: int, n: int) -> tuple[Any, Any]:
    """`turn(content, calls=(), finish="stop")` and `exchange()` for a module whose turns generate
    `n` tokens after a prompt of `prompt_tokens` (the numbers its usage assertions expect)."""
    return partial(_turn, prompt_tokens, n=n), partial(_exchange, prompt_tokens)


async def events(*items: tuple[str, Any]) -> AsyncIterator[tuple[str, Any]]:
    """The session's event stream, as given."""
    for item in items:
        yield item
