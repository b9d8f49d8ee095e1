"""One call that renders a chat template, shared by the codec and the template classifier.

Why a module of its own: `ChatCodec` and `template_kind.classify_template` both render templates,
and the classifier must not import the codec (the codec classifies its template when probing).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from uniagent.errors import TemplateError

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None
Render = Callable[[Messages, Tools, bool], str]

_ARGUMENTS = '{"x": "UAPROBEARGUMENT"}'


def shape(messages: Messages) -> str:
    """`system -> user -> assistant+tool_calls`: a conversation's roles, for error messages."""
    parts = []
    for m in messages:
        role = m.get("role", "?")
        parts.append(f"{role}+tool_calls" if m.get("tool_calls") else role)
    return " -> ".join(parts) or "(empty)"


def render_chat(
    tokenizer: Any,
    chat_template: str,
    template_kwargs: dict[str, Any],
    messages: Messages,
    tools: Tools = None,
    add_generation_prompt: bool = True,
) -> str:
    """The template's own text for `messages`; template failures become `TemplateError`."""
    try:
        return tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **template_kwargs,
        )
    except TemplateError:
        raise
    except Exception as exc:  # jinja raises many types; all mean "cannot render this"
        raise TemplateError(
            f"the chat template cannot render messages shaped {shape(messages)}"
            f"{' with tools' if tools else ''}: {type(exc).__name__}: {exc}"
        ) from exc


def wants_mapping_arguments(tokenizer: Any, chat_template: str, template_kwargs: dict[str, Any]) -> bool:
    """Whether the template wants a tool call's `arguments` as a mapping, not the OpenAI-format JSON
    string messages carry: it writes them `| tojson` (Qwen2.5, Llama 3.1, gpt-oss), which turns a
    string into a JSON string literal the model never generated, or it iterates them (Qwen3-Coder)."""

    def probe(arguments: Any) -> str:
        call = {
            "id": "call00000",
            "type": "function",
            "function": {"name": "probe_tool", "arguments": arguments},
        }
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        return render_chat(tokenizer, chat_template, template_kwargs, messages, None, False)

    try:
        if "UAPROBEARGUMENT" not in probe(json.loads(_ARGUMENTS)):
            return False  # no tool calls rendered from a mapping either
    except TemplateError:
        return False
    try:
        as_string = probe(_ARGUMENTS)
    except TemplateError:
        return True
    return json.dumps(_ARGUMENTS)[1:-1] in as_string


def mapping_arguments(messages: Messages) -> Messages:
    """`messages` with each tool call's JSON-string `arguments` decoded to the mapping it holds
    (others, and arguments that are no JSON object, as given)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "tool_calls": [_decoded(call) for call in calls]}
        out.append(message)
    return out


def _decoded(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        value = json.loads(arguments)
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": value}} if isinstance(value, dict) else call


def template_renderer(tokenizer: Any, chat_template: str, template_kwargs: dict[str, Any]) -> Render:
    """`render(messages, tools, add_generation_prompt)` for one template, tool call arguments in the
    form the template wants (`wants_mapping_arguments`): what the codec and the classifier render."""
    mapping = wants_mapping_arguments(tokenizer, chat_template, template_kwargs)

    def render(messages: Messages, tools: Tools = None, add_generation_prompt: bool = True) -> str:
        if mapping:
            messages = mapping_arguments(messages)
        return render_chat(tokenizer, chat_template, template_kwargs, messages, tools, add_generation_prompt)

    return render
