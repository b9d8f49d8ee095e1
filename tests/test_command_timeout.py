"""`agent.command_timeout_s` bounds every command the model runs, in every agent.

The ReAct loop's `bash` and `str_replace_editor` and the mini-swe-agent harness all stop a
command at that many seconds and say so in the observation. Scripted model turns (the real
ReplayEngine), real tools in real bubblewrap sandboxes, real mini-swe-agent.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from agent_helpers import call, scripted_model
from test_gateway_harness import SUBMIT, AnswerFileTask, bash, harness_for, model, script  # noqa: F401
from uniagent.agent import AgentConfig, ExitReason, Reward
from uniagent.agent.result import EpisodeResult
from uniagent.sandbox.base import Sandbox
from uniagent.tasks import run_episode
from uniagent.tasks.base import Task
from uniagent.tokens import ChatCodec

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


class ShellTask(Task):
    family = "shell_test"

    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "Run a few commands, then finish."}]

    def tools(self) -> list[str | dict[str, Any]]:
        return ["bash", "str_replace_editor", "finish"]

    async def score(self, sandbox: Sandbox, result: EpisodeResult) -> Reward:
        return Reward(0.0, False, {})


async def test_react_tools_obey_the_agents_command_timeout(codec: ChatCodec) -> None:
    turns = [
        call("bash", command="echo before; sleep 5"),
        call("bash", command="mkfifo pipe && echo made"),
        call("str_replace_editor", command="view", path="pipe"),  # blocks: no writer ever comes
        call("bash", command="echo quick"),
        call("finish", answer="done"),
    ]
    res = await run_episode(
        ShellTask({"instance_id": "timeouts"}),
        scripted_model(codec, turns),
        AgentConfig(command_timeout_s=0.5, timeout_budget=3),
    )
    assert res.exit_reason == ExitReason.FINISHED, res.error
    tool_out = [m["content"] for m in res.messages if m["role"] == "tool"]
    assert tool_out[0].startswith("before\n")
    assert "[the command timed out after 0.5s" in tool_out[0] and "pass a larger `timeout`" in tool_out[0]
    assert "timed out after 0.5s" in tool_out[2]
    assert tool_out[3] == "quick"
    assert res.metrics["tool_timeouts"] == 2 and res.metrics["tools_s"] < 5


async def test_the_bash_tool_tells_the_model_its_default() -> None:
    from uniagent.agent import AgentInteraction
    from uniagent.tools import build_tools

    loop = AgentInteraction(None, build_tools(["bash"]), AgentConfig(command_timeout_s=45))  # type: ignore[arg-type]
    assert "default 45s, at most 600s" in loop.specs[0]["function"]["description"]
    assert loop.tools["bash"].command_timeout_s == 45
    long = AgentInteraction(None, build_tools(["bash"]), AgentConfig(command_timeout_s=900))  # type: ignore[arg-type]
    assert "at most 900s" in long.specs[0]["function"]["description"], "the cap never undercuts the default"


async def test_the_harness_obeys_the_agents_command_timeout(harness_for, codec: ChatCodec) -> None:  # noqa: F811
    engine = script(codec, {"slow#0": [bash("echo before; sleep 5"), bash(SUBMIT)]})
    harness = await harness_for(engine, codec)
    res = await harness.run_episode(
        AnswerFileTask({"instance_id": "answer-timeout"}),
        model(engine, codec, "slow#0"),
        AgentConfig(command_timeout_s=0.5, timeout_budget=2),
    )
    assert res.exit_reason == ExitReason.FINISHED, res.error
    assert res.metrics["tool_timeouts"] == 1
    observation = next(m["content"] for m in res.messages if m["role"] == "tool")
    assert "timed out after 0.5 seconds" in observation and res.metrics["harness_s"] < 5
