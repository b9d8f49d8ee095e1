"""Small text helpers shared by the tool-call formats."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

SNIPPET = 80


def snippet(text: str) -> str:
    """A short quoted excerpt of model output for error messages (the model reads these)."""
    text = text.strip()
    return repr(text if len(text) <= SNIPPET else text[:SNIPPET] + "…")


def skip_ws(text: str, pos: int) -> int:
    """Index of the first non-whitespace character at or after `pos`."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


NO_TOOLS = "# Tools\n\nNo tools are available. Answer directly, without any tool call."


def tools_header(specs: Iterable[Any]) -> str:
    """The tool listing every format's instructions start with (JSON schemas in <tools> tags)."""
    listing = "\n".join(json.dumps(s.to_openai(), ensure_ascii=False) for s in specs)
    return (
        "# Tools\n\n"
        "You may call one or more tools to help with the user's request. "
        "The tools are described by these JSON schemas:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
    )
