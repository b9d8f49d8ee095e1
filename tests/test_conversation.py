"""TokenConversation: one owner of the exact token record, as segments (real SmolLM2 codec).

Each generation gets logprobs unique to it, so a test can find every generated token in the
stored segments and check it is there exactly once with mask 1 and its own logprob.
"""

from __future__ import annotations

from typing import Any

import pytest

import real_tokenizers as real
from token_checks import HELLO, REFUSES_BOOM, STRIPS_REASONING, Gen, assert_every_generated_token_once
from tokens_sim import model_turn_ids
from uniagent.errors import TemplateError
from uniagent.tokens import TokenConversation


def turn(
    conv: TokenConversation,
    gen: Gen,
    messages: list[dict[str, Any]],
    text: str,
    stop: bool = True,
    plain: bool = False,
):
    """One model turn: as the template renders an assistant turn (`plain`: the text and the
    end-of-turn, for the hand-written templates below)."""
    plan = conv.plan(messages)
    ids, lps = gen(text, stop) if plain else gen.turn(text, stop)
    reply = conv.commit(plan, ids, lps, "stop" if stop else "length")
    # what a reply parser makes of it: the text (no think block, channel header or end-of-turn)
    message = {"role": "assistant", "content": text}
    conv.add_reply(reply, message)
    return plan, message


# Real pairs; each scripted model turn is what the template renders for an assistant turn
# (`Gen.turn`: Qwen3's own template writes an empty think block first, gpt-oss a channel header).
# Those two rewrite a past turn, so their exact records have drift of kind `template`.
CONVERSATION_PAIRS = (*real.OWN_PAIRS, "qwen3-Qwen3-Coder")


@pytest.fixture(scope="module", params=["smollm2", *CONVERSATION_PAIRS])
def codec(request, codec):  # type: ignore[no-untyped-def]
    """SmolLM2's codec and real tokenizers with their templates."""
    return real.codec_or_smol(request, codec)


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
    assert seg.reason == "start" and seg.num_turns == 2
    assert_every_generated_token_once([seg], gen)
    if rewrites(codec):  # Qwen3's own drops the past think block, gpt-oss ends it with <|end|>
        assert seg.drift is not None and seg.drift_kind == "template"
        return
    assert seg.drift is None
    assert seg.token_ids == codec.encode(codec.render(msgs, add_generation_prompt=False))[: len(seg)]


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
    try:
        codec.render(short)
    except TemplateError as exc:  # Gemma's templates: "Conversation roles must alternate"
        pytest.skip(f"the template cannot render two user turns in a row: {exc}")
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


@pytest.mark.parametrize("follow", [False, True])
def test_a_template_that_strips_earlier_reasoning(codec, gen, follow: bool) -> None:
    """exact (default): one segment, the model keeps seeing its reasoning, drift says where the
    template departs. follow_template: a new `template` segment rendered as the template does."""
    from uniagent.tokens import ChatCodec

    qwenish = ChatCodec(codec.tokenizer, chat_template=STRIPS_REASONING)
    gen.codec = qwenish
    conv = TokenConversation(qwenish, follow_template=follow)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "2+2?"}]
    _, a1 = turn(conv, gen, msgs, "<think>two and two</think>4", plain=True)
    msgs += [a1, {"role": "user", "content": "3+3?"}]
    plan, a2 = turn(conv, gen, msgs, "<think>three and three</think>6", plain=True)
    msgs.append(a2)
    segments = conv.finish()
    if follow:
        assert [s.reason for s in segments] == ["start", "template"]
        assert plan.prompt_ids == qwenish.prompt_ids(msgs[:3])  # reasoning of turn 1 dropped
        assert "two and two" not in qwenish.decode(segments[1].prompt_ids)
    else:
        assert [s.reason for s in segments] == ["start"]
        assert "two and two" in qwenish.decode(segments[0].token_ids)
        assert segments[0].drift is not None and segments[0].drift_kind == "template"
    assert_every_generated_token_once(segments, gen)


def _split(codec, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    """A model turn saying `text` (as the template renders one), `text` sampled one character at
    a time: a non-canonical split of it."""
    whole = codec.decode(model_turn_ids(codec, HELLO, {"role": "assistant", "content": text}))
    before, after = whole.split(text, 1)
    return codec.encode(before) + [i for ch in text for i in codec.encode(ch)] + codec.encode(after)


def rewrites(codec) -> bool:  # type: ignore[no-untyped-def]
    """Qwen3's own and gpt-oss's templates show a past turn otherwise: drift of kind `template`."""
    return codec.kind.kind == "rewriting"


def test_a_rollback_prompt_keeps_sampled_tokens_marked_so_their_split_is_not_a_bug(codec, gen) -> None:
    """The rollback's prompt holds the first reply's sampled ids; drift_report learns which prompt
    tokens the model wrote, so their non-canonical split is `sampled`, not `bookkeeping`."""
    conv = TokenConversation(codec)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "say it"}]
    plan = conv.plan(msgs)
    reply = conv.commit(plan, *gen.ids(_split(codec, "hello world")))
    a1 = {"role": "assistant", "content": "hello world"}
    conv.add_reply(reply, a1)
    assert reply.text.endswith("hello world")  # after Qwen3's think block, gpt-oss's header
    msgs += [a1, {"role": "user", "content": "again"}]
    _, _a2 = turn(conv, gen, msgs, "once more")
    msgs += [{"role": "assistant", "content": "edited"}, {"role": "user", "content": "last"}]
    plan, _ = turn(conv, gen, msgs, "done")
    assert plan.reason == "rollback"
    first, second = conv.segments
    end = first.turn_ends[1]
    n = len(first.trajectory.prompt_ids)
    assert second.prompt_mask[:end] == [0] * n + first.trajectory.response_mask[: end - n]
    assert set(second.prompt_mask[end:]) == {0} and len(second.prompt_mask) == len(plan.prompt_ids)
    segments = conv.finish()
    kind = "template" if rewrites(codec) else "sampled"
    assert [(s.drift is not None, s.drift_kind) for s in segments] == [(True, kind), (True, kind)]
    assert_every_generated_token_once(segments, gen)


def test_a_history_the_template_cannot_render_keeps_its_tokens_with_drift_zero(codec, gen) -> None:
    """One answer for the loop and the gateway: drift 0 of kind bookkeeping and the reason, never
    an exception (which cost the record) nor None (a claim nobody checked)."""
    from uniagent.tokens import ChatCodec

    refusing = ChatCodec(codec.tokenizer, chat_template=REFUSES_BOOM)
    gen.codec = refusing
    conv = TokenConversation(refusing)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "make a noise"}]
    _, a1 = turn(conv, gen, msgs, "boom", plain=True)
    msgs += [a1, {"role": "user", "content": "louder"}]
    turn(conv, gen, msgs, "BOOM", plain=True)
    (seg,) = conv.finish()
    assert (seg.drift, seg.drift_kind) == (0, "bookkeeping") and seg.num_turns == 2
    assert "cannot render boom" in (conv.segments[0].drift_error or "")
    assert_every_generated_token_once([seg], gen)


def test_policy_versions_follow_each_generation_into_its_segment(codec, gen) -> None:
    """Versions ride with the tokens through extend, rollback and a new chain: each generation's
    tokens carry their own versions (one was interrupted by a weight update: [1, 1, 2, ...]),
    context tokens -1; a segment that gets one generation without versions says unknown."""
    conv = TokenConversation(codec)
    made: list[tuple[list[int], list[int]]] = []

    def step(messages: list[dict[str, Any]], text: str, version: int, bump_at: int | None = None):
        plan = conv.plan(messages)
        ids, lps = gen(text)
        versions = [version + (bump_at is not None and k >= bump_at) for k in range(len(ids))]
        made.append((ids, versions))
        reply = conv.commit(plan, ids, lps, "stop", versions)
        message = {"role": "assistant", "content": reply.text}
        conv.add_reply(reply, message)
        return plan, message

    msgs: list[dict[str, Any]] = [{"role": "user", "content": "count"}]
    _, a1 = step(msgs, "one two three", 0)
    msgs += [a1, {"role": "user", "content": "more"}]
    step(msgs, "four five six", 1, bump_at=2)  # partial rollout: the update landed mid-turn
    msgs += [{"role": "assistant", "content": "edited"}, {"role": "user", "content": "more"}]
    plan, _ = step(msgs, "seven", 2)  # rollback: a new segment
    assert plan.reason == "rollback"
    other = [{"role": "user", "content": "something else"}]
    plan = conv.plan(other)
    conv.add_reply(conv.commit(plan, *gen("no versions")), {"role": "assistant", "content": "x"})
    first, second, third = conv.finish()
    assert [s.reason for s in (first, second, third)] == ["start", "rollback", "rewritten"]
    for seg in (first, second):
        seg.validate()
        assert len(seg.response_versions) == len(seg.response_ids)
        model = [s for s in seg.spans if s.kind == "model"]
        for span in seg.spans:
            got = seg.response_versions[span.start : span.end]
            if span.kind == "context":
                assert set(got) == {-1}
            else:
                ids = seg.response_ids[span.start : span.end]
                assert (ids, got) in made
        assert len(model) == seg.num_turns
    assert first.version_range == (0, 2) and second.version_range == (2, 2)
    assert third.response_versions == [] and third.version_range is None
    assert_every_generated_token_once([first, second, third], gen)
