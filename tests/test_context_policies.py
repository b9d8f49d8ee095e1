"""Context policies (issue 15 part 3): `none`, `window`, `summarize`.

Unit tests run each policy on message lists, sized by a real TokenChatModel (the SmolLM2 codec).
Loop tests run the SWE calc task end to end (real bubblewrap sandbox, real tools and grader) with
scripted model turns (ReplayEngine) and a context cap small enough that the task and a turn or two
fill it: `window` and `summarize` condense and finish, `none` ends `context_limit`; every
generated token is in exactly one segment with mask 1 and its own logprob, the condensed
segments' prompts are rendered afresh, and the stored messages keep the full history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_helpers import call, make_swe_task_file, scripted_model
from conftest import needs_bwrap
from token_checks import assert_every_generated_token_once
from uniagent.agent import AgentConfig, AgentInteraction, EpisodeResult, ExitReason
from uniagent.agent.base import AgentBase, Episode
from uniagent.agent.config import ContextConfig
from uniagent.agent.context import POLICIES, Request, create_policy, split_turns
from uniagent.agent.context.summarize import SUMMARY_REQUEST
from uniagent.errors import ConfigError
from uniagent.runner.config import build_config
from uniagent.tasks import load_tasks, run_episode
from uniagent.tasks.swe import SweTask
from uniagent.tokens import ChatCodec

TASK = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "add() subtracts."}]


def turns(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out += [
            {"role": "assistant", "content": f"Step {i}: I look at file number {i}."},
            {"role": "user", "content": f"Output of step {i}: " + "line of text. " * 8},
        ]
    return out


def request(model: Any, history: list[dict[str, Any]], target: int = 10**6, **kw: Any) -> Request:
    """What the loop hands a policy for `history` (the task is `TASK`; no tools)."""
    kw = {"noted": False, "room": None, **kw}
    return Request(history=history, head=len(TASK), model=model, tools=None, target=target, **kw)


class Made(list):
    """(ids, logprobs) of every scripted generation: the exactly-once check's `gen.made`."""

    @property
    def made(self) -> Made:
        return self


# -- policies on message lists ----------------------------------------------------------------


def test_split_turns_starts_each_turn_at_an_assistant_message() -> None:
    body = [{"role": "user", "content": "note"}, *turns(2)]
    assert [len(t) for t in split_turns(body)] == [1, 2, 2]
    assert split_turns([]) == []


async def test_window_keeps_the_task_a_note_and_the_last_turns(codec: ChatCodec) -> None:
    model = scripted_model(codec, [])
    policy = create_policy(ContextConfig(policy="window", keep_turns=2))
    history = [*TASK, *turns(5)]
    out = await policy.condense(request(model, history))
    assert out is not None and out.dropped_turns == 3
    assert out.history[:2] == TASK and out.history[3:] == history[-4:]
    assert out.history[2] == {"role": "user", "content": out.note} and "3 earlier turns" in out.note
    assert out.tokens == len(codec.prompt_ids(out.history))
    # A second compression replaces the note (never stacks them) and counts the running total.
    again = await policy.condense(request(model, [*out.history, *turns(3)], noted=True))
    assert again is not None and again.history[:2] == TASK
    assert sum(m["content"].startswith("[Context note") for m in again.history) == 1
    assert "6 earlier turns" in again.note  # 3 before + the 2 kept then and 1 of the new 3


async def test_window_keeps_fewer_turns_when_they_do_not_fit_and_gives_up_on_the_task_alone(
    codec: ChatCodec,
) -> None:
    model = scripted_model(codec, [])
    history = [*TASK, *turns(5)]

    async def window(keep: int, target: int = 10**6) -> Any:
        return await create_policy(ContextConfig(policy="window", keep_turns=keep)).condense(
            request(model, history, target=target)
        )

    two = await window(2)
    out = await window(3, target=two.tokens)  # three turns do not fit, nor two: one is kept
    assert out is not None and out.dropped_turns == 4 and out.history[3:] == history[-2:]
    assert await window(3, target=len(codec.prompt_ids(TASK))) is None
    none = create_policy(ContextConfig(policy="none"))
    assert await none.condense(request(model, history)) is None


async def test_summarize_asks_the_policy_model_in_its_own_segment(codec: ChatCodec) -> None:
    made = Made()
    model = scripted_model(codec, ["Found the bug: add uses minus."], made=made)
    policy = create_policy(ContextConfig(policy="summarize", keep_turns=1))
    history = [*TASK, *turns(3)]
    out = await policy.condense(request(model, history, room=500))
    assert out is not None and out.dropped_turns == 2 and out.history[3:] == history[-2:]
    assert "Found the bug: add uses minus." in out.note
    ask, reply = out.transcript
    assert ask == {"role": "user", "content": SUMMARY_REQUEST} and reply["role"] == "assistant"
    assert out.metrics == {"summary_tokens": len(made[0][0])}
    # The summary is the policy model's generation: mask 1, in the model's token record.
    assert_every_generated_token_once(model.segments, made)


async def test_summarize_without_room_drops_turns_with_a_note(codec: ChatCodec) -> None:
    model = scripted_model(codec, [])  # no scripted turn: a query would fail the test
    policy = create_policy(ContextConfig(policy="summarize", keep_turns=1))
    out = await policy.condense(request(model, [*TASK, *turns(3)], room=20))
    assert out is not None and out.metrics == {"summaries_skipped": 1} and out.transcript == []
    assert "no room was left to summarize" in out.note and model.segments == []


async def test_another_summarizer_writes_an_untrained_summary(codec: ChatCodec) -> None:
    model = scripted_model(codec, [])
    other = scripted_model(codec, ["The agent read files 0 to 2."])
    policy = create_policy(ContextConfig(policy="summarize", keep_turns=0))
    out = await policy.condense(request(model, [*TASK, *turns(3)], summarizer=other))
    assert out is not None and "The agent read files 0 to 2." in out.note and out.transcript == []
    assert out.metrics["summary_tokens_untrained"] > 0 and model.segments == []
    assert "ASSISTANT: Step 0" in other.conversation.segments[0].messages[1]["content"]  # a transcript


def test_context_config_is_checked_and_set_per_run(tmp_path: Path) -> None:
    assert set(POLICIES) == {"none", "window", "summarize"}
    with pytest.raises(ValueError, match="unknown context policy 'trim'"):
        AgentConfig(context={"policy": "trim"})
    with pytest.raises(ValueError, match=r"set agent\.max_context_tokens"):
        AgentConfig(context={"policy": "window"})
    with pytest.raises(ValueError, match="extra"):
        ContextConfig(policy="window", keep=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="must be below"):
        AgentConfig(max_context_tokens=1000, context={"policy": "window", "compress_at_tokens": 1000})
    assert AgentConfig(max_context_tokens=1000, context={"policy": "window"}).compress_threshold() == 750
    assert AgentConfig(max_context_tokens=1000).compress_threshold() is None
    path = tmp_path / "run.yaml"
    path.write_text("agent: {max_context_tokens: 4096, context: {policy: summarize, keep_turns: 1}}\n")
    cfg = build_config(path, overrides=["agent.context.compress_at=0.5"])
    assert cfg.agent.context.policy == "summarize" and cfg.agent.compress_threshold() == 2048
    with pytest.raises(ConfigError, match=r"config agent\.context\.policy"):
        build_config(path, overrides=["agent.context.policy=trim"])


# -- through the loop -------------------------------------------------------------------------

LOOK = [
    call("bash", command="cat calc.py"),
    call("bash", command="ls tests"),
    call("bash", command="cat tests/test_calc.py"),
]
FIX = [
    call("str_replace_editor", command="str_replace", path="calc.py", old_str="a - b", new_str="a + b"),
    call("submit"),
]
SUMMARY = "So far: calc.py has add() returning a - b; the tests call add(2, 3). Next: fix it."


@pytest.fixture
def task(tmp_path: Path) -> SweTask:
    [t] = load_tasks(str(make_swe_task_file(tmp_path)))
    assert isinstance(t, SweTask)
    return t


def small(policy: str, head: int, keep_turns: int = 1) -> AgentConfig:
    """A context cap a few turns above the task's own prompt (`head` tokens), condensing earlier."""
    context = {"policy": policy, "keep_turns": keep_turns, "compress_at_tokens": head + 160}
    return AgentConfig(max_context_tokens=head + 360, max_turns=12, context=context)


_HEAD: list[int] = []


async def head_tokens(task: SweTask, codec: ChatCodec) -> int:
    """Tokens of the task's first prompt (system with the tools, task), measured once."""
    if not _HEAD:
        res = await run_episode(task, scripted_model(codec, [call("submit")]))
        _HEAD.append(len(res.segments[0].prompt_ids))
    return _HEAD[0]


def check_record(res: EpisodeResult, made: Made, codec: ChatCodec) -> list[dict[str, Any]]:
    """Every generated token once with mask 1; each condensed segment's prompt is the condensed
    history rendered afresh (as the marker says); returns the markers."""
    assert_every_generated_token_once(res.segments, made)
    markers = [m for m in res.messages if m["role"] == "context"]
    assert len(markers) == res.metrics["context_compressions"] == len(res.segments) - 1
    for marker, seg in zip(markers, res.segments[1:], strict=True):
        assert seg.reason == "condensed" and seg.chain == 0
        assert len(seg.prompt_ids) == marker["condensed"]["tokens_after"]
        assert codec.decode(seg.prompt_ids).count(marker["content"]) == 1
    assert res.metrics["context_tokens_before"] == [m["condensed"]["tokens_before"] for m in markers]
    return markers


@needs_bwrap
async def test_window_condenses_and_finishes_where_none_hits_context_limit(
    task: SweTask, codec: ChatCodec
) -> None:
    head = await head_tokens(task, codec)
    script = [*LOOK, *LOOK, *FIX]
    none = await run_episode(task, scripted_model(codec, script), small("none", head))
    assert none.exit_reason == ExitReason.CONTEXT_LIMIT and len(none.segments) == 1

    made = Made()
    res = await run_episode(task, scripted_model(codec, script, made=made), small("window", head))
    assert res.exit_reason == ExitReason.FINISHED and res.resolved, res.error
    markers = check_record(res, made, codec)
    assert len(markers) >= 1 and all(m["condensed"]["policy"] == "window" for m in markers)
    assert all(
        b >= head + 160 > a
        for b, a in zip(
            res.metrics["context_tokens_before"], res.metrics["context_tokens_after"], strict=True
        )
    )
    # The stored messages are the full history: every model turn, in order, with markers between.
    assistants = [m["content"] for m in res.messages if m["role"] == "assistant"]
    assert len(assistants) == res.metrics["turns"] == len(script)
    assert res.messages[:2] == task.messages()


@needs_bwrap
async def test_summarize_trains_the_summary_in_the_segment_it_ends(task: SweTask, codec: ChatCodec) -> None:
    head = await head_tokens(task, codec)
    made = Made()
    script = [*LOOK, LOOK[0], SUMMARY, *FIX]  # the segment reaches the threshold after four turns
    res = await run_episode(
        task, scripted_model(codec, script, made=made), small("summarize", head, keep_turns=0)
    )
    assert res.exit_reason == ExitReason.FINISHED and res.resolved, res.error
    [marker] = check_record(res, made, codec)
    assert SUMMARY in marker["content"] and res.metrics["summary_tokens"] == len(made[4][0])
    first, second = res.segments
    # The summary is generated at the end of the first segment (mask 1, trained) and the second
    # segment's prompt carries it as context.
    assert first.spans[-1].kind == "model" and first.response_ids[first.spans[-1].start :] == made[4][0]
    assert SUMMARY in codec.decode(second.prompt_ids)
    i = res.messages.index(marker)
    assert res.messages[i - 2] == {"role": "user", "content": SUMMARY_REQUEST}
    assert res.messages[i - 1]["content"] == SUMMARY


@needs_bwrap
async def test_a_policy_that_cannot_make_room_ends_context_limit(task: SweTask, codec: ChatCodec) -> None:
    head = await head_tokens(task, codec)
    cfg = AgentConfig(
        max_context_tokens=head + 300, context={"policy": "window", "compress_at_tokens": head - 10}
    )
    res = await run_episode(task, scripted_model(codec, [*LOOK, *FIX]), cfg)
    assert res.exit_reason == ExitReason.CONTEXT_LIMIT
    assert res.metrics["context_limit_reason"] == "the context policy could not make room"
    assert "context_compressions" not in res.metrics and len(res.segments) == 1


class SummarizedBy(AgentBase):
    """The react agent with another model summarizing (what a runner would inject)."""

    name = "react"

    def __init__(self, summarizer: Any) -> None:
        self.summarizer = summarizer

    async def run(self, episode: Episode) -> EpisodeResult:
        loop = AgentInteraction(episode.model, episode.tools, episode.config, summarizer=self.summarizer)
        # Graded by `run_episode`, as every agent's episode is (uniagent.tasks.grading).
        return await loop.run(episode.task.messages(), episode.sandbox)


@needs_bwrap
async def test_another_summarizers_tokens_are_in_no_segment(task: SweTask, codec: ChatCodec) -> None:
    head = await head_tokens(task, codec)
    made, theirs = Made(), Made()
    other = scripted_model(codec, [SUMMARY], made=theirs)
    script = [*LOOK, LOOK[0], *FIX]
    res = await run_episode(
        task,
        scripted_model(codec, script, made=made),
        small("summarize", head, keep_turns=0),
        agent=SummarizedBy(other),
    )
    assert res.exit_reason == ExitReason.FINISHED and res.resolved, res.error
    [marker] = check_record(res, made, codec)
    assert SUMMARY in marker["content"] and res.metrics["summary_tokens_untrained"] == len(theirs[0][0])
    policy_tokens = [
        t for seg in res.segments for t, m in zip(seg.response_ids, seg.response_mask, strict=True) if m
    ]
    assert (
        sum(seg.num_model_tokens for seg in res.segments)
        == sum(len(ids) for ids, _ in made)
        == len(policy_tokens)
    )


@needs_bwrap
@pytest.mark.parametrize("follow", [False, True])
async def test_reasoning_stripped_by_the_template_through_the_loop(
    task: SweTask, codec: ChatCodec, follow: bool
) -> None:
    """A Qwen3-style template drops earlier reasoning once a user message follows (here the loop's
    format-error reply). model.history exact: one segment, the model keeps its reasoning, drift of
    kind `template`. model.history template: a `template` segment rendered as the template does.
    Either way every generated token is stored once with mask 1."""
    from token_checks import STRIPS_REASONING

    qwenish = ChatCodec(codec.tokenizer, chat_template=STRIPS_REASONING)
    made = Made()
    script = ["<think>look before fixing</think>I will look first.", "<think>fix it</think>" + FIX[0], FIX[1]]
    model = scripted_model(qwenish, script, made=made)
    model.follow_template = follow
    model.reset(model.request_id)
    res = await run_episode(task, model)
    assert res.exit_reason == ExitReason.FINISHED and res.resolved, res.error
    assert_every_generated_token_once(res.segments, made)
    if follow:
        assert [s.reason for s in res.segments] == ["start", "template"]
        assert "look before fixing" not in qwenish.decode(res.segments[1].prompt_ids)
    else:
        (seg,) = res.segments
        assert seg.drift is not None and seg.drift_kind == "template"
        assert "look before fixing" in qwenish.decode(seg.token_ids)
