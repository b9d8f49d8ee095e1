"""What the model reads after its tools ran."""

from __future__ import annotations

from typing import Any

from uniagent.parsers.base import ToolCall
from uniagent.sandbox.output import clip_text

EMPTY = "(the command produced no output)"

NO_TOOL_CALL = (
    "Your last reply did not call any tool. Every reply must contain exactly one tool call in the "
    "format described above. Call `submit` (or `finish`) when you are done."
)


def tool_message(call: ToolCall, text: str, limit: int) -> dict[str, Any]:
    body = text if text.strip() else EMPTY
    body, _ = clip_text(body, limit)
    msg: dict[str, Any] = {"role": "tool", "name": call.name, "content": body}
    if call.id:
        msg["tool_call_id"] = call.id
    return msg


def format_error_message(error: str | None) -> dict[str, Any]:
    if not error:
        return {"role": "user", "content": NO_TOOL_CALL}
    return {"role": "user", "content": f"Your last reply could not be used: {error}\nPlease try again."}
