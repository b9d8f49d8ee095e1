"""classify_template on the five real tokenizers and shared templates of their families: the one
classifier, which the codec runs when probing (`ChatCodec.kind`) and `uniagent tokens check` reports."""

from __future__ import annotations

import pytest

import real_tokenizers as real
from token_checks import STRIPS_REASONING
from tokens_sim import tokenizer_for
from uniagent.tokens.template_kind import classify_template

REWRITES = "fast path, drift 'template' or a new segment"
# What each real pair is: (kind, first departing message of the tool-using probe conversation,
# codec action).
EXPECTED = {
    "qwen3-own": ("rewriting", 1, REWRITES),  # the last turn's empty think block goes once it is history
    "qwen3-Qwen3": ("rewriting", 1, REWRITES),
    "qwen3-Qwen3-Coder": ("append_only", None, "fast path"),
    "qwen3-Qwen2.5": ("append_only", None, "fast path"),
    "llama3_1-own": ("append_only", None, "fast path"),
    "llama3_1-Llama-3.1": ("append_only", None, "fast path"),  # tool results `| tojson`: still rendered
    "deepseek_v3-own": ("stateful", 4, "re-render"),  # only the first tool result opens the block
    "deepseek_v3-DeepSeek-V3.1": ("append_only", None, "fast path"),
    "gemma3-own": ("append_only", None, "fast path"),  # no tools: decided on the plain conversation
    "gemma3-gemma-2": ("append_only", None, "fast path"),
    # drops past analysis (rewriting) and names a tool result after the latest call (stateful)
    "gptoss-own": ("rewriting", 1, "re-render, drift 'template' or a new segment"),
}


@pytest.mark.parametrize("pair", real.PAIRS)
def test_real_pairs_are_classified_as_the_codec_does(pair: str) -> None:
    family, _ = real.PAIRS[pair]
    kind = classify_template(real.tokenizer(family), real.template(pair))
    assert (kind.kind, kind.at_message, kind.action) == EXPECTED[pair], kind
    assert kind.conversation == ("plain" if family == "gemma3" else "tools")
    assert kind.evidence
    assert real.codec(pair).kind == kind  # the codec and `uniagent tokens check` agree


def test_smollm2_is_append_only_and_a_template_that_raises_is_refused(smol_tokenizer) -> None:
    tok = tokenizer_for(smol_tokenizer, STRIPS_REASONING)
    assert classify_template(tok).kind == "append_only"  # no reasoning in the probe conversations
    assert classify_template(smol_tokenizer).kind == "append_only"
    refusing = "{{ raise_exception('no chat here') }}"
    kind = classify_template(smol_tokenizer, refusing)
    assert kind.kind == "refused" and "no chat here" in kind.evidence and kind.action == "refuse"
    # renders one turn, but no assistant turn after a user one: the codec probes it, then refuses
    one_turn = (
        "{% for m in messages %}{% if loop.index0 > 1 %}{{ raise_exception('one turn only') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    kind = classify_template(smol_tokenizer, one_turn)
    assert kind.kind == "refused" and kind.action == "refuse", kind
