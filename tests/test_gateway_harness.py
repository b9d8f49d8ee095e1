"""mini-swe-agent (real, unmodified) against the gateway, its commands in real bubblewrap sandboxes.

What the model says is scripted with the real ReplayEngine where the test needs an exact outcome
(a gold fix, each exit reason); one episode runs the real SmolLM2 end to end. Everything else —
mini's DefaultAgent, its litellm model and prompts, the gateway, the sandbox, the verifiers — is real.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from conftest import needs_bwrap
from run_helpers import run_one_task
from uniagent.agent import AgentConfig
from uniagent.agent.result import EpisodeResult, ExitReason, Reward
from uniagent.harness.mini_swe_agent import HarnessGateway, parse_kind
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.replay import ReplayEngine, ReplayRecord
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser
from uniagent.sandbox.base import Sandbox
from uniagent.tasks import load_tasks
from uniagent.tasks.base import Task
from uniagent.tokens import ChatCodec

pytestmark = needs_bwrap
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def bash(command: str, thought: str = "") -> str:
    body = json.dumps({"name": "bash", "arguments": {"command": command}})
    return f"{thought}<tool_call>\n{body}\n</tool_call>"


class AnswerFileTask(Task):
    """A small real task: write the answer into a file; the verifier reads it in the sandbox."""

    family = "answer_file"

    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "Write the number 42 into answer.txt in the current directory."}]

    def tools(self) -> list[str | dict[str, Any]]:
        return ["bash"]

    async def score(self, sandbox: Sandbox, result: EpisodeResult) -> Reward:
        res = await sandbox.exec("cat answer.txt 2>/dev/null || true", timeout=10)
        ok = res.output.strip() == "42"
        return Reward(1.0 if ok else 0.0, ok, {"content": res.output[:100]})


def script(codec: ChatCodec, turns: dict[str, list[str]]) -> ReplayEngine:
    records = []
    for rid, texts in turns.items():
        for i, text in enumerate(texts):
            ids = codec.encode(text) + codec.eot_ids
            records.append(ReplayRecord(rid, Generation(ids, [-0.25] * len(ids), "stop"), i, None, "0" * 64))
    return ReplayEngine(records, match="request", strict=False)


def model(engine, codec: ChatCodec, rid: str, max_tokens: int = 256) -> TokenChatModel:
    sampling = SamplingParams(temperature=0, max_tokens=max_tokens)
    return TokenChatModel(engine, codec, get_parser("hermes"), sampling, request_id=rid)


@pytest_asyncio.fixture(loop_scope="session")
async def harness_for() -> AsyncIterator[Any]:
    started: list[HarnessGateway] = []

    async def start(engine, codec) -> HarnessGateway:
        harness = await HarnessGateway.start("mini-swe-agent", engine, codec)
        started.append(harness)
        return harness

    yield start
    for harness in started:
        await harness.close()


def model_segments(traj) -> list[list[int]]:
    return [traj.response_ids[s.start : s.end] for s in traj.spans if s.kind == "model"]


async def test_mini_swe_agent_fixes_a_starter_task_through_the_gateway(harness_for, codec) -> None:
    task = load_tasks("builtin:starter")[0]
    fix = (
        f"cat > /tmp/fix.diff <<'UA_EOF'\n{task.row['patch']}UA_EOF\ngit apply /tmp/fix.diff && echo applied"
    )
    texts = [bash("ls", "Let me look at the repository first.\n"), bash(fix), bash(SUBMIT)]
    engine = script(codec, {"gold#0": texts})
    harness = await harness_for(engine, codec)
    result = await harness.run_episode(task, model(engine, codec, "gold#0"), AgentConfig(max_turns=10))

    assert result.exit_reason == ExitReason.FINISHED, result.error
    assert result.resolved and result.reward.value == 1.0 and result.patch
    assert result.metrics["harness_exit_status"] == "Submitted" and result.metrics["tool_calls"] == 3
    traj = result.trajectory
    assert traj is not None and traj.drift is None and result.metrics["chains"] == 1
    assert model_segments(traj) == [codec.encode(t) + codec.eot_ids for t in texts]
    assert traj.num_model_tokens == result.metrics["completion_tokens"]
    # mini's own prompt and tool-call observations, in OpenAI format (the submit command ends the
    # episode before an observation is written, as in mini itself).
    roles = [m["role"] for m in result.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in result.messages[1]["content"]
    assert "applied" in result.messages[5]["content"]
    prompt_text = codec.decode(traj.prompt_ids)
    assert "<tools>" in prompt_text and '"name": "bash"' in prompt_text  # mini's BASH_TOOL, as hermes text
    assert not harness.gateway.sessions.sessions, "the episode's session is gone afterwards"


async def test_harness_exit_reasons_match_the_react_loop(harness_for, codec) -> None:
    write = bash("echo 42 > answer.txt")
    engine = script(
        codec,
        {
            "done#0": [write, bash(SUBMIT)],
            "turns#0": [bash("ls"), bash("pwd"), bash("ls -a")],
            "format#0": ["I am not calling any tool.", "Still no tool.", "Nope."],
            "ctx#0": [write],
            "timeouts#0": [bash("sleep 5"), bash("sleep 5"), bash("sleep 5")],
        },
    )
    harness = await harness_for(engine, codec)
    task = AnswerFileTask({"instance_id": "answer-1"})

    async def run(rid: str, **agent: Any) -> EpisodeResult:
        return await harness.run_episode(task, model(engine, codec, rid), AgentConfig(**agent))

    done = await run("done#0")
    assert done.exit_reason == ExitReason.FINISHED and done.resolved and done.trajectory.drift is None

    turns = await run("turns#0", max_turns=2)
    assert turns.exit_reason == ExitReason.MAX_TURNS and turns.reward is not None and not turns.resolved
    assert turns.trajectory.num_turns == 2 and turns.trajectory.drift is None

    fmt = await run("format#0", max_format_errors=2)
    assert fmt.exit_reason == ExitReason.FORMAT_ERRORS and fmt.metrics["format_errors"] == 2
    assert fmt.trajectory.drift is None and fmt.reward is not None

    ctx = await run("ctx#0", max_context_tokens=300)  # mini's first prompt alone is longer
    assert ctx.exit_reason == ExitReason.CONTEXT_LIMIT and ctx.exit_reason.trainable

    slow = await run("timeouts#0", command_timeout_s=1, timeout_budget=2)
    assert slow.exit_reason == ExitReason.TIMEOUT_BUDGET and slow.metrics["tool_timeouts"] == 2

    failing = await run("nothing-recorded#0")
    assert failing.exit_reason == ExitReason.MODEL_ERROR and not failing.exit_reason.trainable
    assert failing.reward is None and "engine" in (failing.error or "")


async def test_mini_swe_agent_with_the_real_model_is_token_exact(harness_for, smol_engine, codec) -> None:
    harness = await harness_for(smol_engine, codec)
    task = AnswerFileTask({"instance_id": "answer-smol"})
    result = await harness.run_episode(
        task, model(smol_engine, codec, "smol#0", max_tokens=8), AgentConfig(max_turns=2, max_format_errors=2)
    )
    assert result.exit_reason in (ExitReason.MAX_TURNS, ExitReason.FORMAT_ERRORS), result.error
    assert result.reward is not None, "trainable exits are verified"
    traj = result.trajectory
    assert traj.drift is None and result.metrics["segment_drifts"] == [None] * result.metrics["segments"]
    assert result.metrics["turns"] == 2 and result.metrics["completion_tokens"] <= 16
    assert all(0 < len(seg) <= 8 for seg in model_segments(traj))
    if result.exit_reason == ExitReason.FORMAT_ERRORS:
        # mini drops a reply it cannot parse from its history, so the next request rewrites the
        # conversation: the gateway records it as a second chain instead of a wrong append.
        assert result.metrics["chains"] == 2 and traj.num_turns == 1
        assert "output token limit" in codec.decode(traj.prompt_ids)
    assert all(lp < 0 for lp, m in zip(traj.response_logprobs, traj.response_mask, strict=True) if m)


def test_uniagent_run_with_mini_swe_agent(tmp_path: Path, codec: ChatCodec) -> None:
    task = load_tasks("builtin:starter")[1]
    fix = (
        f"cat > /tmp/fix.diff <<'UA_EOF'\n{task.row['patch']}UA_EOF\ngit apply /tmp/fix.diff && echo applied"
    )
    turns = [bash(fix), bash(SUBMIT)]
    summary, row = run_one_task(tmp_path, codec, task, turns, "--set", "agent.kind=mini-swe-agent")
    assert summary["resolved"] == 1 and summary["exit_reasons"] == {"finished": 1}
    assert row["drift"] is None and row["metrics"]["agent_kind"] == "mini-swe-agent"
    segments = row["segments"]
    assert sum(t["num_turns"] for t in segments) == 2 and all(sum(t["response_mask"]) for t in segments)

    # harness agents run on Ray too now (test_agent_seam.py); an unknown kind is one line, exit 2
    cli = [sys.executable, "-m", "uniagent.cli", "run", "--tasks", "builtin:starter"]
    bad = subprocess.run(
        [*cli, "--output", str(tmp_path / "run"), "--agent", "aider"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "agent.kind" in bad.stderr
    assert "known: react, mini-swe-agent, claude-code, codex" in bad.stderr


def test_agent_kind_parsing() -> None:
    assert parse_kind("mini-swe-agent") == ("mini-swe-agent", None)
    assert parse_kind("mini-swe-agent:swebench.yaml") == ("mini-swe-agent", "swebench.yaml")
    with pytest.raises(Exception, match="harnesses"):
        parse_kind("claude-code")
