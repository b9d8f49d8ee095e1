"""What of a tool-calling model's text is safe to stream before the whole turn is parsed.

A front that streams a turn (the gateway's chat, Anthropic and Responses wires) shows text as it
is generated, but a tool call goes out as a structured call once the turn is parsed, never as raw
text. Each format names the text that opens a call (`markers` on the parser class); streamed text
stops at the first marker, and a partial marker at the end is held back until the next token says
whether it is one.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MARKERS = ("<tool_call>",)


def call_markers(parser: Any) -> tuple[str, ...]:
    """The texts that open a tool call in `parser`'s format (a parser plugin without `markers`
    gets the common `<tool_call>`)."""
    return tuple(getattr(parser, "markers", DEFAULT_MARKERS))


def visible_prefix(text: str, markers: tuple[str, ...]) -> tuple[str, bool]:
    """The prefix of `text` safe to stream: before any tool-call marker, without a partial marker
    or a partial UTF-8 character at its end. Also whether a marker was seen."""
    cut, seen = len(text), False
    for marker in markers:
        at = text.find(marker)
        if 0 <= at < cut:
            cut, seen = at, True
    visible = text[:cut]
    if not seen:
        for marker in markers:
            for k in range(min(len(marker) - 1, len(visible)), 0, -1):
                if visible.endswith(marker[:k]):
                    visible = visible[:-k]
                    break
    while visible.endswith("\ufffd"):
        visible = visible[:-1]
    return visible, seen
