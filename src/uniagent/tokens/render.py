"""One call that renders a chat template, shared by the codec and the template classifier.

Why a module of its own: `ChatCodec` and `template_kind.classify_template` both render templates,
and the classifier must not import the codec (the codec classifies its template when probing).
"""

from __future__ import annotations

from typing import Any

from uniagent.errors import TemplateError

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None


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
