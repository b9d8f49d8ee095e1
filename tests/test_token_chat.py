"""TokenChatModel bookkeeping with a scripted engine.

A scripted engine stands in here (not the real model) because these tests need exact control
over what is "generated": cut turns, garbage output, abort. The real model is covered in
test_fidelity.py.
"""

from __future__ import annotations

import pytest

import real_tokenizers as real
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


class ScriptedEngine:
    def __init__(self, codec, texts, finish):
        self.codec = codec
        self.script = list(zip(texts, finish, strict=True))
        self.seen_sampling = []

    async def generate(self, prompt_ids, sampling, request_id):
        self.seen_sampling.append(sampling)
        text, finish = self.script.pop(0)
        ids = self.codec.encode(text) + (self.codec.eot_ids if finish == "stop" else [])
        return Generation(ids, [-0.25] * len(ids), finish)


# Qwen2.5's template writes `arguments | tojson`: the codec hands it the arguments as a mapping
CHAT_PAIRS = ("qwen3-own", "qwen3-Qwen3", "qwen3-Qwen2.5", "llama3_1-own", "deepseek_v3-own")


@pytest.fixture(params=["smollm2", *CHAT_PAIRS])
def chat_codec(request, codec):  # type: ignore[no-untyped-def]
    """SmolLM2's codec and real tokenizers whose templates take a tool role."""
    return real.codec_or_smol(request, codec)


async def test_cut_turn_gets_end_of_turn_as_context(chat_codec):
    codec = chat_codec
    engine = ScriptedEngine(
        codec,
        [
            # as Qwen2.5's template writes a tool call (it renders them natively)
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
            "I was cut off mid",
            "Done.",
        ],
        ["stop", "length", "stop"],
    )
    chat = TokenChatModel(engine, codec, get_parser("hermes"), SamplingParams(max_tokens=64))
    messages = [{"role": "user", "content": "go"}]
    turn = await chat.query(messages, TOOLS)
    assert turn.tool_calls[0].name == "bash" and turn.tool_calls[0].arguments == {"command": "ls"}
    messages += [turn.message, {"role": "tool", "content": "a.py", "tool_call_id": turn.tool_calls[0].id}]
    turn = await chat.query(messages, TOOLS)
    assert turn.finish_reason == "length" and turn.text == "I was cut off mid"
    messages += [turn.message, {"role": "user", "content": "continue"}]
    turn = await chat.query(messages, TOOLS)
    messages.append(turn.message)
    (traj,) = chat.finish(messages, TOOLS)
    # The cut turn is closed with the end-of-turn as context (mask 0), right after it.
    cut = [s for s in traj.spans if s.kind == "model"][1]
    after = next(s for s in traj.spans if s.start == cut.end)
    assert after.kind == "context" and traj.response_ids[after.start : after.end] == codec.eot_ids
    if codec.kind.kind == "rewriting":
        assert traj.drift_kind == "template"  # Qwen3: the last turn's think block goes in history
    else:
        assert traj.drift is None
    # The engine was told to stop at the template's end-of-turn, not the tokenizer's eos.
    assert codec.stop_token_ids[0] in engine.seen_sampling[0].stop_token_ids
    if codec.tokenizer.eos_token_id not in codec.eot_ids:  # SmolLM2's eos_token is <|im_start|>
        assert codec.tokenizer.eos_token_id not in engine.seen_sampling[0].stop_token_ids


async def test_garbage_output_is_a_format_error_not_a_crash(codec):
    engine = ScriptedEngine(codec, ['<tool_call>{"name": "bash", "argum'], ["stop"])
    chat = TokenChatModel(engine, codec, get_parser("hermes"))
    turn = await chat.query([{"role": "user", "content": "go"}], TOOLS)
    assert turn.format_error and "bash" in turn.format_error
    assert turn.tool_calls == []
    assert chat.trajectory.num_model_tokens == turn.completion_tokens


async def test_tools_go_to_the_system_prompt_when_template_lacks_them(codec):
    engine = ScriptedEngine(codec, ["hi"], ["stop"])
    chat = TokenChatModel(engine, codec, get_parser("hermes"))
    await chat.query([{"role": "user", "content": "go"}], TOOLS)
    prompt = codec.decode(chat.trajectory.prompt_ids)
    assert not codec.renders_tool_calls
    assert "bash" in prompt and "<tool_call>" in prompt


class VersionedEngine:
    """Scripted like `ScriptedEngine`, and it says which policy version sampled each token: turn 1
    all version 0; turn 2 interrupted by a weight update halfway (partial rollout: 0 ... 0 1 ... 1)."""

    def __init__(self, codec, texts):
        self.codec = codec
        self.texts = list(texts)
        self.turn = 0

    async def generate(self, prompt_ids, sampling, request_id):
        ids = self.codec.encode(self.texts.pop(0)) + self.codec.eot_ids
        half = len(ids) // 2 if self.turn else len(ids)
        self.turn += 1
        versions = [0] * half + [1] * (len(ids) - half)
        return Generation(ids, [-0.5] * len(ids), "stop", versions)


async def _two_turns(chat):
    messages = [{"role": "user", "content": "go"}]
    turn = await chat.query(messages, TOOLS)
    messages += [turn.message, {"role": "tool", "content": "a.py", "tool_call_id": turn.tool_calls[0].id}]
    messages.append((await chat.query(messages, TOOLS)).message)
    (traj,) = chat.finish(messages, TOOLS)
    return traj


async def test_policy_versions_reach_the_record_and_survive_record_replay(codec, tmp_path):
    from uniagent.models.replay import RecordingEngine, ReplayEngine

    texts = ['<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', "The file is a.py."]
    recorder = RecordingEngine(VersionedEngine(codec, texts))
    traj = await _two_turns(TokenChatModel(recorder, codec, get_parser("hermes"), request_id="ep"))
    first, second = [s for s in traj.spans if s.kind == "model"]
    versions = traj.response_versions
    assert len(versions) == len(traj.response_ids)
    assert set(versions[first.start : first.end]) == {0}
    turn2 = versions[second.start : second.end]
    assert turn2 == sorted(turn2) and set(turn2) == {0, 1}  # interrupted mid-turn
    assert all(v == -1 for v, m in zip(versions, traj.response_mask, strict=True) if not m)
    assert traj.version_range == (0, 1)
    # A recording keeps the versions, and its replay gives the same record.
    recorder.save(tmp_path / "rec.jsonl")
    replay = ReplayEngine(tmp_path / "rec.jsonl")
    again = await _two_turns(TokenChatModel(replay, codec, get_parser("hermes"), request_id="ep"))
    assert again.response_versions == versions and again.response_ids == traj.response_ids
