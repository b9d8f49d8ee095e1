"""Learn how a chat template ends and joins turns, by diffing renders of probe conversations.

Nothing here knows a model family. We render a tiny conversation whose assistant content is a
unique marker; whatever the template writes right after the marker, up to the next message, is
the end of an assistant turn. Its first special token is the end-of-turn the model emits; the
rest is the turn boundary (ChatML's `\\n`, nothing for Llama 3) that the codec appends as context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from uniagent.errors import TemplateError
from uniagent.tokens.render import shape

ASSISTANT_MARKER = "UAPROBEASSISTANTMARKERQ"
USER_MARKER = "UAPROBEUSERMARKERQ"
NEXT_MARKER = "UAPROBENEXTMARKERQ"
SYSTEM_MARKER = "UAPROBESYSTEMMARKERQ"
TOOL_NAME = "uaprobefunctionq"
ARGUMENT_MARKER = "UAPROBEARGUMENTQ"


@dataclass(frozen=True)
class TemplateFacts:
    """What probing found out about one tokenizer + template."""

    prefix: tuple[tuple[tuple[str, str], ...], ...]  # probe conversation before the assistant marker
    eot_text: str  # text of the end-of-turn token(s) the model generates
    eot_ids: tuple[int, ...]
    final_eot_ids: tuple[int, ...]  # end of the last assistant turn, where it differs (gpt-oss)
    boundary_text: str  # template glue after the end-of-turn, before the next message
    generation_prompt: str
    renders_tool_calls: bool
    renders_tool_role: bool
    call_eot_ids: tuple[int, ...] = ()  # end of a turn that calls a tool, where it differs (gpt-oss)
    eot_inside_turn: bool = False  # the end-of-turn also ends a message inside one turn (gpt-oss)
    stateful: bool = False  # a message renders differently alone: continuations need the history

    def prefix_messages(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self.prefix]


def special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    ids.update(int(i) for i, tok in decoder.items() if getattr(tok, "special", True))
    return ids


PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "probe tool",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "integer", "description": "probe argument"}},
                "required": ["x"],
            },
        },
    }
]


def probe_template(render, encode, tokenizer: Any) -> TemplateFacts:
    """Probe `render(messages, tools, add_generation_prompt) -> str` of one template.

    Templates that cannot render without tools are probed with a probe tool list.
    """
    try:
        tools = None
        prefix = _find_prefix(render, tools)
    except TemplateError:
        tools = PROBE_TOOLS
        prefix = _find_prefix(render, tools)
    assistant = {"role": "assistant", "content": ASSISTANT_MARKER}

    def after_assistant(messages: list[dict[str, Any]]) -> str:
        text = render(messages, tools, False)
        return text[text.index(ASSISTANT_MARKER) + len(ASSISTANT_MARKER) :]

    last = after_assistant([*prefix, assistant])
    try:
        followed = after_assistant([*prefix, assistant, {"role": "user", "content": NEXT_MARKER}])
        followed = followed[: followed.index(NEXT_MARKER)]
    except (TemplateError, ValueError):
        followed = last
    eot_text, eot_ids, rest = _split_end_region(followed or last, encode, tokenizer)
    # The boundary is the glue both renders share after the end-of-turn; what differs is the
    # start of the next message (or an end-of-text the template adds at the very end).
    final_text, final_ids, _ = _split_end_region(last or followed, encode, tokenizer)
    tail = last[len(eot_text) :] if last.startswith(eot_text) else ""
    boundary = _common_token_prefix(encode, tokenizer, eot_text, rest, tail)

    with_gen = render(prefix, tools, True)
    without_gen = render(prefix, tools, False)
    shared = _common_token_prefix(encode, tokenizer, "", with_gen, without_gen)
    generation_prompt = with_gen[len(shared) :]

    return TemplateFacts(
        prefix=tuple(tuple(sorted(m.items())) for m in prefix),
        eot_text=eot_text,
        eot_ids=tuple(eot_ids),
        final_eot_ids=tuple(final_ids) if final_text != eot_text else (),
        boundary_text=boundary,
        generation_prompt=generation_prompt,
        renders_tool_calls=_renders_tool_calls(render, prefix, tools),
        renders_tool_role=_renders(
            render, [*prefix, assistant, {"role": "tool", "content": NEXT_MARKER}], tools
        ),
        call_eot_ids=_call_eot_ids(render, encode, tokenizer, prefix, tools, eot_ids),
        eot_inside_turn=_eot_inside_turn(render, prefix, tools, eot_text),
    )


def continuation_text(render, facts: TemplateFacts, new_messages: list[dict[str, Any]], tools) -> str:
    """What the template writes after an assistant turn's end-of-turn for `new_messages`, rendered
    after the probe conversation (so that the history is never rendered again): boundary, the new
    messages and the generation prompt. Exact for an append-only template only."""
    probe = [*facts.prefix_messages(), {"role": "assistant", "content": ASSISTANT_MARKER}, *new_messages]
    text = render(probe, tools, True)
    at = text.find(ASSISTANT_MARKER)
    if at < 0:
        raise TemplateError(
            f"the chat template dropped the previous assistant turn when rendering {shape(new_messages)}"
        )
    after = text[at + len(ASSISTANT_MARKER) :]
    if not after.startswith(facts.eot_text):
        raise TemplateError(
            "the chat template does not end the previous assistant turn with "
            f"{facts.eot_text!r} when followed by {shape(new_messages)}; got {after[:40]!r}"
        )
    return after[len(facts.eot_text) :]


def _find_prefix(render, tools) -> list[dict[str, str]]:
    """The smallest conversation the template accepts before an assistant turn."""
    candidates = [
        [{"role": "user", "content": USER_MARKER}],
        [{"role": "system", "content": SYSTEM_MARKER}, {"role": "user", "content": USER_MARKER}],
    ]
    errors = []
    for prefix in candidates:
        try:
            text = render([*prefix, {"role": "assistant", "content": ASSISTANT_MARKER}], tools, False)
        except TemplateError as exc:
            errors.append(str(exc))
            continue
        if ASSISTANT_MARKER in text and USER_MARKER in text:
            return prefix
    raise TemplateError(
        "the chat template cannot render a user turn followed by an assistant turn: " + "; ".join(errors)
    )


def _split_end_region(end_region: str, encode, tokenizer: Any) -> tuple[str, list[int], str]:
    """Split the text after an assistant message into (end-of-turn, boundary)."""
    if not end_region:
        raise TemplateError(
            "the chat template writes nothing after an assistant message, so the end of a turn "
            "cannot be told apart from its content; give the template an end-of-turn token"
        )
    ids = encode(end_region)
    special = special_ids(tokenizer)
    if ids and ids[0] in special:
        eot_ids = [ids[0]]
        eot_text = tokenizer.convert_ids_to_tokens(ids[0])
        if not end_region.startswith(eot_text):
            eot_text = tokenizer.decode([ids[0]], clean_up_tokenization_spaces=False)
        boundary = end_region[len(eot_text) :] if end_region.startswith(eot_text) else ""
        return eot_text, eot_ids, boundary
    # No special token: the whole end region is what the model must emit (rare; plain-text markers).
    return end_region, ids, ""


def _common_token_prefix(encode, tokenizer: Any, lead: str, a: str, b: str) -> str:
    """Longest common prefix of `a` and `b` cut at a token boundary (both encoded after `lead`)."""
    skip = len(encode(lead)) if lead else 0
    ids_a, ids_b = encode(lead + a)[skip:], encode(lead + b)[skip:]
    n = 0
    while n < min(len(ids_a), len(ids_b)) and ids_a[n] == ids_b[n]:
        n += 1
    return (
        tokenizer.decode(ids_a[:n], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if n
        else ""
    )


def _renders(render, messages: list[dict[str, Any]], tools) -> bool:
    try:
        return NEXT_MARKER in render(messages, tools, False)
    except TemplateError:
        return False


def tool_call_message(content: str = "", x: Any = 1) -> dict[str, Any]:
    """An assistant message calling the probe tool with argument `x`."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": "abcdefghi", "type": "function", "function": {"name": TOOL_NAME, "arguments": {"x": x}}}
        ],
    }


def _call_eot_ids(render, encode, tokenizer: Any, prefix, tools, eot_ids: list[int]) -> tuple[int, ...]:
    """The special token that ends a turn calling a tool, where it is not the plain end-of-turn
    (gpt-oss ends one with `<|call|>`, a final answer with `<|return|>`): the last special token
    the template writes after the call's argument both when the turn is last and when a tool
    result follows (what comes after it depends on the next message; the turn's end does not)."""
    message = tool_call_message(x=ARGUMENT_MARKER)
    try:
        alone = render([*prefix, message], tools, False)
        followed = render([*prefix, message, {"role": "tool", "content": NEXT_MARKER}], tools, False)
    except TemplateError:
        return ()
    at = alone.rfind(ARGUMENT_MARKER)
    if at < 0 or followed.rfind(ARGUMENT_MARKER) != at:
        return ()
    same = at
    while same < min(len(alone), len(followed)) and alone[same] == followed[same]:
        same += 1
    special = special_ids(tokenizer)
    found = [i for i in encode(alone[at + len(ARGUMENT_MARKER) : same]) if i in special]
    return (found[-1],) if found and found[-1] not in eot_ids else ()


def _eot_inside_turn(render, prefix, tools, eot_text: str) -> bool:
    """Whether the template writes the end-of-turn between the text of one assistant message and
    its tool call (gpt-oss ends the analysis message with `<|end|>`, then the call follows in the
    same turn): then it is no stop token for that template."""
    try:
        text = render([*prefix, tool_call_message(ASSISTANT_MARKER, ARGUMENT_MARKER)], tools, False)
    except TemplateError:
        return False
    at, call = text.find(ASSISTANT_MARKER), text.rfind(ARGUMENT_MARKER)
    return 0 <= at < call and eot_text in text[at + len(ASSISTANT_MARKER) : call]


def _renders_tool_calls(render, prefix, tools) -> bool:
    message = tool_call_message()
    try:
        return TOOL_NAME in render([*prefix, message], tools, False).replace(TOOL_NAME, "", 1 if tools else 0)
    except TemplateError:
        return False
