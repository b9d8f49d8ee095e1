"""What a context policy is: given the history the model sees, return a shorter one, or None.

The loop (agent/loop.py) asks its policy to condense when the current token segment reaches the
compression threshold (`AgentConfig.compress_threshold`). A policy keeps the task's own messages
(system and task, `Request.head`) untouched, drops or condenses whole *turns* (an assistant
message and the tool results or notes after it, so a tool call never loses its result), puts one
note message after the task saying what happened, and sizes the result with the model's
`count_tokens`. It returns None when even the task and the note alone do not fit under the
threshold: the loop then ends the episode `context_limit`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from uniagent.models.base import ChatModel

Messages = list[dict[str, Any]]


@dataclass
class Request:
    """The loop's state when the context is too full."""

    history: Messages  # what the model sees now (a copy: a policy may not change the loop's list)
    head: int  # history[:head] is the task (system + task messages), always kept
    noted: bool  # history[head] is the note of an earlier compression (replaced, never stacked)
    model: ChatModel  # the policy model: count_tokens sizes a history; summarize may query it
    tools: list[dict[str, Any]] | None  # the tool specs the loop passes with every query
    target: int  # a condensed history must render to fewer tokens than this
    room: int | None  # tokens the current segment may still grow by (None: no cap)
    summarizer: ChatModel | None = None  # summarize: another model instead of the policy model


@dataclass
class Condensed:
    """A policy's answer: the history the model sees from now on and what the record keeps."""

    history: Messages  # head + note + kept turns
    note: str  # the note's text (also stored in the episode's marker)
    dropped_turns: int
    tokens: int  # count_tokens(history, tools): the new segment's prompt
    transcript: Messages = field(default_factory=list)  # messages the policy added (summary request, reply)
    metrics: dict[str, int] = field(default_factory=dict)  # counters, summed over the episode


class ContextPolicy(Protocol):
    """One instance per episode (a policy may count across its compressions)."""

    name: str

    async def condense(self, request: Request) -> Condensed | None: ...


def split_turns(body: Messages) -> list[Messages]:
    """The messages after the task as turns: each starts at an assistant message. Anything before
    the first assistant message belongs to the first turn (it is dropped or kept with it)."""
    turns: list[Messages] = []
    for message in body:
        if message.get("role") == "assistant" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def note_message(text: str) -> dict[str, Any]:
    """The note is a user message: every chat template renders one after the task."""
    return {"role": "user", "content": text}


def cut(request: Request, keep_turns: int, note: Callable[[int, int], str]) -> Condensed | None:
    """Keep the task, a note and as many of the latest `keep_turns` turns as fit under the target,
    dropping at least one turn; None when nothing can be dropped or the task and note alone do not
    fit. `note(dropped, kept)` words the note for that cut."""
    head = request.history[: request.head]
    body = request.history[request.head + (1 if request.noted else 0) :]
    turns = split_turns(body)
    for kept in range(min(keep_turns, len(turns) - 1), -1, -1):
        dropped = len(turns) - kept
        text = note(dropped, kept)
        history = [*head, note_message(text), *(m for t in turns[dropped:] for m in t)]
        tokens = request.model.count_tokens(history, request.tools)
        if tokens < request.target:
            return Condensed(history, text, dropped, tokens)
    return None
