"""Harbor tasks in containers, docker and podman: the bundled tasks' Dockerfiles start FROM a base
image built here from this machine's own binaries (the container tests' rootfs, nothing pulled,
with this interpreter and pytest: what the service and the pytest-graded task need); their COPY'd
files are placed at setup. Per runtime, the whole bundled suite: `uniagent run` with a scripted
model resolves every oracle sample and no empty one; a task whose Dockerfile has RUN steps is built
from its environment/ and `uniagent verify --gold` resolves it. Under CI=true the session fails
when neither runtime could run (`require_one_of`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_helpers import call
from conftest import require, require_one_of
from container_helpers import TOOLS, Runtime, add_python, build_rootfs_tar, import_image, open_runtime
from run_helpers import write_turns
from uniagent.tasks import load_tasks
from uniagent.tasks.harbor import HarborTask
from uniagent.tokens import ChatCodec

CLI = [sys.executable, "-m", "uniagent.cli"]
BASE = "localhost/uniagent-harbor-base:latest"
RUNTIMES = "a container runtime (docker or podman)"


def _missing(runtime: str, why: str) -> None:
    require_one_of(RUNTIMES, runtime, False, why)


@pytest.fixture(scope="module", params=["docker", "podman"])
def runtime(request: pytest.FixtureRequest) -> Iterator[Runtime]:
    require("ldd", shutil.which("ldd") is not None, "it assembles the base image from host binaries")
    with open_runtime(request.param, _missing) as rt:
        import_image(rt, build_rootfs_tar([*TOOLS, "setpriv", "chown"], add_python), BASE, _missing)
        require_one_of(RUNTIMES, rt.name, True, "")
        yield rt
        rt.run("rmi", "-f", BASE)


def uniagent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, env=os.environ)


def test_run_the_harbor_suite_in_a_container(runtime: Runtime, tmp_path: Path, codec: ChatCodec) -> None:
    box = [
        "--sandbox",
        "container",
        "--set",
        f"sandbox.runtime={runtime.name}",
        "--set",
        "sandbox.pull=never",
    ]
    tasks = load_tasks("builtin:harbor")
    plan = {}
    for task in tasks:
        assert isinstance(task, HarborTask) and task.spec.solution is not None
        text = task.spec.solution.read_text()
        solve = f"cat > /tmp/solve.sh <<'UA_EOF'\n{text}UA_EOF\nbash /tmp/solve.sh"
        plan[f"{task.instance_id}#0"] = [call("bash", command=solve), call("submit")]
        plan[f"{task.instance_id}#1"] = [call("submit")]
    replay = write_turns(tmp_path / "replay.jsonl", codec, plan)
    out = tmp_path / "run"
    proc = uniagent(
        "run", "--tasks", "builtin:harbor", "--model", f"replay:{replay}", "--samples", "2",
        "--max-turns", "3", "--output", str(out), *box,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    results = {(r["instance_id"], r["sample"]): r for r in rows}
    assert len(results) == 2 * len(tasks) == 6
    for task in tasks:
        oracle, empty = results[(task.instance_id, 0)], results[(task.instance_id, 1)]
        assert oracle["reward"] == 1.0, (task.instance_id, oracle.get("error"), oracle["verifier"])
        assert empty["reward"] == 0.0 and empty["exit_reason"] == "finished", task.instance_id
    leftover = runtime.run("ps", "-a", "-q", "--filter", f"ancestor={BASE}").stdout.strip()
    assert leftover == "", "every container of the run is gone"


def test_a_dockerfile_to_build_is_built_once_and_graded(runtime: Runtime, tmp_path: Path) -> None:
    """A Dockerfile with RUN: the container backend builds the task's image from environment/
    (FROM the local base, nothing pulled), then the task runs in it, its test.sh as
    `verifier.user`."""
    task = tmp_path / "tasks" / "built-env"
    (task / "environment").mkdir(parents=True)
    toml = 'schema_version = "1.1"\n[verifier]\nuser = "tester"\n[environment]\nbuild_timeout_sec = 300\n'
    (task / "task.toml").write_text(toml)
    (task / "instruction.md").write_text("Append a line `done` to note.txt.\n")
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {BASE}\nRUN mkdir -p /app && echo built > /app/marker.txt\n"
        "RUN echo tester:x:1000:1000::/tmp:/bin/bash >> /etc/passwd && echo tester:x:1000: >> /etc/group\n"
        "WORKDIR /app\nCOPY note.txt /app/\n"
    )
    (task / "environment" / "note.txt").write_text("start\n")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text(
        'ok=0; [ "$(cat /app/marker.txt)" = built ] && grep -qx done /app/note.txt && ok=1\n'
        '[ "$(id -u)" = 1000 ] || ok=0  # verifier.user\n'
        "echo $ok > /logs/verifier/reward.txt\n"
    )
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("echo done >> /app/note.txt\n")
    [loaded] = load_tasks(f"harbor:{task}")
    image = loaded.sandbox_config({"type": "container"}).image
    box = [
        "--sandbox",
        "container",
        "--set",
        f"sandbox.runtime={runtime.name}",
        "--set",
        "sandbox.pull=never",
    ]
    try:
        proc = uniagent(
            "verify", "--tasks", f"harbor:{task.parent}", "--gold", "--output", str(tmp_path / "v"), *box
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads((tmp_path / "v" / "report.json").read_text())
        assert report["resolved_ids"] == ["built-env"], report["instances"]
        assert runtime.run("image", "inspect", image).returncode == 0, (
            "the built image is kept for the next run"
        )
    finally:
        runtime.run("rmi", "-f", image)
