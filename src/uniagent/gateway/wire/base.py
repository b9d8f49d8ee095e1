"""What every wire protocol of the gateway is: request body in, response (JSON or SSE) out.

A wire turns a client's body into cleaned chat messages, OpenAI-style tool schemas and the
sampling fields the client asked for (`WireRequest`); the app does the rest the same way for
every protocol (the session's token conversation, trusted sampling, the context cap, the engine)
and hands back one committed `Turn`, or a stream of `Event`s, for the wire to write in its own
shape. So a protocol is one module with one `Wire` subclass plus one line in `wire.WIRES`.

Wires are pure: no session, engine or app state, so they are unit-tested on plain dicts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from uniagent.gateway.sessions import GatewayError, Turn
from uniagent.parsers.base import ToolSchemaError, normalize_tools

Event = tuple[str, Any]
"""A streamed turn: ("text", visible text delta) ... then ("done", Turn) or ("error", GatewayError)."""


@dataclass
class WireRequest:
    """A request in the gateway's own terms."""

    messages: list[dict[str, Any]]  # cleaned chat messages (`sessions.clean_message`)
    tools: list[dict[str, Any]] | None  # OpenAI chat tool schemas, or None
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams names the client set
    stream: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # the wire's own (logprobs, usage chunk)


@dataclass
class Exchange:
    """What a wire needs besides the turn to write its answer."""

    model: str
    prompt_tokens: int
    request: WireRequest
    decode: Callable[[list[int]], str]


class Wire:
    """One protocol. `path` is its route under `/sessions/{id}`; `count_path` (optional) answers
    a token count of a request without generating."""

    name = ""
    path = ""
    count_path: str | None = None
    # Clients of this protocol send a huge max_tokens by default (Claude Code 32000-64000): even
    # where the session lets the client set it, it never goes above the session's own.
    clamp_max_tokens = False

    def parse(self, body: dict[str, Any]) -> WireRequest:
        raise NotImplementedError

    def response(self, turn: Turn, ex: Exchange) -> dict[str, Any]:
        raise NotImplementedError

    def stream(self, events: AsyncIterator[Event], ex: Exchange) -> AsyncIterator[bytes]:
        raise NotImplementedError

    def error(self, exc: GatewayError) -> dict[str, Any]:
        """The error body (OpenAI's shape unless the protocol has its own)."""
        return {"error": {"message": str(exc), "type": exc.kind, "param": None, "code": exc.code}}

    def count(self, tokens: int) -> dict[str, Any]:
        raise NotImplementedError

    def owns(self, path: str) -> bool:
        """Whether a request path belongs to this protocol (its errors use this wire's shape)."""
        return any(p and (path.endswith(p) or f"{p}/" in path) for p in (self.path, self.count_path))


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    """One server-sent event (named when the protocol names its events)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def checked_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """OpenAI chat tool schemas as the parsers will read them; a malformed one is the client's error."""
    try:
        normalize_tools(tools)
    except ToolSchemaError as exc:
        raise GatewayError(str(exc)) from None
    return tools or None


def converted_tools(
    tools: Any, convert: Callable[[Any, str], list[dict[str, Any]]]
) -> list[dict[str, Any]] | None:
    """A protocol's `tools` list as OpenAI chat schemas, checked (`checked_tools`).

    `convert(tool, "tools[i]")` turns one entry into the schemas it stands for: none for a tool
    that runs at the vendor (a hosted search), several for a group. The list checks around it are
    the same in every protocol, so they live here once."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise GatewayError("'tools' must be a list of tools")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        out += convert(tool, f"tools[{i}]")
    return checked_tools(out)


def flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise GatewayError(f"'{name}' must be true or false")
    return value


def text_of(parts: Any, where: str, kinds: tuple[str, ...]) -> str:
    """Text content given as a string or as a list of text parts of the given `kinds`."""
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise GatewayError(f"{where} must be a string or a list of content parts")
    out = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise GatewayError(
                f"{where}[{i}] is of type {kind!r}; the gateway takes text only ({', '.join(kinds)})"
            )
        out.append(str(part.get("text", "")))
    return "".join(out)
