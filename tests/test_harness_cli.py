"""The real Claude Code and Codex CLIs inside real bubblewrap sandboxes, through the gateway.

What the model says is scripted with the real ReplayEngine (gold fixes, each exit reason): the
generations are hermes tool calls with each CLI's own tool (Claude's `Bash{command}`, Codex's
`exec_command{cmd}`), which the gateway parses and answers in the CLI's protocol (Anthropic
Messages, OpenAI Responses). Everything else is real: the pinned CLI binaries (`make clis`), the
gateway, the session socket, the sandbox, the starter tasks' verifier.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import needs, needs_bwrap
from run_helpers import run_one_task
from test_gateway_harness import script
from uniagent.agent import AgentConfig
from uniagent.agent.base import open_agent
from uniagent.agent.result import EpisodeResult, ExitReason, Reward
from uniagent.gateway.app import Gateway
from uniagent.gateway.sessions import SessionConfig
from uniagent.harness.cli_agent import ScopedApp, SessionSocket, cli_dir
from uniagent.models.base import SamplingParams
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser
from uniagent.sandbox.base import Sandbox
from uniagent.tasks import load_tasks
from uniagent.tasks.episode import run_episode
from uniagent.tokens import ChatCodec

needs_node = needs(
    "node and npm",
    shutil.which("node") is not None and shutil.which("npm") is not None,
    "the harness CLIs install from npm (`make clis`)",
)


@pytest.fixture
def clis() -> Path:
    """The pinned CLIs; with node present, a missing install is a failure, never a skip."""
    path = cli_dir()
    if path is None:
        pytest.fail("the harness CLIs are not installed: run `make clis`", pytrace=False)
    return path


TOOL = {"claude-code": ("Bash", "command"), "codex": ("exec_command", "cmd")}


def call(harness: str, command: str, thought: str = "") -> str:
    name, arg = TOOL[harness]
    body = json.dumps({"name": name, "arguments": {arg: command}})
    return f"{thought}<tool_call>\n{body}\n</tool_call>"


def model(engine, codec: ChatCodec, rid: str, max_tokens: int = 512) -> TokenChatModel:
    sampling = SamplingParams(temperature=0, max_tokens=max_tokens)
    return TokenChatModel(engine, codec, get_parser("hermes"), sampling, request_id=rid)


def gold_fix(task: Any) -> str:
    patch = task.row["patch"]
    return f"cat > /tmp/fix.diff <<'UA_EOF'\n{patch}UA_EOF\ngit apply /tmp/fix.diff && echo applied"


def model_segments(traj) -> list[list[int]]:
    return [traj.response_ids[s.start : s.end] for s in traj.spans if s.kind == "model"]


# -- the session socket (no CLI needed) ----------------------------------------------------------


async def test_session_socket_admits_only_its_session_and_token(codec: ChatCodec, tmp_path: Path) -> None:
    """One socket per episode: another session's path is 404, a wrong or missing token 401, the
    turn budget is answered with each protocol's context error, a 5xx is noted (model_error)."""
    text = "Hello there."
    engine = script(codec, {"a": [text]})
    gateway = Gateway(engine, codec, token=None)
    a = gateway.sessions.create(SessionConfig(request_id="a"))
    b = gateway.sessions.create(SessionConfig(request_id="b"))
    scoped = ScopedApp(gateway.app, a.id, "tok-a", max_calls=2)
    sock = await SessionSocket(tmp_path, scoped).start()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    try:
        transport = httpx.AsyncHTTPTransport(uds=str(tmp_path / "gw.sock"))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            other = await client.post(f"/sessions/{b.id}/v1/chat/completions", json=body,
                                      headers={"x-api-key": "tok-a"})  # fmt: skip
            assert other.status_code == 404
            assert (await client.get("/sessions")).status_code == 404  # not even the list
            wrong = await client.post(f"/sessions/{a.id}/v1/chat/completions", json=body,
                                      headers={"authorization": "Bearer tok-b"})  # fmt: skip
            assert wrong.status_code == 401
            none = await client.post(f"/sessions/{a.id}/v1/chat/completions", json=body)
            assert none.status_code == 401
            ok = await client.post(f"/sessions/{a.id}/v1/chat/completions", json=body,
                                   headers={"authorization": "Bearer tok-a"})  # fmt: skip
            assert ok.status_code == 200, ok.text
            assert ok.json()["choices"][0]["message"]["content"] == text
            # The engine has nothing more for this session: the gateway's 503 is noted.
            failed = await client.post(f"/sessions/{a.id}/v1/chat/completions", json=body,
                                       headers={"x-api-key": "tok-a"})  # fmt: skip
            assert failed.status_code == 503 and scoped.server_errors == [503]
            # Past the budget (2 calls): refused before the gateway, in the CLI's own terms.
            past = await client.post(
                f"/sessions/{a.id}/v1/responses", json={}, headers={"x-api-key": "tok-a"}
            )
            assert past.status_code == 400 and past.json()["error"]["code"] == "context_length_exceeded"
            past = await client.post(f"/sessions/{a.id}/v1/messages?beta=true", json={},
                                     headers={"x-api-key": "tok-a"})  # fmt: skip
            assert past.status_code == 400 and past.json()["type"] == "error"
            assert past.json()["error"]["message"].startswith("prompt is too long")
            assert scoped.calls == 2 and scoped.refused == 2
    finally:
        await sock.stop()
    assert b.requests == 0, "the other session was never reached"


def test_the_command_timeout_reaches_claude_codes_bash(tmp_path: Path) -> None:
    """`agent.command_timeout_s` is Claude Code's Bash default (`BASH_DEFAULT_TIMEOUT_MS`) in the
    script the agent runs; Codex has no such setting (docs/howto/harness-agents.md)."""
    from types import SimpleNamespace

    from uniagent.harness.claude_code import ClaudeCodeAgent

    cli = ClaudeCodeAgent()
    cli.gateway, cli.install = SimpleNamespace(model_name="m"), tmp_path  # type: ignore[assignment]
    episode = SimpleNamespace(config=AgentConfig(command_timeout_s=12.5))
    run = cli.command(tmp_path, SimpleNamespace(id="s"), "token", episode)  # type: ignore[arg-type]
    assert " BASH_DEFAULT_TIMEOUT_MS=12500 " in run.splitlines()[0] + " "
    default = cli.command(tmp_path, SimpleNamespace(id="s"), "token", SimpleNamespace(config=AgentConfig()))  # type: ignore[arg-type]
    assert (
        f" BASH_DEFAULT_TIMEOUT_MS={int(AgentConfig().command_timeout_s * 1000)} "
        in default.splitlines()[0] + " "
    )


# -- the real CLIs in real sandboxes -------------------------------------------------------------


def proved(task: Any) -> Any:
    """The starter task whose verifier also reads, inside the sandbox, the file the CLI wrote."""
    base = type(task)

    class Proved(base):  # type: ignore[valid-type, misc]
        async def score(self, sandbox: Sandbox, result: EpisodeResult) -> Reward:
            reward = await super().score(sandbox, result)
            proof = await sandbox.exec("cat proof.txt 2>/dev/null || echo missing", timeout=10)
            reward.details["proof"] = proof.output.strip()
            return reward

    task.__class__ = Proved
    return task


def tool_outputs(result: EpisodeResult) -> str:
    return "\n".join(str(m.get("content", "")) for m in result.messages if m.get("role") == "tool")


@pytest.fixture
def host_port() -> Any:
    """A TCP port listening on the host's loopback: a sandbox must not reach it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


async def episode(harness: str, engine, codec, task, rid: str, **agent: Any) -> EpisodeResult:
    async with open_agent(harness, engine, codec) as cli:
        return await run_episode(task, model(engine, codec, rid), AgentConfig(**agent), agent=cli)


@needs_bwrap
@needs_node
@pytest.mark.parametrize("harness", ["claude-code", "codex"])
async def test_cli_fixes_a_starter_task_inside_the_sandbox(harness: str, codec, host_port, clis) -> None:
    task = proved(load_tasks("builtin:starter")[0])
    probe = (
        "import socket; s = socket.socket(); s.settimeout(3); "
        f"print('probe', s.connect_ex(('127.0.0.1', {host_port})))"
    )
    look = f'hostname > proof.txt; cat proof.txt; python3 -c "{probe}"'
    fix = gold_fix(task)
    texts = [
        call(harness, look, "Let me look around first.\n"),
        call(harness, fix),
        "The fix is applied.",
    ]
    engine = script(codec, {"gold#0": texts})
    started = time.perf_counter()
    result = await episode(harness, engine, codec, task, "gold#0", max_turns=10, wall_time_s=300)
    wall = time.perf_counter() - started

    assert result.exit_reason == ExitReason.FINISHED, result.error
    assert result.resolved and result.reward.value == 1.0
    # The commands ran in the sandbox: its hostname, in its workspace, which the host lacks.
    assert result.reward.details["proof"] == "sandbox"
    assert not Path("/workspace/proof.txt").exists() and not Path("proof.txt").exists()
    outputs = tool_outputs(result)
    assert "applied" in outputs and "sandbox" in outputs
    assert "probe 111" in outputs, outputs  # ECONNREFUSED: the host's loopback is not the sandbox's
    assert result.metrics["model_calls"] == 3, "no title call, no retries, no side requests"
    traj = result.trajectory
    assert traj is not None and result.metrics["segments"] == 1, result.metrics
    assert model_segments(traj) == [codec.encode(t) + codec.eot_ids for t in texts]
    assert traj.drift is None and result.answer == "The fix is applied."
    first_prompt = len(result.segments[0].prompt_ids)
    print(
        f"\nHARNESS {harness}: first prompt {first_prompt} tokens, model calls "
        f"{result.metrics['model_calls']}, segments {result.metrics['segments']}, chains "
        f"{result.metrics['chains']}, drift {traj.drift}, exit {result.exit_reason}, wall {wall:.1f} s"
    )
    assert wall < 120, "nothing hung offline"


@needs_bwrap
@needs_node
@pytest.mark.parametrize("harness", ["claude-code", "codex"])
async def test_cli_exit_reasons(harness: str, codec, clis) -> None:
    """Each way a CLI episode ends maps to its exit reason: the turn budget (Claude's own
    --max-turns; Codex's refused call), the context cap (the gateway's context error, which the
    CLI does not retry), an engine failure (model_error), the wall clock (timeout)."""
    task = load_tasks("builtin:starter")[0]
    engine = script(
        codec,
        {
            "turns#0": [call(harness, "ls"), call(harness, "pwd"), "done"],
            "ctx#0": ["never generated"],
            "slow#0": [call(harness, "sleep 60"), "done"],
        },
    )
    turns = await episode(harness, engine, codec, task, "turns#0", max_turns=1, wall_time_s=120)
    assert turns.exit_reason == ExitReason.MAX_TURNS, turns.error
    assert turns.reward is not None and not turns.resolved, "a trainable exit is verified"
    assert turns.trajectory.num_turns == 1 and turns.trajectory.drift is None

    ctx = await episode(harness, engine, codec, task, "ctx#0", max_context_tokens=300, wall_time_s=120)
    assert ctx.exit_reason == ExitReason.CONTEXT_LIMIT, ctx.error
    assert ctx.metrics["model_calls"] == 1, "the context error is not retried"

    broken = await episode(harness, engine, codec, task, "nothing-recorded#0", wall_time_s=120)
    assert broken.exit_reason == ExitReason.MODEL_ERROR, broken.error
    assert broken.reward is None and not broken.exit_reason.trainable

    # The CLI's default prompt (Claude Code ~21K tokens, Codex ~9K) does not fit an 8K model: the
    # gateway's context error, which the CLI understands and stops on.
    full = await episode(f"{harness}:full", engine, codec, task, "ctx#0", max_context_tokens=8192)
    assert full.exit_reason == ExitReason.CONTEXT_LIMIT and full.metrics["model_calls"] == 1, full.error

    started = time.perf_counter()
    slow = await episode(harness, engine, codec, task, "slow#0", wall_time_s=8, command_timeout_s=120)
    assert slow.exit_reason == ExitReason.TIMEOUT_BUDGET, slow.error
    assert slow.metrics["budget_hit"] == "wall_time" and time.perf_counter() - started < 60


@needs_bwrap
@needs_node
async def test_claude_codes_bash_stops_a_command_at_the_agents_timeout(codec, clis) -> None:
    """The real Claude Code honours `agent.command_timeout_s` (its `BASH_DEFAULT_TIMEOUT_MS`): a
    command past it is stopped and the model goes on; the episode is far from its wall time."""
    task = load_tasks("builtin:starter")[0]
    texts = [call("claude-code", "sleep 30; echo late"), "done"]
    engine = script(codec, {"sleepy#0": texts})
    started = time.perf_counter()
    result = await episode(
        "claude-code", engine, codec, task, "sleepy#0", wall_time_s=120, command_timeout_s=2
    )
    wall = time.perf_counter() - started
    assert result.exit_reason == ExitReason.FINISHED, result.error
    outputs = tool_outputs(result)
    assert "timed out after 2s" in outputs and "late" not in outputs and wall < 28, outputs


@needs_bwrap
@needs_node
@pytest.mark.parametrize("harness", ["claude-code", "codex"])
async def test_a_crashing_cli_is_an_internal_error(harness: str, codec, clis, tmp_path: Path) -> None:
    """A CLI that exits non-zero without a reason it explains (here: a flag it does not know) is
    our infrastructure failing, not the policy: internal_error, not trainable, its output kept."""
    config = tmp_path / "bad.yaml"
    config.write_text("preset: trimmed\nargs: [--uniagent-no-such-flag]\n")
    task = load_tasks("builtin:starter")[0]
    engine = script(codec, {"crash#0": ["never generated"]})
    crashed = await episode(f"{harness}:{config}", engine, codec, task, "crash#0", wall_time_s=120)
    assert crashed.exit_reason == ExitReason.INTERNAL_ERROR, (crashed.exit_reason, crashed.error)
    assert not crashed.exit_reason.trainable and crashed.reward is None
    assert "no-such-flag" in (crashed.error or ""), crashed.error


@needs_bwrap
@needs_node
@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_uniagent_run_with_a_cli_agent(harness: str, tmp_path: Path, codec: ChatCodec, clis) -> None:
    """`uniagent run --agent claude-code|codex`: the same tasks, verifier, store and exit reasons."""
    task = load_tasks("builtin:starter")[1]
    fix = gold_fix(task)
    summary, row = run_one_task(tmp_path, codec, task, [call(harness, fix), "Fixed."], "--agent", harness)
    assert summary["resolved"] == 1 and summary["exit_reasons"] == {"finished": 1}, summary
    assert row["drift"] is None and row["metrics"]["agent_kind"] == harness
    assert row["metrics"]["model_calls"] == 2 and sum(t["num_turns"] for t in row["segments"]) == 2


@needs_node
async def test_doctor_rows_say_the_clis_run(clis) -> None:
    from uniagent.harness import claude_code, codex

    (claude,) = await claude_code.doctor_check()
    (cdx,) = await codex.doctor_check()
    assert claude[:2] == ("harness claude-code", True) and "2.1.197" in claude[2]
    assert cdx[:2] == ("harness codex", True) and "0.171.0" in cdx[2]


@needs_bwrap
@needs_node
@pytest.mark.parametrize("harness", ["claude-code", "codex"])
async def test_cli_with_the_real_model_is_token_exact(harness: str, smol_engine, codec, clis) -> None:
    """One real SmolLM2 call through each CLI's trimmed prompt (it fits 8K): whatever the model
    says, the record is its exact tokens and the episode ends with a trainable exit."""
    task = load_tasks("builtin:starter")[0]
    started = time.perf_counter()
    async with open_agent(harness, smol_engine, codec) as cli:
        result = await run_episode(
            task,
            model(smol_engine, codec, f"smol-{harness}#0", max_tokens=8),
            AgentConfig(max_turns=1, wall_time_s=300),
            agent=cli,
        )
    assert result.exit_reason.trainable, result.error
    assert result.metrics["model_calls"] == 1 and result.reward is not None
    traj = result.trajectory
    assert traj is not None and traj.drift is None and 0 < traj.num_model_tokens <= 8
    print(
        f"\nREAL {harness}: prompt {len(traj.prompt_ids)} tokens, exit {result.exit_reason}, "
        f"wall {time.perf_counter() - started:.1f} s"
    )


@needs_node
async def test_cli_agents_run_only_in_the_local_sandbox(codec, clis) -> None:
    engine = script(codec, {})
    task = load_tasks("builtin:starter")[0]
    async with open_agent("codex", engine, codec) as cli:
        result = await run_episode(
            task, model(engine, codec, "x#0"), AgentConfig(), {"type": "host"}, agent=cli
        )
        assert result.exit_reason == ExitReason.INTERNAL_ERROR
        assert "inside a local (bubblewrap) sandbox" in (result.error or "")
        assert not any(cli.root.iterdir()), "no session dir is made for a refused sandbox"


@needs_bwrap
@needs_node
@pytest.mark.parametrize("harness", ["claude-code", "codex"])
async def test_cli_fixes_a_harbor_task_graded_by_its_test_sh(harness: str, codec, clis) -> None:
    """A Harbor task (its instruction alone, its workdir) through the real CLI, graded by the task's
    own tests/test.sh and reward file in the sandbox the CLI left."""
    [task] = load_tasks("builtin:harbor", ids=["fix-greeting"])
    texts = [call(harness, "sed -i s/wrold/world/ greeting.txt && cat greeting.txt"), "Fixed."]
    engine = script(codec, {"harbor#0": texts})
    result = await episode(harness, engine, codec, task, "harbor#0", max_turns=6, wall_time_s=300)
    assert result.exit_reason == ExitReason.FINISHED, result.error
    assert result.reward is not None and result.reward.value == 1.0, result.reward
    assert model_segments(result.trajectory) == [codec.encode(t) + codec.eot_ids for t in texts]
