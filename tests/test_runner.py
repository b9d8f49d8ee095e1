"""`uniagent run` end to end: real CLI processes, real sandboxes, real stores.

Model turns come from the real ReplayEngine (scripted gold fixes or empty submissions) so
the runs are deterministic; one test runs the real SmolLM2 engine on two tasks.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import needs_bwrap, require_module
from run_helpers import replay_run_args, starter_run, write_replay, write_turns
from uniagent.runner import RunStore, summarize
from uniagent.runner.summary import pass_at_k
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

pytestmark = needs_bwrap
CLI = [sys.executable, "-m", "uniagent.cli"]


@pytest.fixture(scope="module")
def starter():
    tasks = load_tasks("builtin:starter")
    assert len(tasks) >= 12
    return tasks


def uniagent(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def test_pass_at_k_estimator() -> None:
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25) and pass_at_k(4, 1, 2) == pytest.approx(0.5)


def test_replay_run_on_the_starter_suite(tmp_path: Path, codec: ChatCodec, starter) -> None:
    wrong = {(starter[0].instance_id, 0)}
    replay = write_replay(tmp_path / "replay.jsonl", codec, starter, wrong=wrong)
    out = tmp_path / "run"
    proc = uniagent(*starter_run(replay, out, "--concurrency", "4", "--max-turns", "5"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    n = len(starter)
    assert summary["episodes"] == n and summary["resolved"] == n - 1
    assert summary["exit_reasons"] == {"finished": n} and summary["trainable_fraction"] == 1.0
    assert summary["pass@1"] == pytest.approx((n - 1) / n, abs=1e-4)
    store = RunStore(out / "run.db", readonly=True)
    rows = list(store.rows())
    assert summarize(store) == summary, "summary.json is the store's summary"
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["instance_id"], r["sample"], r["reward"]) for r in results] == [
        (r["instance_id"], r["sample"], r["reward"]) for r in rows
    ]
    preds = [json.loads(line) for line in (out / "preds.jsonl").read_text().splitlines()]
    assert {p["instance_id"] for p in preds} == {t.instance_id for t in starter}
    assert all(set(p) == {"instance_id", "model_name_or_path", "model_patch"} for p in preds)
    for r in rows:
        (traj,) = r["segments"]
        assert traj and traj["drift"] is None and sum(traj["response_mask"]) > 0
        assert r["verifier"]["resolution"] in ("RESOLVED_FULL", "RESOLVED_NO")
    assert "resolved" in proc.stdout and "summary.json" in proc.stdout


def test_kill_9_mid_run_then_resume_stores_every_pair_once(tmp_path: Path, codec: ChatCodec, starter) -> None:
    tasks = starter[:4]
    replay = write_replay(tmp_path / "replay.jsonl", codec, tasks, samples=2)
    ids = ",".join(t.instance_id for t in tasks)
    out = tmp_path / "run"
    args = replay_run_args(replay, out, ids.split(","), samples=2, sets=["model.replay_delay_s=0.4"])
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    db = out / "run.db"
    deadline = time.monotonic() + 180
    stored = 0
    while time.monotonic() < deadline:
        if db.exists():
            try:
                stored = sqlite3.connect(db).execute("SELECT COUNT(*) FROM episodes").fetchone()[0]
            except sqlite3.OperationalError:
                stored = 0
        if stored >= 2:
            break
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    before = sqlite3.connect(db).execute("SELECT COUNT(*) FROM episodes").fetchone()[0]
    assert 2 <= before < 8, "killed mid-run"
    again = uniagent(*args, "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    store = RunStore(db, readonly=True)
    rows = list(store.rows(full=False))
    pairs = [(r["instance_id"], r["sample"]) for r in rows]
    assert sorted(pairs) == sorted((t.instance_id, s) for t in tasks for s in range(2))
    assert all(r["attempts"] == 1 for r in rows), "stored episodes were not run again"
    assert all(r["resolved"] for r in rows)


def test_existing_run_needs_resume_and_bad_config_exits_2(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    store = RunStore(tmp_path / "run" / "run.db")
    store.put(
        {
            "instance_id": "x",
            "sample": 0,
            "exit_reason": "finished",
            "trainable": 1,
            "reward": 1.0,
            "resolved": 1,
            "turns": 1,
            "prompt_tokens": 1,
            "completion_tokens": 1,
            "drift": None,
            "wall_s": 1.0,
            "timings": {},
            "metrics": {},
            "messages": [],
            "patch": "",
            "answer": None,
            "verifier": {},
            "segments": [],
            "error": None,
            "finished_at": 0.0,
        }
    )
    store.close()
    proc = uniagent(*starter_run("/nonexistent", tmp_path / "run"))
    assert proc.returncode == 2 and "--resume" in proc.stderr
    proc = uniagent("run", "--set", "model.temprature=1")
    assert proc.returncode == 2 and "model.temprature" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2
    proc = uniagent("run", "--set", "runner.concurrency=0")
    assert proc.returncode == 2 and "runner.concurrency" in proc.stderr
    proc = uniagent("run", "--tasks", "builtin:nope")
    assert proc.returncode == 2 and "builtin:starter" in proc.stderr


def test_ray_backend_on_a_local_cluster(tmp_path: Path, codec: ChatCodec, starter) -> None:
    require_module("ray", "the Ray runner backend (a verl dependency)")
    tasks = starter[:3]
    replay = write_replay(tmp_path / "replay.jsonl", codec, tasks)
    ids = ",".join(t.instance_id for t in tasks)
    out = tmp_path / "run"
    proc = uniagent(
        *starter_run(replay, out, "--backend", "ray", "--concurrency", "2", "--set", f"tasks.ids=[{ids}]")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 3 and summary["resolved"] == 3


def test_secrets_never_reach_the_store(tmp_path: Path, codec: ChatCodec, starter) -> None:
    secret = "sk-live-0123456789abcdef"
    task = starter[0]
    from agent_helpers import call

    turns = [call("bash", command=f"echo {secret}"), call("submit")]
    write_turns(tmp_path / "r.jsonl", codec, {f"{task.instance_id}#0": turns}, lambda n: [0.0] * n)
    out = tmp_path / "run"
    proc = uniagent(
        *starter_run(tmp_path / "r.jsonl", out, "--set", f"tasks.ids=[{task.instance_id}]"),
        env={"OPENAI_API_KEY": secret},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for f in out.iterdir():
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f"secret in {f.name}"
    assert "[REDACTED]" in (out / "results.jsonl").read_text()


@pytest.mark.slow
def test_real_local_engine_on_two_tasks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = uniagent(
        "run",
        "--tasks",
        "builtin:starter",
        "--model",
        "local",
        "--limit",
        "2",
        "--max-turns",
        "2",
        "--concurrency",
        "2",
        "--output",
        str(out),
        "--set",
        "model.max_tokens=48",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = RunStore(out / "run.db", readonly=True)
    rows = list(store.rows())
    assert len(rows) == 2
    for r in rows:
        assert r["exit_reason"] in ("finished", "max_turns", "format_errors", "context_limit")
        assert r["trainable"] and r["reward"] is not None
        (traj,) = r["segments"]
        assert traj["drift"] is None and sum(traj["response_mask"]) == r["completion_tokens"]
