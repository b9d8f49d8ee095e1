"""Is a chat template append-only, stateful or rewriting? Found by rendering growing conversations.

Why: the codec appends each turn's continuation, rendered alone after a probe assistant turn, and
never re-renders the history. That is exact only for an append-only template: each full render
is a token prefix of the next, and a message renders the same whatever came before it. Two ways
to break it, which need different remedies:

- stateful: the history stays put, but a new message renders by what came before it (DeepSeek-V3
  opens its tool-outputs block only for the first tool result of the conversation), so the
  continuation rendered alone differs from the full render's new tokens; the remedy is to render
  the continuation in context (re-render).
- rewriting: a later render changes earlier turns (Qwen3 drops past reasoning and the last turn's
  think block, gpt-oss ends history turns with `<|end|>` where the last one had `<|return|>`);
  the model's own tokens are kept as generated and drift reports `template`.

Pure function of (tokenizer, template): the codec and `uniagent tokens check` share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from uniagent.errors import TemplateError

Messages = list[dict[str, Any]]

APPEND_ONLY, STATEFUL, REWRITING, REFUSED = "append-only", "stateful", "rewriting", "refused"
ACTIONS = {
    APPEND_ONLY: "fast path",
    STATEFUL: "re-render",
    REWRITING: "fast path, drift 'template'",
    REFUSED: "refuse",
}
"""What the codec does for each kind: append continuations (fast path); render the continuation
with its history (re-render); keep the model's tokens and report the template's departure as
drift of kind `template`; refuse with a TemplateError."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command"}},
                "required": ["command"],
            },
        },
    }
]


@dataclass(frozen=True)
class TemplateKind:
    """How a template renders a growing conversation, and what the codec does about it."""

    kind: str  # APPEND_ONLY | STATEFUL | REWRITING | REFUSED
    conversation: str  # the probe conversation that decided it: "tools" or "plain"
    at_message: int | None  # first message whose render departs (None: append-only)
    reason: str  # one line: where and how it departs, or why the template was refused

    @property
    def action(self) -> str:
        return ACTIONS[self.kind]


def tool_conversation(turns: int = 3) -> Messages:
    """system, user, then `turns` x (assistant with a tool call, tool result), final answer."""
    msgs: Messages = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix the failing test in repo/ please."},
    ]
    for i in range(turns):
        call_id = f"call{i:05d}"
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": "bash", "arguments": {"command": f"ls d{i}"}},
        }
        msgs.append({"role": "assistant", "content": f"Step {i}: look around.", "tool_calls": [call]})
        msgs.append({"role": "tool", "content": f"file_{i}.py\nREADME.md", "tool_call_id": call_id})
    msgs.append({"role": "assistant", "content": "Done: the bug is fixed."})
    return msgs


def plain_conversation(turns: int = 3) -> Messages:
    """user / assistant alternating: what every chat template renders."""
    msgs: Messages = []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: what is in d{i}?"})
        msgs.append({"role": "assistant", "content": f"Answer {i}: two files."})
    return msgs


def classify_template(tokenizer: Any, template: str | None = None) -> TemplateKind:
    """Classify `template` (default: the tokenizer's own) on `tokenizer`'s vocabulary.

    Renders a tool-using conversation one message at a time (a plain one where the template
    cannot render tools) and compares each full render with the previous one and with the
    codec's continuation.
    """
    from uniagent.tokens.codec import ChatCodec  # the codec may use this module: import late

    try:
        codec = ChatCodec(tokenizer, chat_template=template)
    except TemplateError as exc:
        return TemplateKind(REFUSED, "plain", None, str(exc))
    refusals = []
    for name, msgs, tools in (("tools", tool_conversation(), TOOLS), ("plain", plain_conversation(), None)):
        try:
            codec.render(msgs, tools, add_generation_prompt=False)
        except TemplateError as exc:
            refusals.append(f"{name}: {exc}")
            continue
        return _walk(codec, name, msgs, tools)
    return TemplateKind(REFUSED, "plain", None, "; ".join(refusals))


def _walk(codec: Any, name: str, msgs: Messages, tools: Any) -> TemplateKind:
    """Run the conversation as the codec does, the model emitting what the template renders."""
    stops = set(codec.stop_token_ids)

    def full(upto: int) -> list[int]:
        gen_prompt = upto < len(msgs) and msgs[upto]["role"] == "assistant"
        return codec.encode(codec.render(msgs[:upto], tools, add_generation_prompt=gen_prompt))

    def departs(at: int, how: str) -> TemplateKind:
        message = msgs[at]
        role = message["role"] + ("+tool_calls" if message.get("tool_calls") else "")
        kind = STATEFUL if how.startswith("continuation") else REWRITING
        return TemplateKind(kind, name, at, f"message {at} ({role}): {how}")

    first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    running = codec.prompt_ids(msgs[:first], tools)
    i = first
    while i < len(msgs):
        rendered = full(i + 1)
        if rendered[: len(running)] != running:
            return departs(i, "the render with this turn changes earlier tokens")
        rest = rendered[len(running) :]
        end = next((k + 1 for k, tok in enumerate(rest) if tok in stops), len(rest))
        running = running + rest[:end]  # the model's turn, as the template renders it
        j = i + 1
        while j < len(msgs) and msgs[j]["role"] != "assistant":
            j += 1
        if j == i + 1:
            i = j
            continue
        reference = full(j)
        if reference[: len(running)] != running:
            return departs(i, "the render after it changes how this turn ends or earlier tokens")
        try:
            continuation = codec.continuation_ids(msgs[i + 1 : j], tools)
        except TemplateError as exc:
            return TemplateKind(REFUSED, name, i + 1, str(exc))
        expected = reference[len(running) :]
        if continuation != expected:
            text = codec.decode(expected)[:60]
            return departs(i + 1, f"continuation rendered alone differs from the full render {text!r}")
        running = running + continuation
        i = j
    return TemplateKind(APPEND_ONLY, name, None, "every render is a token prefix of the next")
