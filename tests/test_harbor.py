"""Harbor tasks: task.toml of both schema versions validated at load, the environment's rule
(bubblewrap when the Dockerfile only places files, else an image), the reward file convention,
and the bundled suite end to end through `uniagent verify --gold` and `uniagent run` in bubblewrap
(oracle 100 %, empty 0 %), with a verifier failure an error, never a 0. Containers:
test_harbor_container.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_helpers import call
from conftest import needs_bwrap
from run_helpers import write_turns
from uniagent.agent.config import AgentConfig
from uniagent.errors import ConfigError, SandboxError
from uniagent.sandbox.settings import type_of
from uniagent.tasks import load_tasks
from uniagent.tasks.harbor import HarborTask, parse_reward
from uniagent.tasks.harbor_config import parse_dockerfile, read_task_dir
from uniagent.tasks.registry import BUILTIN
from uniagent.tokens import ChatCodec

CLI = [sys.executable, "-m", "uniagent.cli"]
SUITE = BUILTIN / "harbor"
IDS = ["configure-service", "fix-fizzbuzz", "fix-greeting"]
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def uniagent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, env=os.environ)


def make_task(
    root: Path, toml: str, test_sh: str = "echo 1 > /logs/verifier/reward.txt\n", **files: str
) -> Path:
    """A Harbor task directory under `root`: `toml`, a one-line instruction, a plain Dockerfile,
    `test_sh`; `files` (relative path -> text) on top."""
    root.mkdir(parents=True)
    (root / "task.toml").write_text(toml)
    (root / "instruction.md").write_text("Do the thing.\n")
    (root / "environment").mkdir()
    (root / "environment" / "Dockerfile").write_text("FROM base\nWORKDIR /app\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text(test_sh)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


# -- reading -------------------------------------------------------------------------------
def test_the_bundled_suite_reads_both_schema_versions() -> None:
    tasks = load_tasks("builtin:harbor")
    assert [t.instance_id for t in tasks] == IDS
    by_id = {t.instance_id: t for t in tasks}
    legacy = by_id["fix-greeting"].spec.config  # version = "1.0", memory = "1G"
    assert legacy.schema == "legacy" and legacy.environment.memory_mb == 1024
    current = by_id["configure-service"].spec.config
    assert current.schema == "current" and current.task and current.task.name == "uniagent/configure-service"
    assert current.verifier.env == {"SERVICE_PORT": "8765"}
    assert [t.instance_id for t in load_tasks(f"harbor:{SUITE}")] == IDS
    [one] = load_tasks(f"harbor:{SUITE / 'fix-fizzbuzz'}")  # one task directory
    assert one.instance_id == "fix-fizzbuzz" and isinstance(one, HarborTask)


@pytest.mark.parametrize(
    ("toml", "extra", "message"),
    [
        ('version = "1.0"\n[agent]\ntimeout_sec = -3\n', {}, "agent.timeout_sec: Input should be greater"),
        ('version = "1.0"\n[environment.healthcheck]\ncommand = "true"\n', {}, "health check"),
        ('version = "1.0"\n[environment]\ngpus = 1\n', {}, "gpus = 1: no sandbox backend"),
        ('version = "1.0"\nschema_version = "1.1"\n', {}, "not both"),
        ('version = "1.0"\n[environment]\nmemory = "lots"\n', {}, "not a size"),
        ("version = [\n", {}, "not valid TOML"),
        ('version = "1.0"\n', {"environment/docker-compose.yaml": "services: {}\n"}, "compose"),
        ('version = "1.0"\n', {"instruction.md": ""}, "instruction.md is missing or empty"),
    ],
)
def test_a_malformed_task_is_a_one_line_error(tmp_path: Path, toml: str, extra: dict, message: str) -> None:
    task = make_task(tmp_path / "t", toml, **extra)
    with pytest.raises(ConfigError, match=message) as err:
        read_task_dir(task)
    assert "\n" not in str(err.value)


def test_unknown_keys_are_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    task = make_task(tmp_path / "t", 'version = "1.0"\nnewer = 1\n[agent]\ntimeout = 3\n')
    spec = read_task_dir(task)
    assert spec.config.agent.timeout_sec == 600 and spec.config.unknown_keys() == ["newer", "agent.timeout"]
    assert "ignoring keys this reader does not know: newer, agent.timeout" in caplog.text


def test_no_test_sh_and_no_task_are_errors(tmp_path: Path) -> None:
    task = make_task(tmp_path / "t", 'version = "1.0"\n')
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(ConfigError, match=r"tests/test\.sh is missing"):
        read_task_dir(task)
    with pytest.raises(ConfigError, match="no Harbor task in it"):
        load_tasks(f"harbor:{tmp_path / 't' / 'tests'}")


def test_dockerfile_rule() -> None:
    df = parse_dockerfile(
        "# c\nFROM base:1 \nWORKDIR /app\nCOPY a.txt b/ ./\nENV A=1 B=2\nENV C 3\n", "Dockerfile"
    )
    assert (df.base, df.workdir, df.plain) == ("base:1", "/app", True)
    assert df.copies == [("a.txt", "./"), ("b/", "./")] and df.env == {"A": "1", "B": "2", "C": "3"}
    built = parse_dockerfile("FROM base\nRUN apt-get install -y \\\n  curl\nCOPY --chown=x a /a\n", "D")
    assert not built.plain and built.other[0].startswith("RUN apt-get install -y")
    with pytest.raises(ConfigError, match="must start with FROM"):
        parse_dockerfile("RUN true\n", "D")


# -- environment ---------------------------------------------------------------------------
def test_task_settings_map_onto_the_sandbox(tmp_path: Path) -> None:
    [task] = load_tasks("builtin:harbor", ids=["configure-service"])
    local = task.sandbox_config(None)
    assert type_of(local) == "local" and local.workdir == "/srv/app"
    assert local.limits.cpus == 1 and local.limits.memory_mb == 1024 and local.network is False
    assert {"/tests", "/logs"} <= set(local.tmpfs) and local.env == {"PYTHONDONTWRITEBYTECODE": "1"}
    box = task.sandbox_config({"type": "container", "runtime": "podman", "limits": {"pids": 64}})
    assert (box.image, box.runtime, box.limits.pids, box.limits.memory_mb) == (
        "localhost/uniagent-harbor-base:latest",
        "podman",
        64,
        1024,
    )
    cfg = task.agent_config(AgentConfig(wall_time_s=1000, verifier_timeout_s=30))
    assert cfg.wall_time_s == 300 and cfg.verifier_timeout_s == 120

    toml = 'schema_version = "1.1"\n[verifier]\nuser = "tester"\n[environment]\nallow_internet = true\n'
    [user] = load_tasks(f"harbor:{make_task(tmp_path / 'u', toml)}")
    with pytest.raises(ConfigError, match="one user; run it with --sandbox container"):
        user.sandbox_config(None)
    assert user.sandbox_config({"type": "container"}).network is True
    assert user.sandbox_config({"type": "container", "network": False}).network is False, (
        "the user's off wins"
    )
    rootdir = make_task(tmp_path / "r", 'version = "1.0"\n')
    (rootdir / "environment" / "Dockerfile").write_text("FROM base\n")
    with pytest.raises(ConfigError, match="sets no WORKDIR"):
        load_tasks(f"harbor:{rootdir}")[0].sandbox_config(None)
    built = make_task(tmp_path / "b", 'version = "1.0"\n')
    (built / "environment" / "Dockerfile").write_text("FROM base\nRUN make\n")
    [needs_build] = load_tasks(f"harbor:{built}")
    box = needs_build.sandbox_config(None)  # a Dockerfile to build: a container, built once
    assert box.build == str(built / "environment") and box.image.startswith("localhost/uniagent-harbor-b:")
    assert box.build_timeout_s == 600 and needs_build._copies() == [], "the build places the files"
    with pytest.raises(ConfigError, match=r"must be built .* the modal backend cannot"):
        needs_build.sandbox_config({"type": "modal"})
    (built / "task.toml").write_text('version = "1.0"\n[environment]\ndocker_image = "img:1"\n')
    [prebuilt] = load_tasks(f"harbor:{built}")
    assert prebuilt.sandbox_config(None).image == "img:1", "an image's task leaves bubblewrap for a container"


def test_an_agent_on_a_task_with_agent_user_is_refused_not_run_as_another_user(tmp_path: Path) -> None:
    toml = 'schema_version = "1.1"\n[agent]\nuser = "dev"\n'
    [task] = load_tasks(f"harbor:{make_task(tmp_path / 'u', toml)}")
    with pytest.raises(ConfigError, match=r"agent\.user 'dev': uniagent's agents run their commands"):
        task.agent_config(AgentConfig())


def test_reward_files() -> None:
    assert parse_reward("1\n", None) == (1.0, {"reward": 1.0})
    assert parse_reward(None, '{"reward": 0.5, "style": 1}') == (0.5, {"reward": 0.5, "style": 1.0})
    assert parse_reward(None, '{"a": 1, "b": 0}') == (0.5, {"a": 1.0, "b": 0.0})
    for txt, js, message in [
        (None, None, "wrote no reward"),
        ("yes", None, "not a number"),
        (None, "[1]", "object of named numbers"),
        (None, '{"a": "x"}', "'a' is not a number"),
    ]:
        with pytest.raises(SandboxError, match=message):
            parse_reward(txt, js)


# -- end to end in bubblewrap --------------------------------------------------------------
@needs_bwrap
def test_verify_gold_runs_each_solution_and_grades_it(tmp_path: Path) -> None:
    proc = uniagent("verify", "--tasks", "builtin:harbor", "--gold", "--output", str(tmp_path / "v"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "v" / "report.json").read_text())
    assert report["resolved_ids"] == IDS, report["instances"]
    service = report["instances"]["configure-service"]["details"]
    assert service["rewards"] == {"reward": 1.0, "starts": 1.0, "answers": 1.0}, "every named reward is kept"
    assert "3 passed" in report["instances"]["fix-fizzbuzz"]["details"]["test_output"]


@needs_bwrap
def test_a_verifier_that_fails_is_an_error_not_a_zero(tmp_path: Path) -> None:
    toml = 'version = "1.0"\n[verifier]\ntimeout_sec = 2\n'
    make_task(tmp_path / "s" / "silent", toml, "echo ran\n", **{"solution/solve.sh": "true\n"})
    make_task(tmp_path / "s" / "slow", toml, "sleep 30\n", **{"solution/solve.sh": "true\n"})
    proc = uniagent(
        "verify", "--tasks", f"harbor:{tmp_path / 's'}", "--gold", "--output", str(tmp_path / "v")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "v" / "report.json").read_text())
    assert report["error_ids"] == ["silent", "slow"], report["instances"]
    assert "wrote no reward" in report["instances"]["silent"]["error"]
    assert "verifier.timeout_sec=2" in report["instances"]["slow"]["error"]


def oracle_turns(task: HarborTask) -> list[str]:
    """A scripted model that runs the task's own solve.sh through `bash`, then submits."""
    assert task.spec.solution is not None
    script = task.spec.solution.read_text()
    return [
        call("bash", command=f"cat > /tmp/solve.sh <<'UA_EOF'\n{script}UA_EOF\nbash /tmp/solve.sh"),
        call("submit"),
    ]


@needs_bwrap
def test_run_oracle_resolves_every_task_and_empty_none(tmp_path: Path, codec: ChatCodec) -> None:
    tasks = load_tasks("builtin:harbor")
    plan = {}
    for t in tasks:
        plan[f"{t.instance_id}#0"] = oracle_turns(t)  # type: ignore[arg-type]
        plan[f"{t.instance_id}#1"] = [call("submit")]
    replay = write_turns(tmp_path / "replay.jsonl", codec, plan)
    out = tmp_path / "run"
    proc = uniagent(
        "run", "--tasks", "builtin:harbor", "--model", f"replay:{replay}", "--samples", "2",
        "--concurrency", "3", "--max-turns", "4", "--output", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    got = {(r["instance_id"], r["sample"]): r for r in results}
    assert len(got) == 6
    for iid in IDS:
        assert got[(iid, 0)]["reward"] == 1.0, (iid, got[(iid, 0)].get("error"), got[(iid, 0)]["verifier"])
        assert got[(iid, 1)]["reward"] == 0.0 and got[(iid, 1)]["exit_reason"] == "finished"
    assert got[("configure-service", 1)]["verifier"]["rewards"] == {
        "reward": 0.0,
        "starts": 0.0,
        "answers": 0.0,
    }


@needs_bwrap
async def test_mini_swe_agent_acts_on_a_harbor_task(codec: ChatCodec) -> None:
    """A harness agent on a Harbor task: real mini-swe-agent, scripted turns (the oracle's fix,
    then its submit), graded by the task's test.sh in the sandbox it left."""
    from uniagent.agent.base import open_agent
    from uniagent.models.base import Generation, SamplingParams
    from uniagent.models.replay import ReplayEngine, ReplayRecord
    from uniagent.models.token_chat import TokenChatModel
    from uniagent.parsers import get_parser
    from uniagent.tasks import run_episode

    [task] = load_tasks("builtin:harbor", ids=["fix-greeting"])
    texts = [call("bash", command="sed -i s/wrold/world/ greeting.txt"), call("bash", command=MINI_SUBMIT)]
    records = [
        ReplayRecord("h#0", Generation(ids, [-0.25] * len(ids), "stop"), turn, None, "0" * 64)
        for turn, ids in enumerate(codec.encode(t) + codec.eot_ids for t in texts)
    ]
    engine = ReplayEngine(records, match="request", strict=False)
    model = TokenChatModel(engine, codec, get_parser("hermes"), SamplingParams(max_tokens=512), "h#0")
    async with open_agent("mini-swe-agent", engine, codec) as agent:
        result = await run_episode(task, model, AgentConfig(max_turns=4), agent=agent)
    assert result.exit_reason.value == "finished", result.error
    assert result.reward is not None and result.reward.value == 1.0, result.reward
    assert result.metrics["agent_kind"] == "mini-swe-agent" and result.metrics["graded_in"] == "same"


@needs_bwrap
def test_rl_smoke_step_on_a_harbor_task(tmp_path: Path) -> None:
    """One local-trainer step (SmolLM2, GRPO group of 2) on one Harbor task: episodes run, are
    graded by test.sh, and the update happens."""
    from typer.testing import CliRunner

    from uniagent.cli import app

    out = tmp_path / "train"
    args = [
        "train", "--engine", "local", "--config", "configs/train_multiturn.yaml",
        "--set", f"tasks.spec=harbor:{SUITE / 'fix-greeting'}", "--set", f"trainer.output={out}",
        "--set", "trainer.steps=1", "--set", "trainer.group_size=2", "--set", "trainer.tasks_per_step=1",
        "--set", "trainer.save_every=0", "--set", "model.max_tokens=8", "--set", "agent.max_turns=1",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output[-3000:] + repr(result.exception)
    [row] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["episodes"] == 2 and "loss" in row and "reward_mean" in row


def test_bundled_files_are_packaged() -> None:
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"harbor/**/*"' in text
    for task in IDS:
        for script in ("tests/test.sh", "solution/solve.sh"):
            assert os.access(SUITE / task / script, os.X_OK), f"{task}/{script} is executable"
