"""Is a chat template append-only, stateful or rewriting? Found once per template, by renders.

- **append_only**: each message renders the same alone (after any assistant turn) as after the
  real history, and the render of a history is a prefix of the render with more messages. The
  codec renders only the new messages of a turn (its fast path).
- **stateful**: renders of a history are prefixes of longer ones, but a message renders
  differently alone than after the real history (DeepSeek-V3 opens its tool outputs once per
  conversation; gpt-oss names a tool result after the latest call). The codec renders the whole
  conversation for a continuation and appends what follows the tokens it already holds.
- **rewriting**: the template shows an earlier turn differently once more messages follow (Qwen3
  drops the empty reasoning of past turns, gpt-oss their analysis once a final answer exists). No
  running sequence can equal every full render; drift of kind `template` or, with
  `follow_template`, a new segment, as `tokens/drift.py` and `tokens/conversation.py` describe.

- **refused**: no multi-turn conversation renders (or, for `classify_template`, not even the
  one-turn probe): the codec refuses with a `TemplateError`.

A template may be both stateful and rewriting (gpt-oss): its kind says `rewriting`, and the codec's
`facts.stateful` still makes its continuations exact up to where the template rewrites.

One classifier: the codec runs `classify` once when it probes a template (`ChatCodec.kind`), and
`uniagent tokens check` reports the same `classify_template`, so the two always agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from uniagent.errors import TemplateError
from uniagent.tokens.chunked import chunked_encoder, plain_encoder
from uniagent.tokens.probe import (
    NEXT_MARKER,
    PROBE_TOOLS,
    TemplateFacts,
    continuation_text,
    probe_template,
    tool_call_message,
)
from uniagent.tokens.render import template_renderer

Kind = Literal["append_only", "stateful", "rewriting", "refused"]


@dataclass(frozen=True)
class TemplateKind:
    """A template's kind, the render that showed it, and what the codec does about it.

    `conversation` is the probe conversation that decided it ("tools", or "plain" for templates
    that cannot render tools); `at_message` the first message of it whose render departs (None:
    append-only, or refused before any message); `stateful` whether continuations need the history
    (also for a rewriting template, gpt-oss)."""

    kind: Kind
    evidence: str
    conversation: str = ""
    at_message: int | None = None
    stateful: bool = False

    @property
    def action(self) -> str:
        """What the codec does: appends continuations rendered alone (fast path); renders the
        continuation with its history (re-render); keeps the model's tokens where the template
        rewrites them, drift of kind `template` or a new segment with `follow_template`; refuses
        with a TemplateError."""
        if self.kind == "rewriting":
            how = "re-render" if self.stateful else "fast path"
            return f"{how}, drift 'template' or a new segment"
        return {"append_only": "fast path", "stateful": "re-render", "refused": "refuse"}[self.kind]


def _probe_conversations(facts: TemplateFacts) -> list[tuple[str, list[dict[str, Any]]]]:
    """Tool-using first (two calls and results, then a plain exchange), then plain turns only
    (for templates that cannot render tools); each assistant content a distinct marker."""
    prefix = facts.prefix_messages()

    def said(i: int) -> str:
        return f"UAPROBESTEP{i}Q"

    tool_using = [
        *prefix,
        tool_call_message(said(1)),
        {"role": "tool", "content": NEXT_MARKER + "1"},
        tool_call_message(said(2)),
        {"role": "tool", "content": NEXT_MARKER + "2"},
        {"role": "assistant", "content": said(3)},
        {"role": "user", "content": NEXT_MARKER + "3"},
        {"role": "assistant", "content": said(4)},
    ]
    plain = [
        *prefix,
        {"role": "assistant", "content": said(1)},
        {"role": "user", "content": NEXT_MARKER + "1"},
        {"role": "assistant", "content": said(2)},
        {"role": "user", "content": NEXT_MARKER + "2"},
        {"role": "assistant", "content": said(3)},
    ]
    return [("tools", tool_using), ("plain", plain)]


def classify(render, facts: TemplateFacts) -> TemplateKind:
    """The kind of the template behind `render(messages, tools, add_generation_prompt)`."""
    refusals = []
    for name, conversation in _probe_conversations(facts):
        what = "a tool-using conversation" if name == "tools" else "a plain conversation"
        for tools in (PROBE_TOOLS, None):
            try:
                full = render(conversation, tools, False)
            except TemplateError as exc:
                refusals.append(f"{name}{'' if tools else ' without tools'}: {exc}")
                continue
            rewrites, at = _rewrites(render, conversation, tools, full)
            needs_history, at_new = _needs_history(render, facts, conversation, tools)
            if rewrites:
                evidence = f"on {what}, {rewrites}" + (f"; and {needs_history}" if needs_history else "")
                return TemplateKind("rewriting", evidence, name, at, bool(needs_history))
            if needs_history:
                return TemplateKind("stateful", f"on {what}, {needs_history}", name, at_new, True)
            return TemplateKind("append_only", f"on {what}, every render extends the previous one", name)
    return TemplateKind("refused", "no multi-turn conversation renders: " + "; ".join(refusals))


def _rewrites(render, conversation: list[dict[str, Any]], tools, full: str) -> tuple[str, int | None]:
    """Why and at which message an earlier turn renders differently once more messages follow."""
    for i, message in enumerate(conversation):
        if message["role"] != "assistant" or i == 0:
            continue
        seen = render(conversation[:i], tools, True)
        if not full.startswith(seen):
            return f"the prompt before the assistant message at {i} is not a prefix of the full render", i
        made = render(conversation[: i + 1], tools, False)
        content = message["content"]
        at = made.find(content, len(seen) - 1 if seen else 0)
        if at >= 0 and not full.startswith(made[: at + len(content)]):
            return f"the assistant message at {i} renders differently once later messages follow", i
    return "", None


def _needs_history(
    render, facts: TemplateFacts, conversation: list[dict[str, Any]], tools
) -> tuple[str, int | None]:
    """Why and from which message the messages after an assistant turn render differently alone
    than after the history."""
    i = 0
    while i < len(conversation):
        j = i + 1
        if conversation[i]["role"] == "assistant":
            while j < len(conversation) and conversation[j]["role"] != "assistant":
                j += 1
            if i + 1 < j:
                new = conversation[i + 1 : j]
                what = f"the {'/'.join(m['role'] for m in new)} message after the assistant message at {i}"
                try:
                    alone = continuation_text(render, facts, new, tools)
                except TemplateError as exc:
                    return f"{what} cannot render alone ({exc})", i + 1
                if not render(conversation[:j], tools, True).endswith(alone):
                    return f"{what} renders differently after the history", i + 1
        i = j
    return "", None


def classify_template(
    tokenizer: Any, template: str | None = None, template_kwargs: dict[str, Any] | None = None
) -> TemplateKind:
    """The kind of `template` (default: the tokenizer's own) on `tokenizer`, as `ChatCodec.kind`
    finds it; a template that cannot be probed at all (it raises on a one-turn chat) is `refused`.
    What `uniagent tokens check` reports."""
    template = template or getattr(tokenizer, "chat_template", None)
    if not template or not isinstance(template, str):
        raise TemplateError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template")
    render = template_renderer(tokenizer, template, dict(template_kwargs or {}))
    encode = chunked_encoder(tokenizer) or plain_encoder(tokenizer)
    try:
        facts = probe_template(render, encode, tokenizer)
    except TemplateError as exc:
        return TemplateKind("refused", str(exc))
    return classify(render, facts)
