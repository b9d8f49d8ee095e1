"""Per-step work that grew with an episode's history, now bounded (issue 14, framework CPU per step).

Behaviour, not timing: each test checks that the cheaper path gives the same result as before
(digests, redacted rows, history checks) and that the work per turn no longer covers the whole
history. The tokenizer is the real SmolLM2 one (`codec`); the engines are scripted, as the
token-level bookkeeping needs exact control over what is "generated".
"""

from __future__ import annotations

import copy
import random
import sys

import pytest

from conftest import needs_bwrap
from uniagent.errors import EngineError
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.replay import ReplayEngine, ReplayRecord, _PromptHasher, prompt_hash
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser
from uniagent.redact import MASK, Redactor

# ------------------------------------------------------------------------------ replay hashes


def test_incremental_prompt_hash_equals_the_recorded_digest() -> None:
    """Recorded files hold `prompt_hash` digests; the per-request hasher must give the same ones
    for growing prompts, and start over when a prompt does not extend the previous one."""
    rng = random.Random(14)
    hasher = _PromptHasher()
    ids: list[int] = []
    for _ in range(6):
        ids = ids + [rng.randrange(50_000) for _ in range(rng.randrange(0, 40))]
        assert hasher.digest(ids) == prompt_hash(ids)
        assert len(hasher.ids) == len(ids)
    for other in ([], ids[:3], [7, *ids[1:]], [*ids[:-1], ids[-1] + 1], [5], [5, 6]):
        assert hasher.digest(list(other)) == prompt_hash(list(other))


async def test_replay_checks_hash_only_recordings_turn_by_turn() -> None:
    """A recording without prompt ids (only hashes, as bench/runner.py writes) still replays in
    request mode, and a prompt that changed at a later turn is still refused."""
    p1 = [1, 2, 3]
    g1 = Generation([10, 11], [-0.1, -0.2], "stop")
    p2 = [*p1, 10, 11, 4, 5]
    g2 = Generation([12], [-0.3], "stop")
    records = [
        ReplayRecord("ep", g1, turn=0, prompt_hash=prompt_hash(p1)),
        ReplayRecord("ep", g2, turn=1, prompt_hash=prompt_hash(p2)),
    ]
    engine = ReplayEngine(copy.deepcopy(records))
    assert (await engine.generate(p1, SamplingParams(), "ep")).token_ids == [10, 11]
    assert (await engine.generate(p2, SamplingParams(), "ep")).token_ids == [12]
    engine = ReplayEngine(copy.deepcopy(records))
    await engine.generate(p1, SamplingParams(), "ep")
    with pytest.raises(EngineError, match="turn 1: prompt differs"):
        await engine.generate([*p1, 10, 11, 4, 6], SamplingParams(), "ep")


# ------------------------------------------------------------------------------ redaction


def test_redacting_a_result_copies_number_lists_whole_and_still_masks_strings() -> None:
    secret = "sk-live-abcdef123456"
    r = Redactor(extra=[secret], env={})
    ids = list(range(5000))
    row = {
        "trajectory": {"prompt_ids": ids, "response_logprobs": [-0.5, None, 0.0], "mask": (1, 0, True)},
        "messages": [{"role": "tool", "content": f"key={secret}"}, [1, f"x{secret}"]],
    }
    out = r.data(row)
    assert out["trajectory"]["prompt_ids"] == ids and out["trajectory"]["prompt_ids"] is not ids
    assert out["trajectory"]["response_logprobs"] == [-0.5, None, 0.0]
    assert out["trajectory"]["mask"] == [1, 0, True]
    assert out["messages"] == [{"role": "tool", "content": f"key={MASK}"}, [1, f"x{MASK}"]]
    assert row["messages"][0]["content"] == f"key={secret}"  # the input is left as it was
    nothing = Redactor(env={})  # no secret to look for: nothing to copy either
    assert nothing.data(row) is row and nothing.result(row) is row


# ------------------------------------------------------------------------------ token chat history

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
CALL = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'


class _Scripted:
    def __init__(self, codec) -> None:  # type: ignore[no-untyped-def]
        self.codec = codec

    async def generate(self, prompt_ids, sampling, request_id):  # type: ignore[no-untyped-def]
        ids = self.codec.encode(CALL) + self.codec.eot_ids
        return Generation(ids, [-0.25] * len(ids), "stop")


async def test_token_chat_copies_each_message_once_and_still_catches_a_rewritten_history(
    codec, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The history kept for the append-only check was deep-copied whole every turn (work growing
    with the episode); now each message is copied once, and a rewrite is still detected."""
    from uniagent.tokens import conversation

    copied: list[int] = []
    real = copy.deepcopy

    def counting(x):  # type: ignore[no-untyped-def]
        if sys._getframe(1).f_code.co_filename == conversation.__file__:  # the history copy only
            copied.append(len(x))
        return real(x)

    monkeypatch.setattr(copy, "deepcopy", counting)
    chat = TokenChatModel(_Scripted(codec), codec, get_parser("hermes"), SamplingParams(max_tokens=64))
    messages: list[dict] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    for i in range(6):
        turn = await chat.query(messages, TOOLS)
        messages += [
            turn.message,
            {"role": "tool", "content": f"out {i}", "tool_call_id": turn.tool_calls[0].id},
        ]
    assert copied == [2, 1, 1, 1, 1, 1]  # the first prompt, then each turn's one new tool message
    messages[1]["content"] = "rewritten"
    await chat.query(messages, TOOLS)
    assert [t.reason for t in chat.segments] == ["start", "rewritten"]


# ------------------------------------------------------------------------------ garbage collector


@needs_bwrap
def test_a_run_freezes_what_exists_at_its_start_out_of_the_collector(tmp_path, codec) -> None:  # type: ignore[no-untyped-def]
    """Each full collection during a run traversed every object of its set-up again (modules,
    tokenizer, codec); a run freezes them (`gc.freeze`) before its first episode."""
    import asyncio
    import gc

    from run_helpers import write_replay
    from uniagent.runner import build_config
    from uniagent.runner.run import Runner
    from uniagent.tasks import load_tasks

    tasks = load_tasks("builtin:starter")[:1]
    replay = write_replay(tmp_path / "replay.jsonl", codec, tasks)
    cfg = build_config(
        None,
        [
            f"model.spec=replay:{replay}",
            f"tasks.ids=[{tasks[0].instance_id}]",
            f"runner.output={tmp_path / 'run'}",
        ],
    )
    made_before = [object()]
    gc.unfreeze()
    try:
        summary = asyncio.run(Runner(cfg).run())
        assert summary["episodes"] == 1 and summary["resolved"] == 1
        assert gc.get_freeze_count() > 0
        assert not any(o is made_before for o in gc.get_objects())  # frozen: out of every generation
    finally:
        gc.unfreeze()


async def test_replay_takes_the_replayed_record_out_of_the_prompt_pool_without_comparing(monkeypatch) -> None:
    """The samples of one task share every prompt: request-mode replay must take exactly the
    record it replayed out of that prompt's pool (a later prompt-mode fallback must not reuse it),
    without comparing records field by field (that was a scan of the pool per turn)."""
    prompt = [1, 2, 3]
    records = [
        ReplayRecord(f"s{i}", Generation([10 + i], [-0.1], "stop"), prompt_ids=list(prompt)) for i in range(5)
    ]
    engine = ReplayEngine(records, strict=False)
    compared = []
    monkeypatch.setattr(ReplayRecord, "__eq__", lambda a, b: compared.append(1) or a is b)
    for i in (3, 0, 4):
        assert (await engine.generate(prompt, SamplingParams(), f"s{i}")).token_ids == [10 + i]
    assert [r.request_id for r in engine._by_prompt[records[0].prompt_hash]] == ["s1", "s2"]
    # A request with nothing recorded falls back to the prompt pool: the first one not replayed yet.
    assert (await engine.generate(prompt, SamplingParams(), "other")).token_ids == [11]
    assert compared == []


def test_tool_schemas_are_built_once_per_args_model_and_handed_out_as_copies(monkeypatch) -> None:
    """Every episode asks its tools for their specs: the JSON schema is built from `Args` once per
    model (pydantic builds it anew on each call), and every caller gets the same schema as a
    copy of its own."""
    import weakref

    from pydantic import BaseModel

    from uniagent.tools import base, build_tools

    names = ["bash", "str_replace_editor", "submit"]
    monkeypatch.setattr(base, "_schemas", weakref.WeakKeyDictionary(), raising=False)
    first = [t.spec() for t in build_tools(names)]
    built: list[type] = []
    original = BaseModel.model_json_schema.__func__  # type: ignore[attr-defined]

    def counted(cls, *args, **kwargs):
        built.append(cls)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(BaseModel, "model_json_schema", classmethod(counted))
    for _ in range(20):  # twenty episodes
        specs = [t.spec() for t in build_tools(names)]
        assert specs == first
    assert built == []
    specs[1]["function"]["parameters"]["properties"].clear()
    assert [t.spec() for t in build_tools(names)] == first
    monkeypatch.setattr(base, "_schemas", weakref.WeakKeyDictionary(), raising=False)
    assert [t.spec() for t in build_tools(names)] == first
    assert len(built) == len(names)
