"""`uniagent run` at concurrency 1, 100 and 1,000 on scripted 10-turn SWE episodes, measured from
outside, against mini-swe-agent's loop on the same episodes in the same run.

Workload (issue 14's table): the 18 `builtin:starter` tasks x `samples` (1 at concurrency 1, 6 at 100,
56 at 1,000: 18, 108 and 1,008 episodes). Each episode is scripted (the model's turns are written with
the project's own API, `ReplayRecord` + `save_records`, as SmolLM2 token ids from the real `ChatCodec`):
8 exploration commands through the `bash` tool (ls, cat, grep, git status, git log -1, find, head,
python -c), the task's gold patch applied with `git apply` through `bash`, then `submit`. The engine is
the real `ReplayEngine` with `model.replay_delay_s` (default 1 s) per turn; sandboxes are real bubblewrap
`local` sandboxes, the verifier is the real SWE verifier (tests run in the sandbox, graded by swebench's
parser), the store is the real run store. Every episode must end resolved.

Each side runs in a child process (uniagent: bench/runner_child.py, `build_config` + `Runner.run()`,
what `uniagent run` calls; the peer: bench/runner_peer.py), so this process measures it from outside
and a kill -9 is real. Both sides are timed the same way:

* start-up apart: each child imports everything (the verifier's first-grade imports included) and
  starts before its timed window; the window runs from its first episode's start (the peer: its
  pool's start) to the end of its run. ``startup_wall_s``/``startup_cpu_s`` report what came before;
* ``episodes_per_min``: resolved episodes over the window (``failed``: scripted minus resolved;
  ``episodes_per_min_with_startup``: over the process's whole wall, issue 14's basis, which
  ``vs_baseline`` (61.6 at 100 / 44.1 at 1,000 on main at 74b8174) and the goal at 1,000 (>= 130)
  use); ``wall_s`` (the window), ``process_wall_s``, ``turns_per_s`` (model turns);
* ``cpu_ms_per_turn``: CPU over the window per model turn, of the child's whole process tree, read in
  the child at both ends: each side's child runs in a cgroup v1 cpuacct group of its own made here
  (uniagent moves its sandboxes in other hierarchies only), so every process it starts is counted,
  orphans and processes killed with their parent included (RUSAGE_CHILDREN loses those: on this
  machine it missed over half of either side's tree; ``cpu_basis`` gives it for comparison, and says
  when, without cpuacct, the figure falls back to RUSAGE_SELF + RUSAGE_CHILDREN). Split into
  ``cpu_self_ms_per_turn`` (RUSAGE_SELF: the child process's own threads) and
  ``cpu_children_ms_per_turn`` (the rest: sandboxes, shells, commands, git, the verifier's tests).
  Both sides run the same commands and tests, so the difference is the frameworks'.
  ``process_cpu_s``: the tree's CPU over the child's whole life, start-up included;
* ``cpu_util``: machine-wide busy fraction of all cores from /proc/stat over the run (with user/sys
  seconds): the machine may be shared, so run it on an idle one;
* ``peak_rss_mb`` of the child (VmHWM) and of its tree (sampled with psutil every `--sample-s` s;
  ``monitor_cpu_s`` is what that sampling cost, inside cpu_util); ``peak_memory_mb``: the tree's peak
  PSS (every 5th sample) and the machine's memory in use above its use before the run
  (``machine_delta``: MemTotal - MemAvailable, kernel memory for the processes included);
* uniagent only: ``open_fds_at_end`` (after its run returned), ``leftovers`` (descendants alive
  `--survivor-wait` s after it exited, ``tree_gone_after_s``, its sandbox cgroups `uniagent-PID-*`,
  entries left in its private TMPDIR), ``loop_lag_ms`` p50/p99 (a coroutine that sleeps 50 ms and
  records how late it wakes), with ``--stalls`` ``loop_stalls`` (each stall over 100 ms with the main
  thread's CPU and scheduler states; stacks in child.json), ``verifier_parse_cpu_s``, and
  ``episode_median_s`` (setup / sandbox start / tools / model / verifier / episode from the store);
* ``exits``, ``resolved``, ``all_resolved`` per run.

Repeats (`--repeats`, default 3): each level runs both sides that many times, alternating which goes
first. Every run's figures carry ``repeat``; then each figure's median, min, max and runs
(``stat: median``), and ``uniagent_vs_peer_<figure>`` (uniagent / peer: episodes/min, wall, CPU per
turn) per repeat and its median and spread. Every figure is gated (bench/runner_figures.py): a run
where any scripted episode is missing or unresolved prints its figures as null (``valid: false``,
the measured number under ``unchecked``), and so does any median, ratio or goal resting on it. The
script exits 1 when a run is not all resolved or a goal is missed (``ok`` says which), else 0.

Peer (``--no-peer`` to skip, ``--peer-only`` for it alone): the same episodes through mini-swe-agent's
own `DefaultAgent` (its batch runner's `ProgressTrackingAgent`), `LocalEnvironment` and
`DeterministicToolcallModel` (sleeping the same latency per query), in a thread pool of `concurrency`
workers as its swebench batch runner does (bench/runner_peer.py). What differs: the peer has no
isolation (commands run on the host, in a temp copy of the repository with a fresh git commit), no
persistent shell (a process per command), no store (its trajectory JSON and preds.json files), and no
verifier of its own: each worker grades its episode with uniagent's verifier (`grade_one`, a fresh
local sandbox) right after its agent finishes, inside the episode and the window, in parallel
across the workers (its ``episode_median_s``: agent / verifier / episode).

``--kill-resume``: run the 1,000 level (or ``--levels``' first), `kill -9` the runner once a seeded
random fraction of the episodes is stored, check that no bwrap survived it, rerun with `--resume`,
and check from the store and its export that every (instance, sample) pair is stored exactly once
and resolved: ``kill_resume`` {killed_at_s, stored_before_kill, stored_after_resume, duplicates,
missing, unresolved, survivors, and the killed run's temp dirs and cgroups after the kill and after
the resume: kill -9 runs no cleanup, so what the next run does about them shows here}; exit 1 unless
``ok``. Measuring and the store checks live in bench/runner_probe.py.

    .venv/bin/python bench/runner.py --levels 1,20 --tasks 6    # development: ~10 min with the peer
    .venv/bin/python bench/runner.py                            # 1, 100, 1,000 + peer: an idle machine
    .venv/bin/python bench/runner.py --kill-resume --no-peer
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner_figures import PEER, US, emit, emit_run, goals, ratios, summarise, vs_baseline
from runner_probe import (
    TreeMonitor,
    cgroups_snapshot,
    check_run,
    cpu_delta,
    cpu_times,
    cpuacct_group,
    group_cpu_s,
    level_figures,
    peer_figures,
    remove_group,
    store_rows,
)
from runner_workload import MAX_TURNS, TASKS, load_codec, samples_for, write_script
from uniagent.tasks import load_tasks
from uniagent.tasks.base import Task
from uniagent.tokens import ChatCodec

HERE = Path(__file__).resolve().parent
log = logging.getLogger("bench.runner")


def child_spec(
    out: Path,
    script: Path,
    level: int,
    samples: int,
    args: argparse.Namespace,
    cpuacct: Path | None = None,
    stalls: bool = False,
) -> Path:
    """The runner child's spec (bench/runner_child.py) for one level; `stalls` records why its loop stalls."""
    spec = {
        "flags": {
            "tasks.spec": TASKS,
            "tasks.limit": args.tasks,
            "model.spec": f"replay:{script}",
            "model.replay_delay_s": args.delay,
            "runner.concurrency": level,
            "runner.samples": samples,
            "runner.output": str(out / "run"),
            "agent.max_turns": MAX_TURNS,
        },
        "set": list(args.set),
        "stalls": stalls,
        "result": str(out / "child.json"),
        "cpuacct": str(cpuacct) if cpuacct else None,
    }
    path = out / "child-spec.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


def start_child(spec: Path, log_path: Path, resume: bool = False) -> subprocess.Popen[bytes]:
    if resume:
        data = json.loads(spec.read_text())
        data["flags"]["runner.resume"] = True
        spec.write_text(json.dumps(data, indent=1))
    return spawn("runner_child.py", spec, log_path)


def spawn(script: str, spec: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """A bench child with its own TMPDIR beside its spec (sandboxes run with a cleared environment,
    so only host-side temp files land there): whatever is left in it at the end leaked from that run."""
    tmp = spec.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp)}
    with log_path.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, str(HERE / script), str(spec)], stdout=fh, stderr=fh, env=env
        )


@dataclass
class Watched:
    """A bench child run to its end under a TreeMonitor, and what the machine did meanwhile."""

    proc: subprocess.Popen[bytes]
    rc: int
    wall: float
    cpu: dict[str, float]  # machine-wide /proc/stat deltas: user, sys, busy, total
    mon: TreeMonitor
    monitor_cpu: float  # this process's CPU over the run (the sampling), inside cpu_util
    process_cpu: float  # the child's tree's CPU, start-up included: its cpuacct group's, else wait4's


def watch(
    start: Callable[[], subprocess.Popen[bytes]], sample_s: float, marker: Path, group: Path | None
) -> Watched:
    c0, t0, me0 = cpu_times(), time.monotonic(), time.process_time()
    proc = start()
    mon = TreeMonitor(proc.pid, sample_s, str(marker))
    mon.start()
    _, status, usage = os.wait4(proc.pid, 0)  # the child and what it reaped (orphans' CPU lost)
    wall = time.monotonic() - t0
    c1 = cpu_times()
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    mon.stop()
    cpu = cpu_delta(c0, c1)
    tree = group_cpu_s(group) if group else None
    own = time.process_time() - me0
    return Watched(proc, rc, wall, cpu, mon, own, usage.ru_utime + usage.ru_stime if tree is None else tree)


def memory_figures(run: Watched, maxrss_kb: int) -> dict[str, Any]:
    """Either side's memory, the same way: the child's VmHWM, its tree sampled, PSS, machine."""
    return {
        "peak_rss_mb": {
            "runner": round(maxrss_kb / 1024, 1),
            "runner_sampled": round(run.mon.peak_root / 2**20, 1),
            "tree_sampled": round(run.mon.peak_tree / 2**20, 1),
        },
        "peak_memory_mb": run.mon.memory_mb(),
        "peak_processes": run.mon.peak_procs,
        "process_cpu_s": round(run.process_cpu, 2),
        "monitor_cpu_s": round(run.monitor_cpu, 2),  # this process's sampling, inside cpu_util
    }


def run_level(
    level: int, tasks: list[Task], codec: ChatCodec, out: Path, args: argparse.Namespace, repeat: int = 0
) -> dict[str, Any]:
    """One run of uniagent at one level, measured; its figures emitted (gated) and returned."""
    samples = args.samples_per_level or samples_for(level, len(tasks))
    out.mkdir(parents=True, exist_ok=True)
    script = write_script(out / "script.jsonl", codec, tasks, samples)
    group = cpuacct_group(f"bench-runner-{os.getpid()}-{US}-{level}-r{repeat}")
    spec = child_spec(out, script, level, samples, args, group, stalls=args.stalls)
    run = watch(lambda: start_child(spec, out / "child.log"), args.sample_s, out / "tmp", group)
    # A descendant that outlives the runner for good shows here; one that only takes a while to
    # exit (a sandbox at nice 19 on a busy machine) is waited for and its delay reported.
    survivors, gone_after = run.mon.wait_survivors(args.survivor_wait)
    remove_group(group)
    cgroups = sorted(cgroups_snapshot(run.proc.pid))
    ctx = {"level": level, "samples": samples, "system": US, "delay_s": args.delay, "repeat": repeat}
    result_path = out / "child.json"
    if not result_path.exists():
        tail = (out / "child.log").read_text(errors="replace")[-2000:]
        emit("error", f"runner child exited {run.rc} without a report: {tail}", None, **ctx)
        return {"error": run.rc, "all_resolved": False}
    child = json.loads(result_path.read_text())
    if not child["ok"]:
        emit("error", child["error"], None, **ctx)
    expected = {(t.instance_id, s) for t in tasks for s in range(samples)}
    figs = level_figures(store_rows(out / "run"), child, run.wall, run.cpu, len(expected))
    figs.update(memory_figures(run, child["maxrss_kb"]))
    figs["tree_gone_after_s"] = round(gone_after, 2)
    figs["leftovers"] = {
        "processes": survivors,
        "cgroups": cgroups,
        "tmp": sorted(p.name for p in (out / "tmp").iterdir()),
    }
    check = check_run(out / "run", expected)
    figs["all_resolved"] = bool(
        child["ok"] and not check["missing"] and not check["unresolved"] and figs["resolved"] == len(expected)
    )
    emit_run(figs, **ctx)
    return figs


def run_peer(
    level: int, tasks: list[Task], out: Path, args: argparse.Namespace, repeat: int = 0
) -> dict[str, Any]:
    """One run of mini-swe-agent on the same episodes (bench/runner_peer.py in a child, each episode
    graded with uniagent's verifier in its worker), measured as `run_level` measures uniagent."""
    samples = args.samples_per_level or samples_for(level, len(tasks))
    out.mkdir(parents=True, exist_ok=True)
    group = cpuacct_group(f"bench-runner-{os.getpid()}-peer-{level}-r{repeat}")
    spec = {
        "tasks": args.tasks,
        "samples": samples,
        "concurrency": level,
        "delay_s": args.delay,
        "output": str(out),
        "result": str(out / "peer.json"),
        "cpuacct": str(group) if group else None,
    }
    (out / "peer-spec.json").write_text(json.dumps(spec))
    run = watch(
        lambda: spawn("runner_peer.py", out / "peer-spec.json", out / "peer.log"),
        args.sample_s,
        out / "tmp",
        group,
    )
    run.mon.wait_survivors(args.survivor_wait)
    remove_group(group)
    ctx = {"level": level, "samples": samples, "system": PEER, "delay_s": args.delay, "repeat": repeat}
    if run.rc != 0 or not (out / "peer.json").exists():
        tail = (out / "peer.log").read_text(errors="replace")[-2000:]
        emit("error", f"peer exited {run.rc}: {tail}", None, **ctx)
        return {"error": run.rc, "all_resolved": False}
    peer = json.loads((out / "peer.json").read_text())
    expected = len(tasks) * samples
    figs = peer_figures(peer, expected, run.wall, run.cpu)
    figs.update(memory_figures(run, peer["maxrss_kb"]))
    figs["all_resolved"] = figs["episodes"] == figs["resolved"] == expected
    emit_run(figs, **ctx, isolation=False, verifier="uniagent's, in each worker after its agent")
    return figs


def run_levels(
    levels: list[int], tasks: list[Task], codec: ChatCodec, root: Path, args: argparse.Namespace
) -> bool:
    """Each level: both sides `--repeats` times (alternating which goes first, so drift in the
    machine's load falls on both), then medians, spreads, ratios and goals. All valid and met?"""
    sides = [s for s, skip in ((US, args.peer_only), (PEER, args.no_peer)) if not skip]
    ok = True
    for level in levels:
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
        for r in range(args.repeats):
            for side in sides if r % 2 == 0 else sides[::-1]:
                log.info("level %d, repeat %d: %s", level, r, side)
                if side == US:
                    figs = run_level(level, tasks, codec, root / f"level-{level}" / f"r{r}", args, r)
                else:
                    figs = run_peer(level, tasks, root / f"peer-{level}" / f"r{r}", args, r)
                runs[side].append(figs)
                ok = ok and bool(figs.get("all_resolved"))
        summary = {s: summarise(runs[s], args.repeats, level=level, system=s) for s in sides}
        vs = ratios(runs[US], runs[PEER], level=level) if len(sides) == 2 else {}
        if US in runs:
            vs_baseline(level, runs[US], system=US)
        ok = goals(level, summary.get(US, {}), vs, args.goal_vs_peer) and ok
    return ok


# -- main ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,100,1000", help="concurrency levels, comma-separated")
    parser.add_argument("--samples-per-level", type=int, default=None, help="override samples per task")
    parser.add_argument("--tasks", type=int, default=None, help="only the first N starter tasks")
    parser.add_argument("--delay", type=float, default=1.0, help="replay latency per model turn (s)")
    parser.add_argument("--no-peer", action="store_true", help="skip mini-swe-agent")
    parser.add_argument("--peer-only", action="store_true", help="only mini-swe-agent")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side per level (median, spread)")
    parser.add_argument(
        "--goal-vs-peer",
        type=float,
        default=None,
        help="goal: median uniagent/peer episodes/min at least this",
    )
    parser.add_argument("--keep", type=Path, default=None, help="output dir, kept (default: a temp dir)")
    parser.add_argument("--kill-resume", action="store_true", help="the kill -9 / --resume check only")
    parser.add_argument("--seed", type=int, default=14, help="kill point seed")
    parser.add_argument("--sample-s", type=float, default=2.0, help="process-tree sampling interval")
    parser.add_argument("--survivor-wait", type=float, default=10.0, help="after kill -9: wait for the tree")
    parser.add_argument("--set", action="append", default=[], help="extra run config KEY=VALUE")
    parser.add_argument(
        "--stalls", action="store_true", help="record why the loop stalls (stacks; costs framework CPU)"
    )
    return parser


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")
    parser = build_parser()
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-runner-"))
    root.mkdir(parents=True, exist_ok=True)
    tasks = load_tasks(TASKS, limit=args.tasks)
    ctx = {"cpus": os.cpu_count(), "python": platform.python_version(), "tasks": len(tasks)}
    emit("setup", {"output": str(root), "levels": levels, "argv": shlex.join(sys.argv[1:])}, None, **ctx)
    codec = load_codec()
    t_start = time.monotonic()
    if args.kill_resume:
        level = levels[-1] if args.levels == parser.get_default("levels") else levels[0]
        from runner_kill import kill_resume  # it builds on this module's helpers

        ok = kill_resume(level, tasks, codec, root / f"kill-{level}", args)["ok"]
    else:
        ok = run_levels(levels, tasks, codec, root, args)
    emit("runtime_s", round(time.monotonic() - t_start, 1), "s", **ctx)
    emit("ok", ok, None, note="every run all resolved and every goal met; the exit status says the same")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
