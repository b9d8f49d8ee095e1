"""A real run for the dashboard tests, made once per test session and shared by both modules.

`uniagent run` (real CLI process, real bubblewrap sandboxes, real verifiers) replays scripted
turns through the real ReplayEngine on four starter tasks, two samples each, so the store holds
resolved, unresolved and max_turns episodes with token trajectories. One episode echoes a string
that the dashboard (not the runner) is told is a secret. One infrastructure failure (no
trajectory, not trainable) is added with `RunStore.put`, as the runner would store it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from agent_helpers import call
from run_helpers import gold_turns, write_turns
from uniagent.runner.store import RunStore, episode_row
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

SECRET = "sk-dash-7f3a9c1e5b2d4680"
SECRET_ENV = "UNIAGENT_TEST_DASHBOARD_API_KEY"
CLI = [sys.executable, "-m", "uniagent.cli"]
_CACHE: dict[str, Path] = {}


def scripts(tasks: list[Any]) -> dict[tuple[str, int], list[str]]:
    t0, t1, t2, t3 = (t.instance_id for t in tasks)
    wander = [call("bash", command=f"echo token={SECRET} && ls"), call("bash", command="pwd")]
    return {
        (t0, 0): gold_turns(tasks[0]),
        (t0, 1): [call("submit")],
        (t1, 0): gold_turns(tasks[1]),
        (t1, 1): gold_turns(tasks[1]),
        (t2, 0): wander,
        (t2, 1): gold_turns(tasks[2]),
        (t3, 0): [call("submit")],
        (t3, 1): gold_turns(tasks[3]),
    }


def write_replay(path: Path, codec: ChatCodec, plan: dict[tuple[str, int], list[str]]) -> Path:
    # Varied logprobs so the token view's shading has something to show.
    turns = {f"{iid}#{sample}": texts for (iid, sample), texts in plan.items()}
    return write_turns(path, codec, turns, lambda n: [-((k * 7) % 23) / 9.0 for k in range(n)])


def infra_failure_row(instance_id: str = "infra-001", sample: int = 0) -> dict[str, Any]:
    return episode_row(
        instance_id,
        sample,
        {
            "exit_reason": "sandbox_dead",
            "trainable": False,
            "resolved": False,
            "reward": None,
            "metrics": {"turns": 0, "wall_s": 1.5, "sandbox_start_s": 1.5},
            "messages": [{"role": "system", "content": "You are an agent."}],
            "error": "the sandbox died while starting",
        },
    )


def replay_run(base: Path, codec: ChatCodec) -> Path:
    """The shared run directory (made on first use)."""
    if "run" in _CACHE:
        return _CACHE["run"]
    tasks = load_tasks("builtin:starter")[:4]
    plan = scripts(tasks)
    replay = write_replay(base / "replay.jsonl", codec, plan)
    out = base / "run"
    ids = ",".join(t.instance_id for t in tasks)
    args = ["run", "--tasks", "builtin:starter", "--model", f"replay:{replay}", "--samples", "2"]
    args += ["--concurrency", "4", "--max-turns", "2", "--output", str(out), "--set", f"tasks.ids=[{ids}]"]
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The tests expect exactly the scripted outcomes: no episode may fail for infrastructure
    # reasons (concurrent samples once shared their task's base commit; see test_grader_hacks).
    store = RunStore(out / "run.db", readonly=True)
    failed = [
        (r["instance_id"], r["sample"], r["error"]) for r in store.rows(full=False) if not r["trainable"]
    ]
    store.close()
    assert failed == [], failed
    store = RunStore(out / "run.db")
    store.put(infra_failure_row())
    store.close()
    _CACHE["run"] = out
    return out


def stored_rows(run_dir: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The run's stored rows by (instance, sample)."""
    store = RunStore(run_dir / "run.db", readonly=True)
    rows = {(r["instance_id"], r["sample"]): r for r in store.rows()}
    store.close()
    return rows


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "run.db", dst / "run.db")
    return dst


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DashboardServer:
    """`uniagent dashboard` as a real process on a free port."""

    def __init__(self, run_dirs: list[Path], *extra: str, host: str = "127.0.0.1", token: str | None = None):
        self.port = free_port()
        self.host = host
        self.url = f"http://127.0.0.1:{self.port}/"
        env = {**os.environ, SECRET_ENV: SECRET}
        args = [*CLI, "dashboard", *map(str, run_dirs), "--host", host, "--port", str(self.port)]
        args += ["--poll-ms", "500", *extra]
        if token:
            args += ["--token", token]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read()[-3000:] if self.proc.stderr else ""
            try:
                r = httpx.get(self.url + "api/health", params={"token": token} if token else None, timeout=2)
                if r.status_code in (200, 401):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise AssertionError("the dashboard did not answer within 60 s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> DashboardServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
