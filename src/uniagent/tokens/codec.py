"""ChatCodec: chat messages <-> token ids, with appends that never re-render the history.

A multi-turn agent must feed the model its own generated tokens back unchanged. Re-rendering
the conversation each turn is slow (quadratic) and silently changes tokens (templates strip
reasoning, tokenizers merge differently). The codec renders the first prompt once, then only
the tokens to append after each generation, learned by probing the template.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from uniagent.errors import TemplateError
from uniagent.tokens.chunked import chunked_encoder, plain_encoder
from uniagent.tokens.probe import ASSISTANT_MARKER, TemplateFacts, probe_template

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None

_FACTS: dict[tuple[Any, ...], TemplateFacts] = {}
_FACTS_LOCK = threading.Lock()


def _renders_content(content: str, text: str) -> bool:
    """`content` is in `text` as-is or as a JSON string (Llama 3.1 writes tool results `| tojson`,
    a string with a newline becomes `"a\\nb"`)."""
    return (
        content in text
        or json.dumps(content)[1:-1] in text
        or json.dumps(content, ensure_ascii=False)[1:-1] in text
    )


def _shape(messages: Messages) -> str:
    parts = []
    for m in messages:
        role = m.get("role", "?")
        parts.append(f"{role}+tool_calls" if m.get("tool_calls") else role)
    return " -> ".join(parts) or "(empty)"


class ChatCodec:
    """Token-level view of a Hugging Face tokenizer's chat template.

    `template_kwargs` are passed to the template on every render (e.g. `enable_thinking`).
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template or not isinstance(self.chat_template, str):
            raise TemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
                "pass chat_template=... (a Jinja string)"
            )
        self.template_kwargs = dict(template_kwargs or {})
        # pieces between special tokens memoised where that is exact (tokens/chunked.py)
        self._encode = chunked_encoder(tokenizer) or plain_encoder(tokenizer)
        key = (
            getattr(tokenizer, "name_or_path", ""),
            len(tokenizer),
            hashlib.sha1(self.chat_template.encode()).hexdigest(),
            repr(sorted(self.template_kwargs.items())),
        )
        with _FACTS_LOCK:
            facts = _FACTS.get(key)
            if facts is None:
                facts = probe_template(self.render, self.encode, tokenizer)
                _FACTS[key] = facts
        self.facts = facts
        self._boundary_ids = self._after_eot_ids(facts.boundary_text)

    # -- primitives -----------------------------------------------------------------------
    def render(self, messages: Messages, tools: Tools = None, add_generation_prompt: bool = True) -> str:
        """The template's own text for `messages`; template failures become `TemplateError`."""
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.template_kwargs,
            )
        except TemplateError:
            raise
        except Exception as exc:  # jinja raises many types; all mean "cannot render this"
            raise TemplateError(
                f"the chat template cannot render messages shaped {_shape(messages)}"
                f"{' with tools' if tools else ''}: {type(exc).__name__}: {exc}"
            ) from exc

    def encode(self, text: str) -> list[int]:
        """Tokenize rendered text the way `apply_chat_template(tokenize=True)` does."""
        return self._encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # -- template facts -------------------------------------------------------------------
    @property
    def eot_ids(self) -> list[int]:
        """Token ids that end an assistant turn, as found in the template."""
        return list(self.facts.eot_ids)

    @property
    def stop_token_ids(self) -> list[int]:
        """What to pass as `SamplingParams.stop_token_ids`: the end-of-turn, never `eos_token`.

        Templates that end the final turn differently from turns in history (gpt-oss's
        `<|return|>` vs `<|end|>`) contribute both.
        """
        ids = list(self.facts.eot_ids[-1:])
        ids += [i for i in self.facts.final_eot_ids[:1] if i not in ids]
        return ids

    @property
    def boundary_ids(self) -> list[int]:
        """Template glue after the end-of-turn and before the next message (mask 0)."""
        return list(self._boundary_ids)

    @property
    def renders_tool_calls(self) -> bool:
        """Whether the template renders `tool_calls` of assistant messages itself."""
        return self.facts.renders_tool_calls

    @property
    def renders_tool_role(self) -> bool:
        return self.facts.renders_tool_role

    # -- the three operations -------------------------------------------------------------
    def prompt_ids(self, messages: Messages, tools: Tools = None) -> list[int]:
        """The first prompt, generation prompt included, identical to the template's render."""
        if not messages:
            raise TemplateError("cannot build a prompt from an empty conversation")
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def continuation_ids(self, new_messages: Messages, tools: Tools = None) -> list[int]:
        """Ids to append right after a generation that ended with the end-of-turn token.

        Boundary + new messages + generation prompt, rendered after a probe assistant turn so
        that the history is never rendered again.
        """
        if not new_messages:
            raise TemplateError("continuation needs at least one new message")
        probe = [
            *self.facts.prefix_messages(),
            {"role": "assistant", "content": ASSISTANT_MARKER},
            *new_messages,
        ]
        text = self.render(probe, tools, add_generation_prompt=True)
        at = text.find(ASSISTANT_MARKER)
        if at < 0:
            raise TemplateError(
                f"the chat template dropped the previous assistant turn when rendering {_shape(new_messages)}"
            )
        after = text[at + len(ASSISTANT_MARKER) :]
        eot = self.facts.eot_text
        if not after.startswith(eot):
            raise TemplateError(
                "the chat template does not end the previous assistant turn with "
                f"{eot!r} when followed by {_shape(new_messages)}; got {after[:40]!r}"
            )
        self._check_rendered(new_messages, after)
        return self._after_eot_ids(after[len(eot) :])

    def drift(self, messages: Messages, token_ids: list[int], tools: Tools = None) -> int | None:
        """First index where `token_ids` differs from a full render of `messages`, else None.

        When the conversation ends with an assistant turn, the running sequence stops at the
        end-of-turn token; what the template writes after it is not drift. Whether a difference
        is a bug of ours or sampled text split differently: `uniagent.tokens.drift.drift_report`.
        """
        ends_with_assistant = bool(messages) and messages[-1].get("role") == "assistant"
        reference = self.encode(self.render(messages, tools, add_generation_prompt=not ends_with_assistant))
        n = min(len(reference), len(token_ids))
        for i in range(n):
            if reference[i] != token_ids[i]:
                return i
        if len(token_ids) == len(reference):
            return None
        if len(token_ids) > len(reference):
            return len(reference)
        # Shorter: fine only after a final assistant turn, whose trailing template text
        # (boundary, end-of-text) the model never sees.
        return None if ends_with_assistant else len(token_ids)

    # -- helpers --------------------------------------------------------------------------
    def _after_eot_ids(self, text: str) -> list[int]:
        """Tokenize text that follows the end-of-turn exactly as it tokenizes in context.

        Encoding it behind the end-of-turn token reproduces the in-context segmentation
        (tokenizers that add a prefix space to a bare string would otherwise differ).
        """
        if not text:
            return []
        eot = list(self.facts.eot_ids)
        ids = self.encode(self.facts.eot_text + text)
        if ids[: len(eot)] == eot:
            return ids[len(eot) :]
        return self.encode(text)

    @staticmethod
    def _check_rendered(new_messages: Messages, text: str) -> None:
        """A template that silently drops a message would train on a lie; refuse instead."""
        for message in new_messages:
            content = message.get("content")
            if isinstance(content, str) and content.strip() and not _renders_content(content.strip(), text):
                raise TemplateError(
                    f"the chat template does not render {message.get('role')!r} messages "
                    "(their content is missing from the render); map them to a role it supports"
                )
