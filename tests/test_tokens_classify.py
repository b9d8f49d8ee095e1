"""classify_template on the five real tokenizers and shared templates of their families."""

from __future__ import annotations

import pytest

import real_tokenizers as real
from token_checks import STRIPS_REASONING
from tokens_sim import tokenizer_for
from uniagent.tokens.classify import APPEND_ONLY, REFUSED, REWRITING, STATEFUL, classify_template

# What each real pair is, found by rendering a tool-using conversation one message at a time.
EXPECTED = {
    "qwen3-own": (REWRITING, 2),  # the last turn's empty think block goes once it is history
    "qwen3-Qwen3": (REWRITING, 2),
    "qwen3-Qwen3-Coder": (APPEND_ONLY, None),
    "qwen3-Qwen2.5": (APPEND_ONLY, None),
    "llama3_1-own": (APPEND_ONLY, None),
    "llama3_1-Llama-3.1": (APPEND_ONLY, None),  # tool results written `| tojson`: still rendered
    "deepseek_v3-own": (STATEFUL, 5),  # only the first tool result opens the tool-outputs block
    "deepseek_v3-DeepSeek-V3.1": (APPEND_ONLY, None),
    "gemma3-own": (APPEND_ONLY, None),  # no tools: decided on the plain conversation
    "gemma3-gemma-2": (APPEND_ONLY, None),
    # a tool result names the tool of the assistant turn before it, which a continuation
    # rendered alone does not have
    "gptoss-own": (REFUSED, 3),
}


@pytest.mark.parametrize("pair", real.PAIRS)
def test_real_pairs_are_classified(pair: str) -> None:
    family, _ = real.PAIRS[pair]
    kind = classify_template(real.tokenizer(family), real.template(pair))
    assert (kind.kind, kind.at_message) == EXPECTED[pair], kind
    assert kind.conversation == ("plain" if family == "gemma3" else "tools")
    assert (
        kind.action
        == {
            APPEND_ONLY: "fast path",
            STATEFUL: "re-render",
            REWRITING: "fast path, drift 'template'",
            REFUSED: "refuse",
        }[kind.kind]
    )
    assert kind.reason


def test_smollm2_is_append_only_and_a_template_that_raises_is_refused(smol_tokenizer) -> None:
    tok = tokenizer_for(smol_tokenizer, STRIPS_REASONING)
    assert classify_template(tok).kind == APPEND_ONLY  # no reasoning in the probe conversations
    assert classify_template(smol_tokenizer).kind == APPEND_ONLY
    refusing = "{{ raise_exception('no chat here') }}"
    kind = classify_template(smol_tokenizer, refusing)
    assert kind.kind == REFUSED and "no chat here" in kind.reason and kind.action == "refuse"
