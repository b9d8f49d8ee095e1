"""bench/runner.py at a tiny size: its scripted workload, a real level (2 starter tasks, concurrency 2,
no latency) through the real runner child with bubblewrap sandboxes and the verifier, the
mini-swe-agent peer, and the kill/resume checker on a real run store. The full levels (1, 100,
1,000) are the bench's job, not a test's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import needs_bwrap
from uniagent.parsers import get_parser
from uniagent.runner.store import RunStore, episode_row
from uniagent.sandbox import procs
from uniagent.tasks import load_tasks

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # the bench's modules import each other as scripts do

import runner  # noqa: E402
import runner_probe  # noqa: E402


def figures(out: str) -> dict[tuple[str, str], dict]:
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return {(f["figure"], f.get("system", "")): f for f in lines}


def test_script_is_ten_turns_eight_explorations_gold_patch_submit():
    tasks = load_tasks(runner.TASKS)
    assert len(tasks) == 18
    parser = get_parser("hermes")
    for task in tasks:
        calls = [c for text in runner.script_turns(task) for c in parser.parse(text).calls]
        assert [c.name for c in calls] == ["bash"] * 9 + ["submit"]
        assert calls[8].arguments["command"].startswith("git apply <<'UA_EOF'\n")
        assert task.row["patch"] in calls[8].arguments["command"]
    assert runner.samples_for(1, 18) == 1 and runner.samples_for(100, 18) == 6
    assert runner.samples_for(1000, 18) == 56


@needs_bwrap
def test_tiny_level_and_peer_resolve_every_episode(tmp_path, codec, capsys):
    argv = ["--tasks", "2", "--delay", "0", "--sample-s", "0.5"]
    args = runner.build_parser().parse_args(argv)
    tasks = load_tasks(runner.TASKS, limit=2)
    ours = runner.run_level(2, tasks, codec, tmp_path / "level-2", args)
    assert ours["episodes"] == 2 and ours["resolved"] == 2 and ours["all_resolved"], ours
    assert ours["exits"] == {"finished": 2}
    assert ours["turns"] == 20  # ten scripted turns each
    assert ours["framework_cpu_ms_per_step"] > 0 and 0 < ours["cpu_util"] <= 1
    assert ours["loop_lag_ms"]["p99"] >= ours["loop_lag_ms"]["p50"] >= 0
    assert set(ours["episode_median_s"]) >= {"setup_s", "sandbox_start_s", "tools_s", "model_s", "verifier_s"}
    assert ours["peak_rss_mb"]["tree_sampled"] > 0
    assert ours["peak_memory_mb"]["tree_pss"] > 0 and "machine_delta" in ours["peak_memory_mb"]
    assert ours["leftovers"] == {"processes": [], "cgroups": [], "tmp": []}
    peer = runner.run_peer(2, tasks, tmp_path / "peer-2", args)
    assert peer["exits"] == {"Submitted": 2} and peer["resolved"] == 2, peer
    runner.emit_ratio(2, ours, peer)
    got = figures(capsys.readouterr().out)
    for name in ("wall_s", "episodes_per_min", "turns_per_s", "framework_cpu_ms_per_step", "cpu_util"):
        assert got[(name, "uniagent")]["value"] is not None
        assert got[(name, "mini-swe-agent")]["value"] is not None
    for name in ("peak_rss_mb", "open_fds_at_end", "loop_lag_ms", "exits", "leftovers", "episode_median_s"):
        assert (name, "uniagent") in got
    assert got[("peer_vs_uniagent_wall", "")]["value"] > 0


def _put(store: RunStore, iid: str, sample: int, resolved: bool = True) -> None:
    reward = {"value": float(resolved), "resolved": resolved, "details": {}}
    result = {"exit_reason": "finished", "trainable": True, "resolved": resolved, "reward": reward}
    store.put(episode_row(iid, sample, result))


def test_kill_resume_checker_finds_duplicates_missing_and_unresolved(tmp_path):
    expected = {("a", 0), ("a", 1), ("b", 0), ("b", 1)}
    clean = runner_probe.check_pairs([("a", 0), ("a", 1), ("b", 0), ("b", 1)], expected)
    assert clean["duplicates"] == clean["missing"] == clean["unexpected"] == []
    bad = runner_probe.check_pairs([("a", 0), ("a", 0), ("b", 1), ("c", 0)], expected, {("b", 1)})
    assert bad["duplicates"] == ["a#0"]
    assert bad["missing"] == ["a#1", "b#0"]
    assert bad["unexpected"] == ["c#0"]
    assert bad["unresolved"] == ["b#1"]

    run_dir = tmp_path / "run"
    store = RunStore(run_dir / "run.db")
    _put(store, "a", 0)
    _put(store, "a", 1)
    _put(store, "b", 0, resolved=False)
    _put(store, "a", 1)  # stored again over itself: what a resumed run must never do to a done pair
    store.close()
    rows = [{"instance_id": i, "sample": s} for i, s in [("a", 0), ("a", 1), ("a", 1)]]
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    check = runner_probe.check_run(run_dir, expected)
    assert check["stored"] == 3
    assert check["missing"] == ["b#1"]
    assert check["unresolved"] == ["b#0"]
    assert check["rewritten"] == ["a#1"]
    assert check["export_duplicates"] == ["a#1"]
    assert check["export_missing"] == ["b#0", "b#1"]


@pytest.mark.parametrize("level,tasks,samples", [(1, 18, 1), (100, 18, 6), (1000, 18, 56)])
def test_levels_match_the_issue_table(level, tasks, samples):
    assert runner.samples_for(level, tasks) * tasks == {1: 18, 100: 108, 1000: 1008}[level]
    assert samples == runner.samples_for(level, tasks)


def _stopped(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while procs.state(proc.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)


def test_survivor_check_counts_stopped_processes_in_and_out_of_the_tree(tmp_path):
    # A sandbox process stopped (state T) never ends by itself: it must count, marked as such,
    # whether the sampler saw it in the run's tree or it was reparented to init unseen (issue 14's
    # kill -9 left six such bwraps that the tree check missed). Matched by the run's TMPDIR in argv.
    marker = str(tmp_path / "tmp")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    root = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
    stray = subprocess.Popen([*sleeper, f"{marker}/uniagent-ws-1-x"])  # not under root
    other = subprocess.Popen([*sleeper, str(tmp_path / "elsewhere")])
    ended = subprocess.Popen([*sleeper[:2], "pass", marker])  # a zombie until reaped: not counted
    try:
        deadline = time.monotonic() + 5
        while not procs.children(root.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        (child,) = procs.children(root.pid)
        mon = runner_probe.TreeMonitor(root.pid, 0.05, marker)
        mon.sample()
        _stopped(stray)
        _stopped(root)
        os.kill(child, signal.SIGSTOP)
        while procs.state(child) != "T" or procs.state(ended.pid) != "Z":
            assert time.monotonic() < deadline + 5
            time.sleep(0.01)
        name = runner_probe.psutil.Process(stray.pid).name()
        assert sorted(mon.survivors()) == sorted(
            [f"sleep({child}, stopped)", f"{name}({stray.pid}, stopped)"]
        )
        os.kill(child, signal.SIGKILL)
        stray.kill()
        stray.wait()
        while procs.alive(child) and time.monotonic() < deadline + 10:
            time.sleep(0.01)
        assert mon.survivors() == []
    finally:
        procs.signal_pids(procs.children(root.pid), signal.SIGKILL)
        for p in (root, stray, other):
            p.kill()
            p.wait()
        ended.wait()
