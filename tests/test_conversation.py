"""TokenConversation: one owner of the exact token record, as segments (real SmolLM2 codec).

Each generation gets logprobs unique to it, so a test can find every generated token in the
stored segments and check it is there exactly once with mask 1 and its own logprob.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from uniagent.tokens import TokenConversation, Trajectory

_ids = itertools.count(1)


class Gen:
    """Scripted generations with unique logprobs, remembered for the exactly-once check."""

    def __init__(self, codec: Any) -> None:
        self.codec = codec
        self.made: list[tuple[list[int], list[float]]] = []

    def __call__(self, text: str, stop: bool = True) -> tuple[list[int], list[float]]:
        ids = self.codec.encode(text) + (self.codec.eot_ids[-1:] if stop else [])
        lps = [-next(_ids) / 1000.0 for _ in ids]
        self.made.append((ids, lps))
        return ids, lps


def turn(conv: TokenConversation, gen: Gen, messages: list[dict[str, Any]], text: str, stop: bool = True):
    plan = conv.plan(messages)
    ids, lps = gen(text, stop)
    reply = conv.commit(plan, ids, lps, "stop" if stop else "length")
    message = {"role": "assistant", "content": reply.text}
    conv.add_reply(reply, message)
    return plan, message


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


@pytest.fixture
def gen(codec):  # type: ignore[no-untyped-def]
    return Gen(codec)


def test_an_append_only_history_is_one_exact_segment(codec, gen) -> None:
    conv = TokenConversation(codec)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    plan, reply = turn(conv, gen, msgs, "Hello there.")
    assert plan.prompt_ids == codec.prompt_ids(msgs)
    msgs += [reply, {"role": "user", "content": "and again"}]
    plan, reply = turn(conv, gen, msgs, "Hello again.")
    assert plan.segment is conv.segments[0]
    msgs.append(reply)
    (seg,) = conv.finish()
    assert seg.reason == "start" and seg.drift is None and seg.num_turns == 2
    assert seg.token_ids == codec.encode(codec.render(msgs, add_generation_prompt=False))[: len(seg)]
    assert_every_generated_token_once([seg], gen)


def test_rewriting_the_last_assistant_rolls_back_with_exact_prefix_tokens(codec, gen) -> None:
    conv = TokenConversation(codec)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "count"}]
    _, a1 = turn(conv, gen, msgs, "one")
    msgs += [a1, {"role": "user", "content": "more"}]
    _, _a2 = turn(conv, gen, msgs, "two")
    first = conv.segments[0]
    end_of_a1 = first.turn_ends[1]
    # The harness rewrites its last assistant message, then goes on.
    msgs += [{"role": "assistant", "content": "TWO (edited)"}, {"role": "user", "content": "more"}]
    plan, _a3 = turn(conv, gen, msgs, "three")
    assert plan.reason == "rollback" and plan.chain == 0
    second = conv.segments[1].trajectory
    # The new segment's prompt is the first segment's exact tokens up to the end of turn 1 ...
    assert second.prompt_ids[:end_of_a1] == first.token_ids[:end_of_a1]
    # ... then the rest of the history rendered as context.
    rest = codec.continuation_ids(msgs[2:5])
    assert second.prompt_ids[end_of_a1:] == rest
    segments = conv.finish()
    assert [s.reason for s in segments] == ["start", "rollback"]
    assert segments[0].num_turns == 2  # "two" stays where it was generated
    assert_every_generated_token_once(segments, gen)


def test_a_history_rewritten_from_the_start_renders_a_new_chain(codec, gen) -> None:
    conv = TokenConversation(codec)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "a"}]
    _, a1 = turn(conv, gen, msgs, "b")
    other = [{"role": "user", "content": "something else"}]
    plan, _ = turn(conv, gen, other, "c")
    assert plan.reason == "rewritten" and plan.chain == 1
    assert plan.prompt_ids == codec.prompt_ids(other)
    # The first chain can still be extended: a harness may go back to it.
    plan, _ = turn(conv, gen, [*msgs, a1, {"role": "user", "content": "d"}], "e")
    assert plan.segment is conv.segments[0]
    assert_every_generated_token_once(conv.finish(), gen)


def test_begin_segment_condenses_in_the_same_chain_and_a_cut_turn_is_closed(codec, gen) -> None:
    conv = TokenConversation(codec)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    _, a1 = turn(conv, gen, msgs, "I was cut", stop=False)
    msgs += [a1, {"role": "user", "content": "go on"}]
    plan, _a2 = turn(conv, gen, msgs, "ok")
    # the cut turn is closed by the end-of-turn, as context
    assert plan.context[0] == (codec.eot_ids, "assistant")
    assert conv.context_tokens == len(conv.segments[0].trajectory)
    conv.begin_segment("condensed")
    short = [msgs[0], msgs[1], {"role": "user", "content": "Summary: you said ok."}]
    plan, _ = turn(conv, gen, short, "done")
    assert plan.reason == "condensed" and plan.chain == 0 and plan.prompt_ids == codec.prompt_ids(short)
    assert conv.context_tokens == len(conv.segments[1].trajectory) < len(conv.segments[0].trajectory)
    assert_every_generated_token_once(conv.finish(), gen)


def test_state_changes_only_on_commit_and_caller_dicts_are_copied(codec, gen) -> None:
    conv = TokenConversation(codec)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "x"}]
    conv.plan(msgs)  # a request whose generation failed: nothing recorded
    assert conv.segments == []
    _, a1 = turn(conv, gen, msgs, "y")
    msgs[0]["content"] = "changed after the fact"  # the caller mutates its own dict
    assert conv.segments[0].messages[0]["content"] == "x"
    plan = conv.plan([*msgs, a1, {"role": "user", "content": "z"}])
    assert plan.segment is None  # the changed first message no longer matches: not an extension


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


@pytest.mark.parametrize("follow", [False, True])
def test_a_template_that_strips_earlier_reasoning(codec, gen, follow: bool) -> None:
    """exact (default): one segment, the model keeps seeing its reasoning, drift says where the
    template departs. follow_template: a new `template` segment rendered as the template does."""
    from uniagent.tokens import ChatCodec

    qwenish = ChatCodec(codec.tokenizer, chat_template=STRIPS_REASONING)
    gen.codec = qwenish
    conv = TokenConversation(qwenish, follow_template=follow)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "2+2?"}]
    _, a1 = turn(conv, gen, msgs, "<think>two and two</think>4")
    msgs += [a1, {"role": "user", "content": "3+3?"}]
    plan, a2 = turn(conv, gen, msgs, "<think>three and three</think>6")
    msgs.append(a2)
    segments = conv.finish()
    if follow:
        assert [s.reason for s in segments] == ["start", "template"]
        assert plan.prompt_ids == qwenish.prompt_ids(msgs[:3])  # reasoning of turn 1 dropped
        assert "two and two" not in qwenish.decode(segments[1].prompt_ids)
    else:
        assert [s.reason for s in segments] == ["start"]
        assert "two and two" in qwenish.decode(segments[0].token_ids)
        assert segments[0].drift is not None
    assert_every_generated_token_once(segments, gen)
