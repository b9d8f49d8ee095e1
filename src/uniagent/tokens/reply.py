"""A model's reply text -> the assistant message its chat template renders back to those tokens.

Some templates make the model write more than the answer: Qwen3's own opens every turn with a think
block (`<think>\\n...\\n</think>\\n\\n`), gpt-oss a channel header (`<|channel|>final<|message|>`,
after an optional `<|channel|>analysis<|message|>...<|end|><|start|>assistant`). Handing that text
back as the message's `content` is wrong twice: a client shows the header to its user, and the
template renders the content inside its own header again (gpt-oss refuses a content with channel
tags outright). The template itself says where each part goes: probed once per template, the
answer sits after a fixed head, and the reasoning (in whichever field the template reads:
`reasoning_content`, `thinking`, `reasoning`) between an opening and a closing text. Templates
without either keep the text as the content, unchanged.

One splitter for the ReAct loop's `TokenChatModel` and the gateway's sessions, so both hand the
same message back to the template and the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from uniagent.errors import TemplateError
from uniagent.tokens.probe import PROBE_TOOLS

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_ANSWER = "UAREPLYANSWERZ"
_THOUGHT = "UAREPLYTHOUGHTZ"


@dataclass(frozen=True)
class ReplyFormat:
    """Where a template puts a turn's answer and reasoning, relative to its generation prompt.

    `head`: what precedes the answer in a turn without reasoning ("" for most templates);
    `field`: the message field the template reads reasoning from ("" if none renders);
    `opens`/`closes`: the text around the reasoning in a turn with it (`closes` ends right before
    the answer)."""

    head: str = ""
    field: str = ""
    opens: str = ""
    closes: str = ""

    def split(self, text: str) -> tuple[str, str | None]:
        """(answer, reasoning or None) of a reply's decoded text, end-of-turn already cut.

        A reply that does not follow the template's shape (a model that skipped its header) keeps
        its whole text as the answer: nothing is dropped."""
        if self.field and self.opens and text.startswith(self.opens):
            at = text.find(self.closes, len(self.opens)) if self.closes else -1
            if at >= 0:  # an empty think block is no reasoning (the template renders both alike)
                return text[at + len(self.closes) :], text[len(self.opens) : at] or None
        if self.head and text.startswith(self.head):
            return text[len(self.head) :], None
        return text, None

    def answer_so_far(self, text: str) -> str:
        """The answer in a reply still being generated: nothing while the text may still become
        the template's header or is inside its reasoning (streamed text never shows either)."""
        if self.field and self.opens and text.startswith(self.opens):
            at = text.find(self.closes, len(self.opens)) if self.closes else -1
            return text[at + len(self.closes) :] if at >= 0 else ""
        if self.head and text.startswith(self.head):
            return text[len(self.head) :]
        if any(part.startswith(text) for part in (self.head, self.opens) if part):
            return ""
        return text

    def message(self, text: str) -> dict[str, Any]:
        """The assistant message for a reply: its answer as `content`, its reasoning (when the
        model wrote any and the template renders it) in the template's own field."""
        answer, reasoning = self.split(text)
        message: dict[str, Any] = {"role": "assistant", "content": answer}
        if reasoning is not None:
            message[self.field] = reasoning
        return message


def probe_reply_format(render, prefix: list[dict[str, Any]]) -> ReplyFormat:
    """Render the probe conversation's last turn with an answer (and with reasoning in each field
    templates use) and read off the texts around them; a template that renders neither around
    the answer gives the empty format (the text is the answer)."""
    try:
        render(prefix, None, True)
        tools = None
    except TemplateError:  # templates that cannot render without tools (as probe.py finds)
        tools = PROBE_TOOLS
    try:
        prompt = render(prefix, tools, True)

        def turn(**fields: str) -> str:
            full = render([*prefix, {"role": "assistant", "content": _ANSWER, **fields}], tools, False)
            return full[len(prompt) :] if full.startswith(prompt) else ""

        plain = turn()
    except TemplateError:
        return ReplyFormat()
    head = plain[: plain.find(_ANSWER)] if _ANSWER in plain else ""
    for field in REASONING_FIELDS:
        try:
            said = turn(**{field: _THOUGHT})
        except TemplateError:
            continue
        at, answer = said.find(_THOUGHT), said.find(_ANSWER)
        if 0 <= at < answer:
            return ReplyFormat(head, field, said[:at], said[at + len(_THOUGHT) : answer])
    return ReplyFormat(head)
