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
from dataclasses import replace
from typing import Any

from uniagent.errors import TemplateError
from uniagent.tokens.chunked import chunked_encoder, plain_encoder
from uniagent.tokens.probe import TemplateFacts, continuation_text, probe_template, special_ids
from uniagent.tokens.render import Messages, Tools, template_renderer
from uniagent.tokens.reply import ReplyFormat, probe_reply_format
from uniagent.tokens.template_kind import TemplateKind, classify

_FACTS: dict[tuple[Any, ...], tuple[TemplateFacts, TemplateKind, ReplyFormat]] = {}
_FACTS_LOCK = threading.Lock()


def _renders_content(content: str, text: str) -> bool:
    """`content` is in `text` as-is or as a JSON string literal's body: Llama 3.1 writes tool results
    `| tojson` and gpt-oss writes JSON-string tool results as a literal, so a string with a newline
    becomes `"a\\nb"` (and non-ASCII text `\\uXXXX`, or kept as-is)."""
    return (
        content in text
        or json.dumps(content)[1:-1] in text
        or json.dumps(content, ensure_ascii=False)[1:-1] in text
    )


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
        self._render = template_renderer(tokenizer, self.chat_template, self.template_kwargs)
        # pieces between special tokens memoised where that is exact (tokens/chunked.py)
        self._encode = chunked_encoder(tokenizer) or plain_encoder(tokenizer)
        key = (
            getattr(tokenizer, "name_or_path", ""),
            len(tokenizer),
            hashlib.sha1(self.chat_template.encode()).hexdigest(),
            repr(sorted(self.template_kwargs.items())),
        )
        with _FACTS_LOCK:
            found = _FACTS.get(key)
            if found is None:
                facts = probe_template(self.render, self.encode, tokenizer)
                kind = classify(self.render, facts)
                reply = probe_reply_format(self.render, facts.prefix_messages())
                found = _FACTS[key] = (replace(facts, stateful=kind.stateful), kind, reply)
        self.facts, self._kind, self.reply_format = found
        self._boundary_ids = self._after_eot_ids(self.facts.boundary_text)
        self._special = special_ids(tokenizer)

    # -- primitives -----------------------------------------------------------------------
    def render(self, messages: Messages, tools: Tools = None, add_generation_prompt: bool = True) -> str:
        """The template's own text for `messages`; template failures become `TemplateError`. Tool
        call arguments go to the template as mappings where it `tojson`s them (tokens/render.py)."""
        return self._render(messages, tools, add_generation_prompt)

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
        `<|return|>` vs `<|end|>`), or a turn that calls a tool differently (gpt-oss's `<|call|>`),
        contribute each; where the template also writes that end-of-turn inside one turn (gpt-oss
        closes its analysis message with `<|end|>`, then calls a tool in the same turn), only the
        turn's own ends stop it (`<|return|>`, `<|call|>`).
        """
        facts = self.facts
        ends = [*facts.final_eot_ids[:1], *facts.call_eot_ids]
        if facts.eot_inside_turn and facts.final_eot_ids and facts.call_eot_ids:
            return ends  # the end-of-turn also closes a message inside a turn: not a stop
        ids = list(facts.eot_ids[-1:])
        return ids + [i for i in ends if i not in ids]

    @property
    def kind(self) -> TemplateKind:
        """append_only / stateful / rewriting / refused, with the render that showed it and the
        codec's action (template_kind.py)."""
        return self._kind

    def reply_message(self, text: str) -> dict[str, Any]:
        """The assistant message of a reply's decoded text: the answer as `content`, reasoning in
        the template's field, headers the template writes itself left out (tokens/reply.py)."""
        return self.reply_format.message(text)

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

    def continuation_ids(
        self,
        new_messages: Messages,
        tools: Tools = None,
        history: Messages | None = None,
        held_ids: list[int] | None = None,
    ) -> list[int]:
        """Ids to append right after a generation that ended with the end-of-turn token.

        Boundary + new messages + generation prompt, rendered after a probe assistant turn so
        that the history is never rendered again. A stateful template (`facts.stateful`) renders a
        message differently after its real history: given `history` (the messages `held_ids`
        stand for, ending with the assistant turn just generated), the whole conversation is
        rendered and what it writes after that turn is appended, so the running sequence stays
        the template's own render. Where the render does not extend the history's (the template
        rewrites an earlier turn), the fast path is used and the difference is reported as
        drift, as for any rewriting template.
        """
        if not new_messages:
            raise TemplateError("continuation needs at least one new message")
        if self.facts.stateful and history is not None and held_ids:
            ids = self._after_held(history, new_messages, tools, held_ids)
            if ids is not None:
                return ids
        try:
            after = continuation_text(self.render, self.facts, new_messages, tools)
        except TemplateError as exc:
            if any(m.get("role") == "tool" for m in new_messages) and not self.renders_tool_role:
                raise TemplateError(
                    "the chat template has no tool role, so a tool result cannot follow an assistant "
                    f"turn (the template's rule: {exc}); use a template that renders tool results"
                ) from exc
            raise
        self._check_rendered(new_messages, after)
        return self._after_eot_ids(after)

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
    def _after_held(
        self, history: Messages, new_messages: Messages, tools: Tools, held_ids: list[int]
    ) -> list[int] | None:
        """What a full render of history + new messages writes after the history's last turn, or
        None where that render does not show the turn's end where the held ids have it.

        The held ids end with the last turn's stop token, a special token; the render is cut
        after its n-th occurrence of that token's text, n being its count in the held ids (a
        special token's text always encodes as that token, so the counts agree wherever the held
        ids are the template's render). One render per turn and only the new part tokenized, behind
        the stop token so that it splits as in context; the held ids are not re-encoded: where they
        differ from the history's render, the drift check reports it, as for any continuation."""
        last = held_ids[-1]
        if last not in self._special:
            return None
        stop = self.tokenizer.convert_ids_to_tokens(last)
        text = self.render([*history, *new_messages], tools, add_generation_prompt=True)
        at = -1
        for _ in range(held_ids.count(last)):
            at = text.find(stop, at + 1)
            if at < 0:
                return None
        after = text[at + len(stop) :]
        if not after:
            return None
        self._check_rendered(new_messages, after)
        ids = self.encode(stop + after)
        return ids[1:] if ids[:1] == [last] else self.encode(after)

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
        """A template that silently drops a message would train on a lie; refuse instead. Content
        a template writes as a JSON string literal (gpt-oss's tool results) counts as rendered."""
        for message in new_messages:
            content = message.get("content")
            if isinstance(content, str) and content.strip() and not _renders_content(content.strip(), text):
                raise TemplateError(
                    f"the chat template does not render {message.get('role')!r} messages "
                    "(their content is missing from the render); map them to a role it supports"
                )
