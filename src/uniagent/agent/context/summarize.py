"""`summarize`: the policy model condenses the earlier turns into a summary, then window's cut
(the task, the summary as the note, the latest `keep_turns` turns).

Who writes the summary, and whether it is trained:
- by default the policy model itself, asked in the same token segment: the request (a user
  message) extends the segment and the summary is generated there, exactly like a turn. Those
  tokens are the policy's own action, seen under the exact context it summarizes, so they are
  trained (mask 1, in the segment that ends with them) with the episode's advantage. The request
  and the summary are kept in the episode's messages, before the compression marker.
- a `summarizer` ChatModel given to the loop (another model) summarizes a plain-text transcript
  instead; its tokens belong to no segment of the episode and are not trained
  (`summary_tokens_untrained` counts them).
When the segment has no room left for a summary (fewer than `MIN_SUMMARY_TOKENS`), the policy
drops the turns with window's note instead (`summaries_skipped`)."""

from __future__ import annotations

import json
from typing import Any

from uniagent.agent.config import ContextConfig
from uniagent.agent.context.base import Condensed, Messages, Request, cut, note_message

MIN_SUMMARY_TOKENS = 16

SUMMARY_REQUEST = (
    "The conversation is getting too long. Write a short summary of the work so far for yourself: "
    "what you found, what you changed, what is left to do. Plain text, no tool calls."
)
SUMMARIZER_SYSTEM = (
    "You condense an agent's working conversation. Write a short plain-text summary of what the "
    "agent found, what it changed and what is left to do, so that it can continue from the summary."
)


class SummarizePolicy:
    name = "summarize"

    def __init__(self, config: ContextConfig) -> None:
        self.config = config

    async def condense(self, request: Request) -> Condensed | None:
        if cut(request, 0, lambda dropped, kept: "") is None:
            return None  # the task alone does not fit: no summary can help
        summary, transcript, metrics = await self._summary(request)
        out = None
        if summary is not None:
            out = cut(request, self.config.keep_turns, lambda d, k: _summary_note(summary, d, k))
        if out is None:  # no room to summarize, or the summary itself does not fit
            metrics["summaries_skipped"] = 1
            out = cut(request, self.config.keep_turns, _dropped_note)
        if out is not None:
            out.transcript, out.metrics = transcript, metrics
        return out

    async def _summary(self, request: Request) -> tuple[str | None, Messages, dict[str, int]]:
        if request.summarizer is not None:
            ask = [
                {"role": "system", "content": SUMMARIZER_SYSTEM},
                {"role": "user", "content": transcript_text(request.history)},
            ]
            turn = await request.summarizer.query(ask, None, max_tokens=self.config.summary_max_tokens)
            return turn.text.strip(), [], {"summary_tokens_untrained": turn.completion_tokens}
        model, ask_message = request.model, note_message(SUMMARY_REQUEST)
        ask = [*request.history, ask_message]
        budget = self.config.summary_max_tokens
        if request.room is not None:  # the request and the summary extend the current segment
            budget = min(
                budget, request.room - (model.count_tokens(ask, request.tools) - model.context_tokens)
            )
        if budget < MIN_SUMMARY_TOKENS:
            return None, [], {}
        turn = await model.query(ask, request.tools, max_tokens=budget)
        return turn.text.strip(), [ask_message, turn.message], {"summary_tokens": turn.completion_tokens}


def _summary_note(summary: str, dropped: int, kept: int) -> str:
    return (
        f"[Context note: {dropped} earlier turn{'s' * (dropped != 1)} were condensed to fit the context "
        f"window; the latest {kept} turn{'s' * (kept != 1)} follow. Your summary of the work so far:]\n"
        f"{summary or '(empty)'}"
    )


def _dropped_note(dropped: int, kept: int) -> str:
    return (
        f"[Context note: {dropped} earlier turn{'s' * (dropped != 1)} were removed to fit the context "
        f"window (no room was left to summarize them); the latest {kept} turn{'s' * (kept != 1)} follow.]"
    )


def transcript_text(messages: Messages) -> str:
    """A history as plain text for another model to summarize (tool calls as JSON)."""
    lines = []
    for m in messages:
        body = str(m.get("content") or "")
        calls: Any = m.get("tool_calls")
        if calls:
            body += "\n" + json.dumps([c.get("function", c) for c in calls])
        lines.append(f"{m.get('role', '?').upper()}: {body}")
    return "\n\n".join(lines)
