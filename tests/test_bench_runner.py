"""bench/runner.py at a tiny size: its scripted workload; the whole script (2 starter tasks, concurrency
2, no latency, 2 repeats) through the real runner child with bubblewrap sandboxes and the verifier
and the mini-swe-agent peer graded in its workers, with CPU counted the same way on both sides;
the gate (a run with an unresolved episode prints no figure and exits 1); and the kill/resume
checker on a real run store. The full levels (1, 100, 1,000) are the bench's job, not a test's."""

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
import runner_figures  # noqa: E402
import runner_probe  # noqa: E402
import runner_workload  # noqa: E402

US, PEER = runner_figures.US, runner_figures.PEER


def lines_of(out: str) -> list[dict]:
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def pick(lines: list[dict], figure: str, system: str = "", **match: object) -> list[dict]:
    """The lines of one figure, for one system ('' for none), matching `match` (`stat=None`: a run's)."""
    return [
        f
        for f in lines
        if f["figure"] == figure
        and f.get("system", "") == system
        and all(f.get(k) == v for k, v in match.items())
    ]


def run_main(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr(
        sys, "argv", ["runner.py", "--tasks", "2", "--delay", "0", "--sample-s", "0.5", *argv]
    )
    return runner.main()


def test_script_is_ten_turns_eight_explorations_gold_patch_submit():
    tasks = load_tasks(runner.TASKS)
    assert len(tasks) == 18
    parser = get_parser("hermes")
    for task in tasks:
        calls = [c for text in runner_workload.script_turns(task) for c in parser.parse(text).calls]
        assert [c.name for c in calls] == ["bash"] * 9 + ["submit"]
        assert calls[8].arguments["command"].startswith("git apply <<'UA_EOF'\n")
        assert task.row["patch"] in calls[8].arguments["command"]
    assert runner_workload.samples_for(1, 18) == 1 and runner_workload.samples_for(100, 18) == 6
    assert runner_workload.samples_for(1000, 18) == 56


@needs_bwrap
def test_both_sides_repeated_peer_graded_in_its_workers_cpu_with_children(tmp_path, monkeypatch, capsys):
    rc = run_main(
        monkeypatch, "--levels", "2", "--repeats", "2", "--keep", str(tmp_path), "--goal-vs-peer", "0"
    )
    lines = lines_of(capsys.readouterr().out)
    assert rc == 0 and pick(lines, "ok")[0]["value"] is True, [f for f in lines if f["figure"] == "error"]
    for system in (US, PEER):
        for repeat in (0, 1):
            run = {f["figure"]: f for f in lines if f.get("system") == system and f.get("repeat") == repeat}
            assert run["all_resolved"]["value"] is True and run["failed"]["value"] == 0
            assert run["episodes"]["value"] == run["resolved"]["value"] == 2 and run["turns"]["value"] == 20
            rate = run["episodes_per_min"]
            assert rate["valid"] and rate["value"] == pytest.approx(120 / run["wall_s"]["value"], rel=0.01)
            # CPU on one basis on both sides: the whole tree (the child's own plus its sandboxes',
            # commands' and tests'), from the first episode on; start-up apart, the same way.
            total, own = run["cpu_ms_per_turn"]["value"], run["cpu_self_ms_per_turn"]["value"]
            kids = run["cpu_children_ms_per_turn"]["value"]
            assert own > 0 and kids > 0 and abs(total - own - kids) < 0.05
            assert kids >= run["cpu_basis"]["value"]["rusage_reaped_children_ms_per_turn"] - 0.05
            assert run["startup_wall_s"]["value"] > 0 and run["startup_cpu_s"]["value"] > 0
            window = run["wall_s"]["value"] + run["startup_wall_s"]["value"]
            assert run["process_wall_s"]["value"] >= window - 0.02  # the process holds both
        # median and spread of each figure over the repeats
        for name in runner_figures.SUMMARISED:
            (med,) = pick(lines, name, system, stat="median")
            runs = [f["value"] for f in pick(lines, name, system, stat=None) if "repeat" in f]
            assert med["valid"] and med["runs"] == runs and len(runs) == 2
            assert med["min"] <= med["value"] <= med["max"]
    # uniagent / peer per repeat, then its median and spread
    for name in runner_figures.RATIOS:
        per = pick(lines, f"{US}_vs_peer_{name}", stat=None)
        (med,) = pick(lines, f"{US}_vs_peer_{name}", stat="median")
        assert [f["repeat"] for f in per] == [0, 1] and all(f["valid"] for f in per)
        assert med["runs"] == [f["value"] for f in per] and med["valid"]
    ratio = pick(lines, f"{US}_vs_peer_episodes_per_min", stat=None)[0]["value"]
    ours0 = pick(lines, "episodes_per_min", US, repeat=0)[0]["value"]
    peer0 = pick(lines, "episodes_per_min", PEER, repeat=0)[0]["value"]
    assert ratio == round(ours0 / peer0, 3)
    (goal,) = pick(lines, "goal")
    assert goal["met"] and goal["valid"] and goal["of"] == f"{US}_vs_peer_episodes_per_min"
    # uniagent's own probes, as before
    run0 = {f["figure"]: f["value"] for f in lines if f.get("system") == US and f.get("repeat") == 0}
    assert run0["exits"] == {"finished": 2} and run0["leftovers"] == {
        "processes": [],
        "cgroups": [],
        "tmp": [],
    }
    assert run0["loop_lag_ms"]["p99"] >= run0["loop_lag_ms"]["p50"] >= 0
    assert set(run0["episode_median_s"]) >= {"setup_s", "sandbox_start_s", "tools_s", "model_s", "verifier_s"}
    assert run0["peak_memory_mb"]["tree_pss"] > 0 and "machine_delta" in run0["peak_memory_mb"]
    # The peer graded each episode in its worker, inside the episode and inside the timed window.
    for repeat in (0, 1):
        peer = json.loads((tmp_path / "peer-2" / f"r{repeat}" / "peer.json").read_text())
        assert len(peer["episodes"]) == 2
        for ep in peer["episodes"]:
            w = ep["window"]
            assert ep["exit_status"] == "Submitted" and ep["verify_status"] == "resolved", ep
            assert 0 <= w["start"] < w["agent_end"] <= w["verify_start"] < w["verify_end"] <= w["end"]
            assert w["end"] <= peer["window_s"]
        assert peer["startup_wall_s"] > 0  # imports and config before the window
    peer0 = {f["figure"]: f["value"] for f in lines if f.get("system") == PEER and f.get("repeat") == 0}
    assert peer0["verifier"] == {"resolved": 2} and peer0["exits"] == {"Submitted": 2}
    assert peer0["episode_median_s"]["verifier_s"] > 0
    assert not list(runner_probe.CPUACCT.glob(f"bench-runner-{os.getpid()}-*"))  # groups removed


@needs_bwrap
def test_an_unresolved_episode_voids_the_figures_and_fails_the_exit(monkeypatch, capsys):
    # Two turns allowed of the ten scripted: the episode ends unresolved (max_turns).
    argv = ("--tasks", "1", "--levels", "1", "--repeats", "1", "--no-peer", "--set", "agent.max_turns=2")
    assert run_main(monkeypatch, *argv) == 1
    lines = lines_of(capsys.readouterr().out)
    run = {f["figure"]: f for f in lines if f.get("system") == US and f.get("repeat") == 0}
    assert run["all_resolved"]["value"] is False and run["failed"]["value"] == 1
    assert run["exits"]["value"] == {"max_turns": 1}
    for name in ("episodes_per_min", "wall_s", "cpu_ms_per_turn", "turns_per_s"):
        assert run[name]["value"] is None and run[name]["valid"] is False and "unchecked" in run[name]
        (med,) = pick(lines, name, US, stat="median")
        assert med["value"] is None and med["valid"] is False
    assert pick(lines, "ok")[0]["value"] is False


@needs_bwrap
def test_kill_resume_at_a_tiny_size_stores_every_pair_once(monkeypatch, capsys):
    # Two waves of two 5-second episodes: the kill lands in the second whatever the seeded jitter.
    argv = ("--kill-resume", "--no-peer", "--levels", "2", "--samples-per-level", "2", "--delay", "0.5")
    rc = run_main(monkeypatch, *argv, "--survivor-wait", "5")
    lines = lines_of(capsys.readouterr().out)
    (report,) = pick(lines, "kill_resume")
    assert rc == 0, report
    value = report["value"]
    assert value["killed"] and value["stored_after_resume"] == value["episodes"] == 4
    assert value["duplicates"] == value["missing"] == value["unresolved"] == 0
    assert not value["bwrap_survivors"]


def test_gate_voids_ratios_and_goals_resting_on_an_unresolved_run(capsys):
    good = {"all_resolved": True, "episodes_per_min": 200.0, "episodes_per_min_with_startup": 150.0}
    bad = {**good, "all_resolved": False}
    for name in runner_figures.RATIOS:
        good.setdefault(name, 1.0)
    bad.update({k: v for k, v in good.items() if k != "all_resolved"})
    vs = runner_figures.ratios([good, good], [good, bad], level=1000)
    assert vs["episodes_per_min"]["runs"] == [1.0] and not vs["episodes_per_min"]["valid"]
    ours = runner_figures.summarise([good, bad], 2, level=1000, system=US)
    assert ours["episodes_per_min_with_startup"]["median"] == 150.0  # above the goal, but not valid
    assert runner_figures.goals(1000, ours, vs, 0.5) is False
    assert runner_figures.goals(1000, runner_figures.summarise([good], 1), {}, None) is True
    lines = lines_of(capsys.readouterr().out)
    goals = pick(lines, "goal")
    assert [g["met"] for g in goals] == [False, False, True]
    per = pick(lines, f"{US}_vs_peer_episodes_per_min", stat=None)
    assert [f["value"] for f in per] == [1.0, None]
    runner_figures.emit_run({**bad, "resolved": 1}, system=PEER)
    lines = lines_of(capsys.readouterr().out)
    assert pick(lines, "resolved", PEER)[0]["value"] == 1  # what went wrong stays visible
    assert pick(lines, "episodes_per_min", PEER)[0]["value"] is None


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
    assert runner_workload.samples_for(level, tasks) * tasks == {1: 18, 100: 108, 1000: 1008}[level]
    assert samples == runner_workload.samples_for(level, tasks)


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
