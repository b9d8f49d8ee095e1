"""The exactly-once check for segments, shared by the TokenConversation and gateway tests.

`Gen` scripts generations whose logprobs are unique to each (a global counter), and remembers
them, so a test can find every generated token in the stored segments and check it is there
exactly once with mask 1 and its own logprob.
"""

from __future__ import annotations

import itertools
from typing import Any

from uniagent.tokens import Trajectory

_ids = itertools.count(1)
HELLO = [{"role": "user", "content": "hi"}]  # a history for a turn's render (it does not depend on it)


class Gen:
    """Scripted generations with unique logprobs, remembered for the exactly-once check."""

    def __init__(self, codec: Any) -> None:
        self.codec = codec
        self.made: list[tuple[list[int], list[float]]] = []

    def __call__(self, text: str, stop: bool = True) -> tuple[list[int], list[float]]:
        return self.ids(self.codec.encode(text) + (self.codec.eot_ids[-1:] if stop else []))

    def turn(
        self, text: str, stop: bool = True, message: dict[str, Any] | None = None
    ) -> tuple[list[int], list[float]]:
        """A model turn saying `text` (or the assistant `message`: a tool call in the template's
        own format) as the template renders one (Qwen3's own template: an empty think block
        first; gpt-oss: a channel header, then <|return|>); `stop=False`: cut before its
        end-of-turn."""
        from tokens_sim import model_turn_ids

        ids = model_turn_ids(self.codec, HELLO, message or {"role": "assistant", "content": text})
        return self.ids(ids if stop else ids[:-1])

    def ids(self, ids: list[int]) -> tuple[list[int], list[float]]:
        """A generation of exactly these ids (e.g. a non-canonical split of some text)."""
        lps = [-next(_ids) / 1000.0 for _ in ids]
        self.made.append((ids, lps))
        return ids, lps


def assert_every_generated_token_once(segments: list[Trajectory], gen: Gen) -> None:
    """Each generation sits in exactly one segment with mask 1 and its logprobs; no context token
    has mask 1."""
    for ids, lps in gen.made:
        found = []
        for seg in segments:
            for span in seg.spans:
                if span.kind != "model":
                    continue
                got = seg.response_ids[span.start : span.end]
                if got == ids and seg.response_logprobs[span.start : span.end] == lps:
                    found.append(seg)
        assert len(found) == 1, (ids, len(found))
    for seg in segments:
        seg.validate()
        model = sum(s.length for s in seg.spans if s.kind == "model")
        assert sum(seg.response_mask) == model


# A ChatML template that cannot render an assistant message saying "boom" (continuations never
# render the model's own text, so the episode runs; only the full render at the end fails).
REFUSES_BOOM = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' and 'boom' in m['content'] -%}"
    "{{ raise_exception('this template cannot render boom') }}{%- endif -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


# A ChatML template that, like Qwen3's, drops the reasoning of assistant turns before the last
# user message: it is not append-only.
STRIPS_REASONING = (
    "{%- set ns = namespace(last=0) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set c = m['content'] -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last and '</think>' in c -%}"
    "{%- set c = c.split('</think>')[-1].lstrip() -%}{%- endif -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
