"""The peer of bench/runner.py: the same scripted episodes through mini-swe-agent's own loop.

mini-swe-agent's SWE-bench batch runner (`minisweagent.run.benchmarks.swebench`) runs
`process_instance` in a `ThreadPoolExecutor(max_workers=workers)`: per instance a model, an
environment, a `ProgressTrackingAgent` (its `DefaultAgent`), `agent.run(task)`, the trajectory
saved as JSON and the submission written to preds.json with its `update_preds_file`. This module
does the same with what differs made explicit:

* environment: `LocalEnvironment` (commands run on the host with `subprocess`, a new bash per
  command, no isolation) in a temp copy of the task's repository with one fresh git commit, since
  its Docker/Singularity environments need images this machine does not have;
* model: `DeterministicToolcallModel` answering the same nine bash commands as uniagent's script,
  then `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff` (its submit convention), each
  query sleeping `delay_s` first (a blocking call in the worker thread, as its litellm models are);
* agent config: its `benchmarks/swebench.yaml` templates, with the cost limit off (the
  deterministic model bills 1.0 per call);
* no verifier of its own (mini-swe-agent only writes preds.json): each worker grades its episode's
  submission with uniagent's verifier (`uniagent verify`'s `grade_one`, a fresh local sandbox) right
  after its agent finishes, inside that episode's timed work as uniagent's verifier is inside its
  episodes, so the peer's wall holds its grading, in parallel across its workers. Each episode's
  record gives its window (start, agent end, grading start and end, end; seconds from the run's).

Timed the way bench/runner_child.py times uniagent: everything imported (mini-swe-agent's modules,
the verifier and what it imports on its first grade) and configured before the window starts; the
window runs from the pool's start to its last episode's end; CPU is read at both ends of it by
`runner_child.rusage`: this process's own, its reaped children's and its cpuacct cgroup's (the
whole tree: every command's bash, the git calls, the grading sandboxes).

    .venv/bin/python bench/runner_peer.py SPEC.json    # written by bench/runner.py
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from runner_child import STARTED, join_cpuacct, peak_rss_kb, rusage, warm_imports
from runner_workload import TASKS, episode_commands
from uniagent.tasks import load_tasks
from uniagent.tasks.base import Task

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"
GIT = ["git", "-c", "user.name=peer", "-c", "user.email=peer@localhost", "-c", "init.defaultBranch=main"]


def peer_outputs(commands: list[str]) -> list[dict[str, Any]]:
    """One tool-call message per command, in mini-swe-agent's own format (`make_toolcall_output`)."""
    from minisweagent.models.test_models import make_toolcall_output

    outputs = []
    for command in commands:
        cid = f"call_{uuid.uuid4().hex[:12]}"
        call = {
            "id": cid,
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        }
        outputs.append(make_toolcall_output(None, [call], [{"command": command, "tool_call_id": cid}]))
    return outputs


def make_model(outputs: list[dict[str, Any]], delay_s: float, model_cfg: dict[str, Any]) -> Any:
    from minisweagent.models.test_models import DeterministicToolcallModel

    class SlowModel(DeterministicToolcallModel):
        """A model call that takes `delay_s`, like a remote endpoint called from a worker thread."""

        def query(self, messages: list[dict[str, str]], **kwargs: Any) -> dict:
            time.sleep(delay_s)
            return super().query(messages, **kwargs)

    keep = {k: model_cfg[k] for k in ("observation_template",) if k in model_cfg}
    return SlowModel(outputs=outputs, **keep)


def prepare_repo(task: Task, root: Path) -> Path:
    """A copy of the task's repository with one commit, as an SWE-bench image's /testbed is."""
    src = task.repo_path()
    assert src is not None
    repo = root / "repo"
    shutil.copytree(src, repo)
    subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "base"], cwd=repo, check=True)
    return repo


def run_episode(
    task: Task, sample: int, config: dict[str, Any], spec: dict[str, Any], pm: Any, t0: float
) -> dict[str, Any]:
    """mini-swe-agent's `process_instance`, on a LocalEnvironment in a temp copy of the repo, then its
    submission graded by uniagent's verifier in this worker. Times are seconds from `t0`, the run's."""
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.run.benchmarks.swebench import update_preds_file
    from minisweagent.run.benchmarks.utils.common import ProgressTrackingAgent

    from uniagent.tasks.verify import grade_one

    key = f"{task.instance_id}__{sample}"
    out = Path(spec["output"])
    root = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    window = {"start": time.monotonic() - t0}
    exit_status, submission, turns, graded = None, "", 0, {"status": "not graded"}
    try:
        model = make_model(peer_outputs([*episode_commands(task), SUBMIT]), spec["delay_s"], config["model"])
        pm.on_instance_start(key)
        env_cfg = {"env": {k: v for k, v in config["environment"]["env"].items() if k != "BASH_ENV"}}
        env = LocalEnvironment(cwd=str(prepare_repo(task, root)), timeout=60, **env_cfg)
        agent = ProgressTrackingAgent(model, env, progress_manager=pm, instance_id=key, **config["agent"])
        try:
            info = agent.run(task.row["problem_statement"])
            exit_status, submission = info.get("exit_status"), info.get("submission", "")
        except Exception as exc:
            exit_status = type(exc).__name__
        turns = agent.n_calls
        agent.save(out / key / f"{key}.traj.json", {"info": {"exit_status": exit_status}, "instance_id": key})
        update_preds_file(out / "preds.json", key, "deterministic", submission)
        window["agent_end"] = window["verify_start"] = time.monotonic() - t0
        graded = asyncio.run(grade_one(task, submission or "", {"type": "local"}))
        window["verify_end"] = time.monotonic() - t0
        pm.on_instance_end(key, exit_status)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    window["end"] = time.monotonic() - t0
    return {
        "instance_id": task.instance_id,
        "sample": sample,
        "exit_status": exit_status,
        "submission": submission,
        "turns": turns,
        "resolved": graded["status"] == "resolved",
        "verify_status": graded["status"],
        "verify_error": graded.get("error"),
        "window": window,
    }


def peer_config() -> dict[str, Any]:
    from minisweagent.config import builtin_config_dir, get_config_from_spec

    config = get_config_from_spec(str(builtin_config_dir / "benchmarks" / "swebench.yaml"))
    config["agent"]["cost_limit"] = 0  # 0: no limit (the deterministic model bills 1.0 per call)
    return config


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    join_cpuacct(spec.get("cpuacct"))
    from minisweagent.environments.local import LocalEnvironment  # noqa: F401  (imports: start-up)
    from minisweagent.models.test_models import DeterministicToolcallModel  # noqa: F401
    from minisweagent.run.benchmarks.swebench import update_preds_file  # noqa: F401
    from minisweagent.run.benchmarks.utils.batch_progress import RunBatchProgressManager
    from minisweagent.run.benchmarks.utils.common import ProgressTrackingAgent  # noqa: F401

    warm_imports()
    tasks = load_tasks(TASKS, limit=spec["tasks"])
    jobs = [(t, s) for t in tasks for s in range(spec["samples"])]
    config = peer_config()
    pm = RunBatchProgressManager(len(jobs), Path(spec["output"]) / "exit_statuses.yaml")
    cpu_start, t0 = rusage(), time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=spec["concurrency"]) as pool:
        futures = [pool.submit(run_episode, t, s, config, spec, pm, t0) for t, s in jobs]
        episodes = [f.result() for f in futures]
    end, cpu_end = time.monotonic(), rusage()
    out = {
        "ok": True,
        "window_s": end - t0,
        "startup_wall_s": t0 - STARTED,
        "cpu_start": cpu_start,
        "cpu_end": cpu_end,
        "episodes": episodes,
        "turns": sum(e["turns"] for e in episodes),
        "maxrss_kb": peak_rss_kb(),
        "open_fds": len(os.listdir("/proc/self/fd")) - 1,
    }
    Path(spec["result"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
