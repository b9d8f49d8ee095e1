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
* no verifier: mini-swe-agent only writes preds.json; `grade` below scores the submissions with
  uniagent's verifier in local sandboxes after the run, timed separately by bench/runner.py.

    .venv/bin/python bench/runner_peer.py SPEC.json    # written by bench/runner.py
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from runner_child import peak_rss_kb
from runner_workload import TASKS, episode_commands
from uniagent.tasks import load_tasks
from uniagent.tasks.base import Task

STARTED = time.monotonic()
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


def run_episode(task: Task, sample: int, config: dict[str, Any], spec: dict[str, Any], pm: Any) -> dict:
    """mini-swe-agent's `process_instance`, on a LocalEnvironment in a temp copy of the repo."""
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.run.benchmarks.swebench import update_preds_file
    from minisweagent.run.benchmarks.utils.common import ProgressTrackingAgent

    key = f"{task.instance_id}__{sample}"
    out = Path(spec["output"])
    root = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    t0 = time.perf_counter()
    exit_status, submission, turns = None, "", 0
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
        pm.on_instance_end(key, exit_status)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "instance_id": task.instance_id,
        "sample": sample,
        "exit_status": exit_status,
        "submission": submission,
        "turns": turns,
        "seconds": time.perf_counter() - t0,
    }


def peer_config() -> dict[str, Any]:
    from minisweagent.config import builtin_config_dir, get_config_from_spec

    config = get_config_from_spec(str(builtin_config_dir / "benchmarks" / "swebench.yaml"))
    config["agent"]["cost_limit"] = 0  # 0: no limit (the deterministic model bills 1.0 per call)
    return config


def main(spec_path: str) -> int:
    from minisweagent.run.benchmarks.utils.batch_progress import RunBatchProgressManager

    spec = json.loads(Path(spec_path).read_text())
    tasks = load_tasks(TASKS, limit=spec["tasks"])
    jobs = [(t, s) for t in tasks for s in range(spec["samples"])]
    config = peer_config()
    pm = RunBatchProgressManager(len(jobs), Path(spec["output"]) / "exit_statuses.yaml")
    t0 = time.monotonic()
    boot = resource.getrusage(resource.RUSAGE_SELF)  # imports and config: start-up, apart
    with concurrent.futures.ThreadPoolExecutor(max_workers=spec["concurrency"]) as pool:
        futures = [pool.submit(run_episode, t, s, config, spec, pm) for t, s in jobs]
        episodes = [f.result() for f in futures]
    wall = time.monotonic() - t0
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {
        "wall_s": wall,
        "episodes": episodes,
        "turns": sum(e["turns"] for e in episodes),
        "user_s": me.ru_utime,
        "sys_s": me.ru_stime,
        "children_cpu_s": kids.ru_utime + kids.ru_stime,
        "maxrss_kb": peak_rss_kb(),
        "startup_cpu_s": boot.ru_utime + boot.ru_stime,
        "startup_wall_s": t0 - STARTED,
        "open_fds": len(os.listdir("/proc/self/fd")) - 1,
    }
    Path(spec["result"]).write_text(json.dumps(out))
    return 0


def grade(tasks: list[Task], episodes: list[dict[str, Any]], concurrency: int) -> list[bool]:
    """The peer's submissions scored by uniagent's verifier (`uniagent verify`'s `grade_one`) in
    local sandboxes: resolved or not, per episode."""
    from uniagent.tasks.verify import grade_one

    by_id = {t.instance_id: t for t in tasks}
    sem = asyncio.Semaphore(concurrency)

    async def one(ep: dict[str, Any]) -> bool:
        async with sem:
            res = await grade_one(by_id[ep["instance_id"]], ep["submission"] or "", {"type": "local"})
        return res["status"] == "resolved"

    async def all_() -> list[bool]:
        return list(await asyncio.gather(*(one(e) for e in episodes)))

    return asyncio.run(all_())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
