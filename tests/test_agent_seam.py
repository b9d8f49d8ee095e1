"""The Agent seam: one episode entry (`run_episode(..., agent=)`) for every agent, found through the
registry, used by the local runner, the Ray actor and the local trainer (the verl loop:
test_agent_seam_verl.py).

Real parts: the starter tasks in bubblewrap sandboxes and their verifiers, the ReplayEngine (what the
model says is scripted), real mini-swe-agent through the real gateway, the real runner and store,
the Ray backend's actor class (run in-process, without Ray), the real trainer with SmolLM2.
`ProbeAgent` is a third agent registered by the tests: it proves the seam's callers reach whatever
agent is registered, not that it acts well.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from agent_helpers import call
from conftest import needs_bwrap, require_module
from run_helpers import gold_turns
from uniagent.agent import AgentConfig, EpisodeResult, ExitReason
from uniagent.agent.base import Agent, AgentBase, Episode, create_agent, open_agent
from uniagent.agent.react import ReactAgent
from uniagent.agent.registry import AGENTS
from uniagent.errors import ConfigError
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.openai_chat import OpenAIChatModel
from uniagent.models.replay import ReplayEngine, ReplayRecord, save_records
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser
from uniagent.runner.config import RunConfig, build_config
from uniagent.sandbox.config import SandboxConfig, parse_config, type_of
from uniagent.tasks import load_tasks, run_episode
from uniagent.tokens import ChatCodec

pytestmark = needs_bwrap
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class ProbeAgent(AgentBase):
    """A third agent: writes a file in the set-up sandbox and asks the task's verifier. `EVENTS`
    records its lifecycle and every episode it ran, across instances (the sandbox hook is
    `AgentBase`'s: the task's sandbox as it is)."""

    name = "probe"
    EVENTS: ClassVar[list[tuple[str, Any]]] = []
    MODELS: ClassVar[list[Any]] = []

    def __init__(self, arg: str | None = None) -> None:
        self.arg = arg

    async def start(self, engine: Any, codec: Any) -> None:
        self.EVENTS.append(("start", (type(engine).__name__, codec is not None, self.arg)))

    async def close(self) -> None:
        self.EVENTS.append(("close", self.arg))

    async def run(self, episode: Episode) -> EpisodeResult:
        res = await episode.sandbox.exec("echo probe > probe.txt && cat probe.txt", timeout=10)
        self.EVENTS.append(("run", (episode.task.instance_id, type(episode.model).__name__)))
        self.MODELS.append(episode.model)
        result = EpisodeResult(
            episode.task.messages(), None, ExitReason.FINISHED, None, {"probe": res.output}
        )
        result.reward = await episode.task.score(episode.sandbox, result)
        return result


@pytest.fixture
def probe(monkeypatch) -> list[tuple[str, Any]]:
    """`probe` registered (one registry line, the class named by string); its events."""
    monkeypatch.setitem(AGENTS, "probe", f"{__name__}:ProbeAgent")
    ProbeAgent.EVENTS.clear()
    ProbeAgent.MODELS.clear()
    return ProbeAgent.EVENTS


def scripted(codec: ChatCodec, rid: str, texts: list[str]) -> list[ReplayRecord]:
    """The model's turns of request `rid`, said as `texts` (prompts unrecorded)."""
    records = []
    for turn, text in enumerate(texts):
        ids = codec.encode(text) + codec.eot_ids
        records.append(ReplayRecord(rid, Generation(ids, [-0.25] * len(ids), "stop"), turn, None, "0" * 64))
    return records


def mini_turns(task) -> list[str]:
    """`gold_turns` as mini-swe-agent says them: the same fix through its bash tool, then its submit."""
    (apply, _) = gold_turns(task)
    return [apply, call("bash", command=SUBMIT)]


@pytest.mark.parametrize("kind", ["react", "mini-swe-agent"])
async def test_the_same_scripted_episode_through_each_agent(codec: ChatCodec, kind: str) -> None:
    """The gold fix of a starter task, scripted, acted by `react` and by real mini-swe-agent through
    the one entry: same sandbox set-up, same verifier, the same token record of what was said."""
    task = load_tasks("builtin:starter")[0]
    texts = gold_turns(task) if kind == "react" else mini_turns(task)
    engine = ReplayEngine(scripted(codec, "gold#0", texts), match="request", strict=False)
    model = TokenChatModel(engine, codec, get_parser("hermes"), SamplingParams(max_tokens=512), "gold#0")
    async with open_agent(kind, engine, codec) as agent:
        assert isinstance(agent, Agent) and agent.name == kind
        result = await run_episode(task, model, AgentConfig(max_turns=5), agent=agent)

    assert result.exit_reason == ExitReason.FINISHED, result.error
    assert result.resolved and result.reward.value == 1.0
    assert result.metrics["agent_kind"] == kind and result.metrics["instance_id"] == task.instance_id
    assert {"sandbox_start_s", "setup_s", "episode_s"} <= set(result.metrics)
    (segment,) = result.segments
    said = [segment.response_ids[s.start : s.end] for s in segment.spans if s.kind == "model"]
    assert said == [codec.encode(t) + codec.eot_ids for t in texts]
    assert segment.num_model_tokens == sum(len(ids) for ids in said)


async def test_setup_failure_is_the_result_for_every_agent(codec: ChatCodec, probe) -> None:
    """The shared set-up's failure is the result whichever agent would have acted; it never runs."""
    task = load_tasks("builtin:starter")[0]
    async with open_agent("probe") as agent:
        result = await run_episode(task, object(), sandbox={"type": "nope"}, agent=agent)  # type: ignore[arg-type]
    assert result.exit_reason == ExitReason.INTERNAL_ERROR and "sandbox config" in (result.error or "")
    assert [e for e, _ in probe] == ["start", "close"]


class HookedAgent(AgentBase):
    """An agent whose sandbox hook adds a variable: what the hook returns is the sandbox run."""

    name = "hooked"

    def __init__(self) -> None:
        self.seen: list[SandboxConfig] = []

    def prepare_sandbox(self, config: SandboxConfig) -> SandboxConfig:
        self.seen.append(config)
        return config.model_copy(update={"env": {**config.env, "HOOKED": "yes"}})

    async def run(self, episode: Episode) -> EpisodeResult:
        res = await episode.sandbox.exec('echo "$HOOKED"', timeout=10)
        return EpisodeResult(episode.task.messages(), None, ExitReason.FINISHED, None, {"hooked": res.output})


async def test_the_sandbox_hook_is_called_for_every_agent() -> None:
    """`run_episode` hands every agent's `prepare_sandbox` the task's completed config and starts
    what it returns; `AgentBase`'s default (react's) is the config as it is."""
    task = load_tasks("builtin:starter")[0]
    hooked = HookedAgent()
    model = SimpleNamespace(trainable=True)  # the agent never queries it
    result = await run_episode(task, model, sandbox=parse_config({"type": "local"}), agent=hooked)  # type: ignore[arg-type]
    assert [type_of(c) for c in hooked.seen] == ["local"] and "HOOKED" not in hooked.seen[0].env
    assert result.metrics["hooked"].strip() == "yes", result.error
    config = parse_config({"type": "local", "env": {"A": "1"}})
    assert ReactAgent().prepare_sandbox(config) is config and isinstance(ReactAgent(), Agent)


async def test_a_harness_needs_a_model_that_offers_a_session(codec: ChatCodec) -> None:
    """What a model offers a gateway session is declared (`ChatModel.session_spec()`): a token-level
    model's sampling, parser and request id; a text-level model has none, and a harness episode
    with it is an internal error, before any model call."""
    engine = ReplayEngine([], match="request", strict=False)
    token_model = TokenChatModel(engine, codec, get_parser("hermes"), SamplingParams(max_tokens=64), "r#0")
    spec = token_model.session_spec()
    assert (spec.parser, spec.request_id, spec.sampling) == ("hermes", "r#0", token_model.sampling)
    text_model = OpenAIChatModel("stand-in", base_url="http://127.0.0.1:9/v1", api_key="x")
    assert text_model.session_spec() is None
    task = load_tasks("builtin:starter")[0]
    async with open_agent("mini-swe-agent", engine, codec) as agent:
        result = await run_episode(task, text_model, AgentConfig(max_turns=2), agent=agent)
    assert result.exit_reason == ExitReason.INTERNAL_ERROR and "token-level model" in (result.error or "")


def test_unknown_agent_kind_names_the_known_ones(probe) -> None:
    known = "react, mini-swe-agent, claude-code, codex, probe"
    with pytest.raises(ConfigError, match=rf"unknown agent kind 'aider'; known: {known}"):
        create_agent("aider")
    with pytest.raises(ConfigError, match=r"agent\.kind.*unknown agent kind 'nope'"):
        build_config(None, ["agent.kind=nope"])
    with pytest.raises(ConfigError, match=r"^config agent_kind is now agent\.kind: set agent\.kind instead$"):
        build_config(None, ["agent_kind=probe"])
    with pytest.raises(ConfigError, match="react takes no"):
        create_agent("react:extra")
    assert build_config(None, ["agent.kind=probe:x"]).agent.kind == "probe:x"
    assert isinstance(create_agent("probe:x"), ProbeAgent) and create_agent("probe:x").arg == "x"


def run_config(tmp_path: Path, codec: ChatCodec, kind: str, **runner: Any) -> RunConfig:
    """A one-episode run of the first starter task, the gold fix scripted as `kind` says it."""
    task = load_tasks("builtin:starter")[0]
    texts = mini_turns(task) if kind.startswith("mini-swe-agent") else gold_turns(task)
    replay = tmp_path / "replay.jsonl"
    save_records(scripted(codec, f"{task.instance_id}#0", texts), replay)
    return RunConfig.model_validate(
        {
            "model": {"spec": f"replay:{replay}"},
            "agent": {"kind": kind},
            "tasks": {"spec": "builtin:starter", "ids": [task.instance_id]},
            "runner": {"output": str(tmp_path / "run"), "preflight": False, **runner},
        }
    )


async def test_a_registered_agent_runs_through_the_runner(
    tmp_path: Path, codec: ChatCodec, probe, monkeypatch
) -> None:
    from uniagent.runner.store import RunStore

    run_module = importlib.import_module("uniagent.runner.run")  # the package's `run` is the function

    monkeypatch.setattr(run_module, "freeze_startup_objects", lambda: None)  # not in the test process
    summary = await run_module.run(run_config(tmp_path, codec, "probe"))
    assert summary["episodes"] == 1 and summary["exit_reasons"] == {"finished": 1}
    assert probe[0] == ("start", ("ReplayEngine", True, None)) and probe[-1] == ("close", None)
    assert [e for e, _ in probe] == ["start", "run", "close"] and probe[1][1][1] == "TokenChatModel"
    store = RunStore(tmp_path / "run" / "run.db", readonly=True)
    (row,) = list(store.rows())
    store.close()
    assert row["metrics"]["agent_kind"] == "probe" and row["metrics"]["probe"].strip() == "probe"
    assert row["reward"] == 0.0, "the task's verifier scored the (unfixed) repository"


@pytest.mark.parametrize("kind", ["probe", "mini-swe-agent"])
async def test_the_ray_actor_starts_its_own_agent(
    tmp_path: Path, codec: ChatCodec, probe, monkeypatch, kind
) -> None:
    """The Ray backend's actor (its class, run in-process here: no Ray) builds its model and its own
    agent over it (a harness agent: a gateway per actor), runs episodes through the one entry and
    closes the agent with itself. A harness agent is no longer limited to the local backend."""
    from uniagent.runner.ray_backend import EpisodeActor

    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)  # the actor claims a temp dir of its own
    cfg = run_config(tmp_path, codec, kind, backend="ray")
    task = load_tasks("builtin:starter", ids=cfg.tasks.ids)[0]
    actor = EpisodeActor(cfg.model_dump(mode="json"))
    try:
        assert await actor.preflight(task.sandbox_config(cfg.sandbox)) is None
        result = await actor.run(task.family, task.row, task.source, 0)
        agent = actor.worker.agent
        assert agent is not None and agent.name == kind.partition(":")[0]
    finally:
        await actor.close()
    assert actor.worker.agent is None and not actor.tmp.exists()
    assert result["exit_reason"] == "finished" and result["metrics"]["agent_kind"] == kind
    if kind == "probe":
        assert [e for e, _ in probe] == ["start", "run", "close"]
    else:
        assert result["resolved"] and result["metrics"]["harness_exit_status"] == "Submitted"
        assert agent.harness is None, "its gateway closed with the actor"


def test_a_registered_agent_runs_in_the_local_trainer(tmp_path: Path, probe) -> None:
    from uniagent.train.config import build_train_config
    from uniagent.train.local import LocalTrainer
    from uniagent.train.toy import load_toy_tasks

    cfg = build_train_config(
        None,
        [
            f"trainer.output={tmp_path / 'train'}",
            "tasks.limit=1",
            "trainer.group_size=2",
            "trainer.tensorboard=false",
            "agent.kind=probe",
            "model.history=template",  # the shared model section acts in the trainer too
            "model.template_tools=false",
        ],
    )
    trainer = LocalTrainer(cfg)
    try:
        samples = asyncio.run(trainer.rollout(load_toy_tasks(limit=1)))
    finally:
        trainer.close()
    assert [s.result.metrics["agent_kind"] for s in samples] == ["probe", "probe"]
    assert [e for e, _ in probe] == ["start", "run", "run", "close"]
    assert probe[0][1] == ("LocalEngine", True, None), "the agent got the trainer's own engine"
    assert [(m.follow_template, m.native_tools) for m in ProbeAgent.MODELS] == [(True, False)] * 2


def test_mini_swe_agent_on_a_real_ray_cluster(tmp_path: Path, codec: ChatCodec) -> None:
    """`uniagent run --agent mini-swe-agent --backend ray`: the harness's gateway in a real Ray
    actor (its event loop, mini's thread calling back into it), the episode stored by the driver."""
    require_module("ray", "the Ray runner backend (a verl dependency)")
    cfg = run_config(tmp_path, codec, "mini-swe-agent")
    out = tmp_path / "ray-run"
    args = ["run", "--tasks", "builtin:starter", "--model", cfg.model.spec, "--agent", "mini-swe-agent"]
    args += ["--backend", "ray", "--output", str(out), "--set", f"tasks.ids=[{cfg.tasks.ids[0]}]"]
    proc = subprocess.run(
        [sys.executable, "-m", "uniagent.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resolved"] == 1 and summary["exit_reasons"] == {"finished": 1}
    (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert (
        row["metrics"]["agent_kind"] == "mini-swe-agent"
        and row["metrics"]["harness_exit_status"] == "Submitted"
    )
