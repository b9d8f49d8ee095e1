"""Drift by kind on the real SmolLM2 codec: a sampled retokenization (harmless) vs a bookkeeping
error (ours), including a bookkeeping error hidden behind an earlier sampled one."""

from __future__ import annotations

from typing import Any

import pytest

import real_tokenizers as real
from uniagent.tokens import ChatCodec, Trajectory
from uniagent.tokens.drift import DriftReport, drift_report, episode_drift

# Real pairs whose hand-built episodes below are the template's own (append-only templates, a
# generation = the content + end-of-turn). Qwen3's own template (it adds an empty think block to
# the last turn) and gpt-oss's (a generation starts with its channel header) are not: their drift
# kinds are checked on simulated episodes in test_codec.py's test_drift_kinds_on_real_templates.
DRIFT_PAIRS = ("llama3_1-own", "deepseek_v3-own", "gemma3-own", "qwen3-Qwen3-Coder")


@pytest.fixture(scope="module", params=["smollm2", *DRIFT_PAIRS])
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


def canonical(codec: ChatCodec, text: str) -> list[int]:
    """What a model that samples the tokenizer's own split emits: the text, then end-of-turn."""
    return codec.encode(text) + codec.eot_ids


def char_split(codec: ChatCodec, text: str, word: str) -> list[int]:
    """The same text with `word` sampled one character per token (a non-canonical split)."""
    before, after = text.split(word, 1)
    ids = codec.encode(before) + [t for ch in word for t in codec.encode(ch)] + codec.encode(after)
    assert codec.decode(ids) == text and ids != codec.encode(text)
    return ids + codec.eot_ids


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
        gen = generations.get(i) or canonical(codec, messages[i]["content"])
        traj.add_generation(gen, [-0.25] * len(gen))
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if i + 1 < j:
            traj.add_context(codec.continuation_ids(messages[i + 1 : j]), role=messages[i + 1]["role"])
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
    assert drift_report(codec, msgs, traj) == DriftReport(None, None)


def test_non_canonical_split_of_sampled_text_is_sampled(codec):
    msgs = messages_for(codec)
    text = msgs[2]["content"]
    traj = episode(codec, msgs, {2: char_split(codec, text, "world")})
    first = codec.drift(msgs, traj.token_ids)
    assert first is not None and traj.token_ids[first] != codec.encode(codec.render(msgs))[first]
    index, kind = drift_report(codec, msgs, traj)
    assert (index, kind) == (first, "sampled")
    assert traj.response_mask[index - len(traj.prompt_ids)] == 1


def test_sampled_retokenization_in_the_last_turn_and_several_turns(codec):
    msgs = messages_for(codec)
    gens = {
        2: char_split(codec, msgs[2]["content"], "world"),
        4: char_split(codec, msgs[4]["content"], "missing"),
        6: char_split(codec, msgs[6]["content"], "import"),
    }
    traj = episode(codec, msgs, gens)
    assert drift_report(codec, msgs, traj) == DriftReport(codec.drift(msgs, traj.token_ids), "sampled")


def test_tampered_context_token_is_bookkeeping(codec):
    msgs = messages_for(codec)
    traj = episode(codec, msgs)
    at = context_index(traj, tool_role(codec), 2)
    traj.response_ids[at - len(traj.prompt_ids)] = codec.encode(" banana")[0]
    assert drift_report(codec, msgs, traj) == DriftReport(at, "bookkeeping")


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
    index, kind = drift_report(codec, msgs, rebuilt)
    assert kind == "bookkeeping" and index == codec.drift(msgs, rebuilt.token_ids)


def test_bookkeeping_after_a_sampled_retokenization_is_not_hidden(codec):
    """The first difference is sampled; the rest is re-aligned on the text and a tampered tool
    result after it is still found, at its own index."""
    msgs = messages_for(codec)
    traj = episode(codec, msgs, {2: char_split(codec, msgs[2]["content"], "world")})
    sampled_at = codec.drift(msgs, traj.token_ids)
    at = context_index(traj, tool_role(codec), 2)
    traj.response_ids[at - len(traj.prompt_ids)] = codec.encode(" banana")[0]
    assert codec.drift(msgs, traj.token_ids) == sampled_at  # the old check saw only the first
    assert drift_report(codec, msgs, traj) == DriftReport(at, "bookkeeping")


def test_model_text_the_template_renders_differently_is_bookkeeping(codec):
    """A sampled span whose text is not the message the template renders: not a re-encoding."""
    msgs = messages_for(codec)
    gens = {4: canonical(codec, "The test imports a missing package.")}
    traj = episode(codec, msgs, gens)
    index, kind = drift_report(codec, msgs, traj)
    assert kind == "bookkeeping" and index == codec.drift(msgs, traj.token_ids)


def test_missing_and_extra_tokens_are_bookkeeping(codec):
    msgs = messages_for(codec)
    convo = msgs[:-1]  # ends with a user turn: the generation prompt is due
    traj = episode(codec, msgs[:-2])
    traj.add_context(codec.continuation_ids(msgs[5:6])[:-2], role="user")
    assert drift_report(codec, convo, traj) == DriftReport(len(traj.token_ids), "bookkeeping")
    full = episode(codec, msgs)
    full.add_context([codec.encode("x")[0]])
    extra = codec.drift(msgs, full.token_ids)
    assert extra == len(full.token_ids) - 1  # right where the running sequence goes on
    assert drift_report(codec, msgs, full) == DriftReport(extra, "bookkeeping")


def test_sampled_tokens_kept_in_a_rollback_prompt(codec):
    """A segment whose prompt holds earlier generated tokens: sampled only when `prompt_mask`
    says they were generated."""
    msgs = messages_for(codec)
    text = msgs[2]["content"]
    prompt = codec.prompt_ids(msgs[:2])
    gen = char_split(codec, text, "world")
    cont = codec.continuation_ids(msgs[3:4])
    traj = Trajectory(prompt_ids=prompt + gen + cont, reason="rollback")
    last = canonical(codec, msgs[4]["content"])
    traj.add_generation(last, [-0.5] * len(last))
    convo = msgs[:5]
    mask = [0] * len(prompt) + [1] * len(gen) + [0] * len(cont)
    first = codec.drift(convo, traj.token_ids)
    assert drift_report(codec, convo, traj, prompt_mask=mask) == DriftReport(first, "sampled")
    assert drift_report(codec, convo, traj) == DriftReport(first, "bookkeeping")
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
