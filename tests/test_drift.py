"""Drift by kind on the real SmolLM2 codec: a sampled retokenization (harmless) vs a bookkeeping
error (ours), including a bookkeeping error hidden behind an earlier sampled one."""

from __future__ import annotations

from typing import Any

import pytest

import real_tokenizers as real
from tokens_sim import model_turn_ids
from uniagent.tokens import ChatCodec, Trajectory
from uniagent.tokens.drift import DriftReport, drift_report, episode_drift, template_rewrites_at


# One real pair per family (its own template) and Qwen3-Coder's: a hand-built model turn is what
# the template renders for that assistant turn (`model_turn_ids`: Qwen3's own template writes an
# empty think block first, gpt-oss a channel header). The rewriting templates (Qwen3's own,
# gpt-oss) show an earlier turn otherwise once more messages follow, so their exact episodes have
# drift of kind `template`, as documented.
@pytest.fixture(scope="module", params=["smollm2", *real.OWN_PAIRS, "qwen3-Qwen3-Coder"])
def codec(request, codec):  # type: ignore[no-untyped-def]
    """SmolLM2's codec and real tokenizers with their templates."""
    return real.codec_or_smol(request, codec)


MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix the failing test."},
    {"role": "assistant", "content": "Let me look at the world first."},
    {"role": "tool", "content": "file_1.py\nREADME.md\nsetup.cfg"},
    {"role": "assistant", "content": "The test imports a missing module."},
    {"role": "user", "content": "Then fix it."},
    {"role": "assistant", "content": "Done: the import is fixed."},
]


def messages_for(codec: ChatCodec) -> list[dict[str, Any]]:
    """MESSAGES, with tool results as user turns where the template has no tool role (Gemma's
    templates raise on one; turns still alternate)."""
    if codec.renders_tool_role:
        return MESSAGES
    return [{**m, "role": "user"} if m["role"] == "tool" else m for m in MESSAGES]


def tool_role(codec: ChatCodec) -> str:
    return "tool" if codec.renders_tool_role else "user"


def turn_ids(codec: ChatCodec, msgs: list[dict[str, Any]], i: int, content: str | None = None) -> list[int]:
    """What a model that samples the tokenizer's own split emits for assistant message `i` (or
    for `content` in its place): the turn as its template renders it, through its end-of-turn."""
    message = msgs[i] if content is None else {**msgs[i], "content": content}
    return model_turn_ids(codec, msgs[:i], message)


def char_split(codec: ChatCodec, msgs: list[dict[str, Any]], i: int, word: str) -> list[int]:
    """Assistant message `i`'s turn with `word` sampled one character per token (a non-canonical
    split of the same text)."""
    canonical = turn_ids(codec, msgs, i)
    text = codec.decode(canonical)
    before, after = text.split(word, 1)
    ids = codec.encode(before) + [t for ch in word for t in codec.encode(ch)] + codec.encode(after)
    assert codec.decode(ids) == text and ids != canonical
    return ids


def rewrites(codec: ChatCodec) -> bool:
    """The template shows an earlier turn otherwise once more messages follow (Qwen3's own drops
    the empty think block of a past turn, gpt-oss ends a past final answer with <|end|>, not the
    <|return|> the model sampled): an exact running sequence then departs from the full render."""
    return codec.kind.kind == "rewriting"


def assert_drift(
    codec: ChatCodec,
    msgs: list[dict[str, Any]],
    traj: Trajectory,
    want: DriftReport,
    prompt_mask: list[int] | None = None,
) -> None:
    """The drift report is `want` on a template that keeps earlier turns as they were; on a
    rewriting one it is the documented drift: kind `template`, at or after the point where the
    template stops being append-only (a difference after that point is not told apart;
    `model.history: template` avoids the drift altogether)."""
    report = drift_report(codec, msgs, traj, prompt_mask=prompt_mask)
    if not rewrites(codec):
        assert report == want
        return
    at = template_rewrites_at(codec, msgs)
    first = codec.drift(msgs, traj.token_ids)
    assert report.kind == "template" and at is not None and first is not None, report
    assert report.index is not None and report.index >= max(at, first), (report, at, first)


def kept(codec: ChatCodec, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation up to its first assistant turn on a rewriting template (which renders the
    last turn as the model sampled it), the whole one otherwise: a history whose only departure
    from the render is the one a test makes."""
    return msgs[:3] if rewrites(codec) else msgs


def episode(
    codec: ChatCodec, messages: list[dict[str, Any]], generations: dict[int, list[int]] | None = None
) -> Trajectory:
    """Build a segment the way TokenChatModel does: first prompt, generations (mask 1),
    continuations (mask 0). `generations` overrides the ids sampled for an assistant message."""
    generations = generations or {}
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    traj = Trajectory(prompt_ids=codec.prompt_ids(messages[:first]))
    i = first
    while i < len(messages):
        gen = generations.get(i) or model_turn_ids(codec, messages[:i], messages[i], traj.token_ids)
        traj.add_generation(gen, [-0.25] * len(gen))
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if i + 1 < j:
            # as TokenChatModel: the history and the held ids, for stateful templates' re-render
            after = codec.continuation_ids(
                messages[i + 1 : j], history=messages[: i + 1], held_ids=traj.token_ids
            )
            traj.add_context(after, role=messages[i + 1]["role"])
        i = j
    return traj


def context_index(traj: Trajectory, role: str, offset: int = 1) -> int:
    """An index (in token_ids) inside the first context span of `role`."""
    span = next(s for s in traj.spans if s.kind == "context" and s.role == role)
    assert span.length > offset + 2
    return len(traj.prompt_ids) + span.start + offset


def test_no_drift(codec):
    msgs = messages_for(codec)
    traj = episode(codec, msgs)
    assert_drift(codec, msgs, traj, DriftReport(None, None))


def test_non_canonical_split_of_sampled_text_is_sampled(codec):
    msgs = kept(codec, messages_for(codec))
    traj = episode(codec, msgs, {2: char_split(codec, msgs, 2, "world")})
    first = codec.drift(msgs, traj.token_ids)
    assert first is not None and traj.token_ids[first] != codec.encode(codec.render(msgs))[first]
    index, kind = drift_report(codec, msgs, traj)
    assert (index, kind) == (first, "sampled")
    assert traj.response_mask[index - len(traj.prompt_ids)] == 1


def test_sampled_retokenization_in_the_last_turn_and_several_turns(codec):
    """On gpt-oss, a split in a final answer whose <|return|> the template later writes as <|end|>
    read as bookkeeping (the whole turn's text was looked up at once); the text now departs at
    the end token, where the template rewrites: `template`."""
    msgs = messages_for(codec)
    gens = {
        2: char_split(codec, msgs, 2, "world"),
        4: char_split(codec, msgs, 4, "missing"),
        6: char_split(codec, msgs, 6, "import"),
    }
    traj = episode(codec, msgs, gens)
    want = DriftReport(codec.drift(msgs, traj.token_ids), "sampled")
    assert_drift(codec, msgs, traj, want)


def test_tampered_context_token_is_bookkeeping(codec):
    msgs = messages_for(codec)
    traj = episode(codec, msgs)
    at = context_index(traj, tool_role(codec), 2)
    traj.response_ids[at - len(traj.prompt_ids)] = codec.encode(" banana")[0]
    assert_drift(codec, msgs, traj, DriftReport(at, "bookkeeping"))


def test_context_with_the_right_text_but_another_split_is_bookkeeping(codec):
    """Same text, other ids, in a tool result: our continuation differs from the template's."""
    msgs = messages_for(codec)
    traj = episode(codec, msgs)
    span = next(s for s in traj.spans if s.kind == "context" and s.role == tool_role(codec))
    ctx = traj.response_ids[span.start : span.end]
    text = codec.decode(ctx)
    word = "README"
    at = text.index(word)
    split = (
        codec.encode(text[:at])
        + [t for ch in word for t in codec.encode(ch)]
        + codec.encode(text[at + len(word) :])
    )
    assert codec.decode(split) == text and split != ctx
    rebuilt = Trajectory(prompt_ids=traj.prompt_ids)
    for s in traj.spans:
        ids = traj.response_ids[s.start : s.end]
        if s.kind == "model":
            rebuilt.add_generation(ids, traj.response_logprobs[s.start : s.end])
        else:
            rebuilt.add_context(split if s is span else ids, role=s.role)
    want = DriftReport(codec.drift(msgs, rebuilt.token_ids), "bookkeeping")
    assert_drift(codec, msgs, rebuilt, want)


def test_bookkeeping_after_a_sampled_retokenization_is_not_hidden(codec):
    """The first difference is sampled; the rest is re-aligned on the text and a tampered tool
    result after it is still found, at its own index."""
    msgs = messages_for(codec)
    traj = episode(codec, msgs, {2: char_split(codec, msgs, 2, "world")})
    sampled_at = codec.drift(msgs, traj.token_ids)
    at = context_index(traj, tool_role(codec), 2)
    traj.response_ids[at - len(traj.prompt_ids)] = codec.encode(" banana")[0]
    assert codec.drift(msgs, traj.token_ids) == sampled_at  # the old check saw only the first
    assert_drift(codec, msgs, traj, DriftReport(at, "bookkeeping"))


def test_model_text_the_template_renders_differently_is_bookkeeping(codec):
    """A sampled span whose text is not the message the template renders: not a re-encoding."""
    msgs = messages_for(codec)
    gens = {4: turn_ids(codec, msgs, 4, "The test imports a missing package.")}
    traj = episode(codec, msgs, gens)
    want = DriftReport(codec.drift(msgs, traj.token_ids), "bookkeeping")
    assert_drift(codec, msgs, traj, want)


def test_missing_and_extra_tokens_are_bookkeeping(codec):
    msgs = messages_for(codec)
    convo = msgs[:-1]  # ends with a user turn: the generation prompt is due
    traj = episode(codec, msgs[:-2])
    cont = codec.continuation_ids(msgs[5:6], history=msgs[:5], held_ids=traj.token_ids)
    traj.add_context(cont[:-2], role="user")
    want = DriftReport(len(traj.token_ids), "bookkeeping")
    assert_drift(codec, convo, traj, want)
    full = episode(codec, msgs)
    full.add_context([codec.encode("x")[0]])
    extra = codec.drift(msgs, full.token_ids)
    # right where the running sequence goes on (a rewriting template departs earlier)
    assert (extra == len(full.token_ids) - 1) != rewrites(codec)
    assert_drift(codec, msgs, full, DriftReport(extra, "bookkeeping"))


def test_sampled_tokens_kept_in_a_rollback_prompt(codec):
    """A segment whose prompt holds earlier generated tokens: sampled only when `prompt_mask`
    says they were generated."""
    msgs = messages_for(codec)
    prompt = codec.prompt_ids(msgs[:2])
    gen = char_split(codec, msgs, 2, "world")
    cont = codec.continuation_ids(msgs[3:4], history=msgs[:3], held_ids=prompt + gen)
    traj = Trajectory(prompt_ids=prompt + gen + cont, reason="rollback")
    last = turn_ids(codec, msgs, 4)
    traj.add_generation(last, [-0.5] * len(last))
    convo = msgs[:5]
    mask = [0] * len(prompt) + [1] * len(gen) + [0] * len(cont)
    first = codec.drift(convo, traj.token_ids)
    assert_drift(codec, convo, traj, DriftReport(first, "sampled"), prompt_mask=mask)
    # Unmarked, the split is context that the template would not write: bookkeeping, unless it
    # lies where a rewriting template already departs (Qwen3's own: the think block before it).
    rewrites_at = template_rewrites_at(codec, convo)
    kind = "template" if rewrites_at is not None and first >= rewrites_at else "bookkeeping"
    assert drift_report(codec, convo, traj) == DriftReport(first, kind)
    with pytest.raises(ValueError):
        drift_report(codec, convo, traj, prompt_mask=[0])


def test_episode_drift_counts_bookkeeping_first():
    def seg(drift: int | None, kind: str | None) -> Trajectory:
        return Trajectory(prompt_ids=[1], drift=drift, drift_kind=kind)

    assert episode_drift([]) == DriftReport(None, None)
    assert episode_drift([seg(None, None), seg(None, None)]) == DriftReport(None, None)
    assert episode_drift([seg(7, "sampled"), seg(None, None)]) == DriftReport(7, "sampled")
    assert episode_drift([seg(7, "sampled"), seg(3, "bookkeeping")]) == DriftReport(3, "bookkeeping")
    assert episode_drift([seg(5, None)]) == DriftReport(5, "bookkeeping")  # a record without a kind
    stored = [seg(7, "sampled").to_dict(), seg(None, None).to_dict()]  # as a stored row holds them
    assert episode_drift(stored) == DriftReport(7, "sampled")


def test_generation_prompt_space_merged_into_sampled_text_is_sampled(smol_tokenizer):
    """A template whose generation prompt ends with a space: the render encodes `: Hello` as
    `:`, ` Hello` while the model, having seen the space, sampled `Hello`. The difference starts
    in the context (the space) but is the sampled text's re-encoding, not ours."""
    from tokens_sim import tokenizer_for

    template = smol_tokenizer.chat_template
    spaced = template.replace(
        "message['role'] + '\n' + message['content']", "message['role'] + ': ' + message['content']"
    ).replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant: '")
    assert spaced.count("': '") == 1 and "assistant: " in spaced
    codec = ChatCodec(tokenizer_for(smol_tokenizer, spaced))
    convo = [MESSAGES[1], MESSAGES[2], MESSAGES[5], MESSAGES[6]]  # user, assistant, user, assistant
    traj = episode(codec, convo)
    index, kind = drift_report(codec, convo, traj)
    assert kind == "sampled" and index == codec.drift(convo, traj.token_ids)
    assert index == len(traj.prompt_ids) - 1  # the prompt's trailing space, right before sampled text
    span = next(s for s in traj.spans if s.kind == "context")
    traj.response_ids[span.start + 4] = codec.encode(" banana")[0]
    assert drift_report(codec, convo, traj) == DriftReport(
        len(traj.prompt_ids) + span.start + 4, "bookkeeping"
    )


def _row(name: str, segments: list[Trajectory], metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    from uniagent.runner.store import episode_row

    result = {
        "exit_reason": "finished",
        "trainable": True,
        "metrics": metrics or {},
        "segments": [s.to_dict() for s in segments],
    }
    return episode_row(name, 0, result)


def test_run_summary_counts_bookkeeping_drift_and_sampled_retokenization_apart(tmp_path):
    """`make demo`'s summary said `episodes_with_drift: 2` for harmless sampled splits; now each
    kind has its own count and only bookkeeping reads as a problem."""
    from uniagent.runner import RunStore, summarize

    def seg(drift: int | None, kind: str | None, reason: str = "start") -> Trajectory:
        return Trajectory(prompt_ids=[1, 2], drift=drift, drift_kind=kind, reason=reason)

    store = RunStore(tmp_path / "run.db")
    store.put(_row("clean", [seg(None, None)]))
    store.put(_row("sampled", [seg(40, "sampled")]))
    store.put(_row("both", [seg(30, "sampled"), seg(12, "bookkeeping", "rewritten")]))
    store.put(_row("legacy", [], {"drift": 5}))  # an episode recorded without segments or kinds
    rows = {r["instance_id"]: r for r in store.rows(full=False)}
    assert {k: (r["drift"], r["drift_kind"]) for k, r in rows.items()} == {
        "clean": (None, None),
        "sampled": (40, "sampled"),
        "both": (12, "bookkeeping"),
        "legacy": (5, None),
    }
    summary = summarize(store)
    assert summary["episodes_with_bookkeeping_drift"] == 2  # "both" and the kindless "legacy"
    assert summary["episodes_with_sampled_retokenization"] == 1
    assert "episodes_with_drift" not in summary
    store.close()


def test_a_store_from_before_drift_kinds_gains_the_column(tmp_path):
    import sqlite3

    from uniagent.runner.store import SCHEMA, RunStore

    path = tmp_path / "run.db"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA.replace("    drift_kind TEXT,\n", ""))
    old.execute(
        "INSERT INTO episodes (instance_id, sample, exit_reason, trainable, resolved, turns, prompt_tokens,"
        " completion_tokens, drift, timings, metrics, messages, finished_at)"
        " VALUES ('old', 0, 'finished', 1, 0, 1, 10, 5, 7, '{}', '{}', '[]', 0)"
    )
    old.commit()
    old.close()
    readonly = RunStore(path, readonly=True)
    assert "drift_kind" not in readonly.columns
    [row] = readonly.rows(full=False)
    assert (row["drift"], row["drift_kind"]) == (7, None)
    readonly.close()
    store = RunStore(path)
    assert "drift_kind" in store.columns
    store.put(_row("sampled", [Trajectory(prompt_ids=[1], drift=3, drift_kind="sampled")]))
    assert [r["drift_kind"] for r in store.rows(full=False)] == [None, "sampled"]
    store.close()


def test_the_real_demo_episode_whose_drift_read_like_a_bug_is_sampled(smol_tokenizer):
    """A stored `make demo` episode of the real SmolLM2 (tests/fixtures/drift_demo_episode.json):
    `episodes_with_drift` counted it; the model sampled ' short' 'ened' for ' shortened'."""
    import json
    from pathlib import Path

    codec = ChatCodec(smol_tokenizer)
    data = json.loads((Path(__file__).parent / "fixtures" / "drift_demo_episode.json").read_text())
    messages, traj = data["messages"], Trajectory.from_dict(data["trajectory"])
    assert codec.drift(messages, traj.token_ids) == 1375
    assert drift_report(codec, messages, traj) == DriftReport(1375, "sampled")
    assert codec.decode(traj.token_ids[1375:1377]) == " shortened"
    # A context token after it, tampered, is still found.
    later = next(s for s in traj.spans if s.kind == "context" and len(traj.prompt_ids) + s.start > 1375)
    at = len(traj.prompt_ids) + later.start + 3
    traj.response_ids[at - len(traj.prompt_ids)] = codec.encode(" banana")[0]
    assert drift_report(codec, messages, traj) == DriftReport(at, "bookkeeping")
