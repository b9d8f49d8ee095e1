"""`uniagent run` at concurrency 1, 100 and 1,000 on scripted 10-turn SWE episodes, measured from outside.

Workload (issue 14's table): the 18 `builtin:starter` tasks x `samples` (1 at concurrency 1, 6 at 100,
56 at 1,000: 18, 108 and 1,008 episodes). Each episode is scripted (the model's turns are written with
the project's own API, `ReplayRecord` + `save_records`, as SmolLM2 token ids from the real `ChatCodec`):
8 exploration commands through the `bash` tool (ls, cat, grep, git status, git log -1, find, head,
python -c), the task's gold patch applied with `git apply` through `bash`, then `submit`. The engine is
the real `ReplayEngine` with `model.replay_delay_s` (default 1 s) per turn; sandboxes are real bubblewrap
`local` sandboxes, the verifier is the real SWE verifier (tests run in the sandbox, graded by swebench's
parser), the store is the real run store. Every episode must end resolved.

The runner runs in a child process (bench/runner_child.py: `build_config` + `Runner.run()`, what
`uniagent run` calls, plus in-process probes), so this process measures it from outside and a kill -9
is real. Figures per level, one JSON object per line on stdout (logs on stderr):

* ``wall_s`` (process start to exit), ``episodes_per_min`` (over that wall; also
  ``episodes_per_min_after_startup``) and ``vs_baseline`` (the issue's table: 61.6 at 100 / 44.1 at
  1,000 episodes/min on main at commit 74b8174; goal at 1,000: >= 130); ``turns_per_s`` (model turns);
* ``framework_cpu_ms_per_step``: the runner process's own CPU (getrusage, all its threads) from its
  first episode on (``startup_s`` apart: imports, tokenizer, codec, preflight) minus the CPU of the
  verifier's in-process log parse, per model turn. Sandbox commands and the verifier's test
  runs are other processes (bwrap and its children), so they are excluded by construction;
* ``cpu_util``: machine-wide busy fraction of all cores from /proc/stat over the run (with user/sys
  seconds): the machine may be shared, so run it on an idle one;
* ``peak_rss_mb`` of the runner process (its VmHWM) and of its whole process tree (sampled with
  psutil every `--sample-s` seconds; ``monitor_cpu_s`` is what that sampling cost, inside cpu_util);
  summed RSS counts every shared page once per process, so ``peak_memory_mb`` gives the footprint:
  the tree's peak PSS (every 5th sample) and the machine's memory in use above its use before the
  run (``machine_delta``: MemTotal - MemAvailable, kernel memory for the processes included);
* ``open_fds_at_end`` of the runner (after its run returned) and ``leftovers``: descendants still
  alive `--survivor-wait` s after it exited (``tree_gone_after_s``: how long the tree took to go),
  its sandbox cgroups (`uniagent-PID-*`) still there, and entries left in
  its private TMPDIR (the host side of its sandboxes);
* ``loop_lag_ms`` p50/p99 (a coroutine in the runner that sleeps 50 ms and records how late it wakes);
  with ``--stalls``, ``loop_stalls``: each stall over 100 ms with the main thread's CPU during it and
  its scheduler states (R: work on the loop; D/S: a blocking call), the stacks in child.json;
* ``exits`` (failures by exit reason), ``resolved``, and ``episode_median_s``: per-episode medians of
  setup / sandbox start / tools / model / verifier / episode from the store's timings.

Peer, same run (``--no-peer`` to skip, ``--peer-only`` for it alone): the same episodes through
mini-swe-agent's own `DefaultAgent` (its batch runner's `ProgressTrackingAgent`), `LocalEnvironment`
and `DeterministicToolcallModel` (sleeping the same latency per query), in a thread pool of
`concurrency` workers as its swebench batch runner does (bench/runner_peer.py). What differs: the
peer has no isolation (commands run on the host, in a temp copy of the repository with a fresh git
commit), no persistent shell (a process per command), no store (its trajectory JSON and preds.json
files), and no verifier of its own: its submissions are graded afterwards with uniagent's verifier
in local sandboxes (``peer_verify_wall_s``), and ``peer_vs_uniagent`` is given with and without it.

``--kill-resume``: run the 1,000 level (or ``--levels``' first), `kill -9` the runner once a seeded
random fraction of the episodes is stored, check that no bwrap survived it, rerun with `--resume`,
and check from the store and its export that every (instance, sample) pair is stored exactly once
and resolved: ``kill_resume`` {killed_at_s, stored_before_kill, stored_after_resume, duplicates,
missing, unresolved, survivors, and the killed run's temp dirs and cgroups after the kill and after
the resume: kill -9 runs no cleanup, so what the next run does about them shows here}. Measuring
and the store checks live in bench/runner_probe.py.

    .venv/bin/python bench/runner.py --levels 1,20           # development: ~5-10 min with the peer
    .venv/bin/python bench/runner.py                         # 1, 100, 1,000 + peer: run on an idle machine
    .venv/bin/python bench/runner.py --kill-resume --no-peer
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner_probe import (
    TreeMonitor,
    cgroups_snapshot,
    check_run,
    cpu_delta,
    cpu_times,
    level_figures,
    store_count,
    store_rows,
)
from runner_workload import TASKS, script_turns
from uniagent.models.base import Generation
from uniagent.models.replay import ANY_PROMPT, ReplayRecord, save_records
from uniagent.tasks import load_tasks
from uniagent.tasks.base import Task
from uniagent.tokens import ChatCodec

BENCH = "runner"
HERE = Path(__file__).resolve().parent
BASELINE_EP_PER_MIN = {100: 61.6, 1000: 44.1}  # issue 14's table, main at 74b8174
GOAL_EP_PER_MIN_1000 = 130.0
MAX_TURNS = 12  # 10 scripted turns; the rest is slack that an unexpected extra turn would show
UNITS = {
    "_s": "s",
    "_ms": "ms",
    "_mb": "MB",
    "_step": "ms/turn",
    "_util": "fraction",
    "turns_per_s": "turns/s",
}
log = logging.getLogger("bench.runner")


def unit_of(figure: str) -> str | None:
    if "per_min" in figure:
        return "episodes/min"
    return next((u for end, u in reversed(UNITS.items()) if figure.endswith(end)), None)


def emit(figure: str, value: Any, unit: str | None = None, **context: Any) -> None:
    print(json.dumps({"bench": BENCH, "figure": figure, "value": value, "unit": unit, **context}), flush=True)


def load_codec() -> ChatCodec:
    """The codec `ModelFactory` builds for a replay model (the packaged SmolLM2 tokenizer)."""
    from uniagent.models.loading import load_tokenizer, resolve_model

    return ChatCodec(load_tokenizer(resolve_model(None)))


def write_script(path: Path, codec: ChatCodec, tasks: list[Task], samples: int) -> Path:
    """The replay file: per `INSTANCE#SAMPLE` request id, ten generations in turn order. Prompts
    are not recorded (observations hold timestamps): `ANY_PROMPT` replays by request id and turn."""
    records = []
    for task in tasks:
        turns = [codec.encode(t) + codec.eot_ids for t in script_turns(task)]
        for s in range(samples):
            for turn, ids in enumerate(turns):
                gen = Generation(list(ids), [-0.1] * len(ids), "stop")
                records.append(ReplayRecord(f"{task.instance_id}#{s}", gen, turn, None, ANY_PROMPT))
    save_records(records, path, include_prompts=False)
    return path


def samples_for(level: int, n_tasks: int) -> int:
    """Enough samples per task that `level` episodes can run at once (6 at 100, 56 at 1,000)."""
    return max(1, math.ceil(level / n_tasks))


def child_spec(out: Path, script: Path, level: int, samples: int, args: argparse.Namespace) -> Path:
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
        "stalls": args.stalls,
        "result": str(out / "child.json"),
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


def watch(start: Callable[[], subprocess.Popen[bytes]], sample_s: float, marker: Path) -> Watched:
    c0, t0, me0 = cpu_times(), time.monotonic(), time.process_time()
    proc = start()
    mon = TreeMonitor(proc.pid, sample_s, str(marker))
    mon.start()
    rc = proc.wait()
    wall = time.monotonic() - t0
    c1 = cpu_times()
    mon.stop()
    return Watched(proc, rc, wall, cpu_delta(c0, c1), mon, time.process_time() - me0)


def run_level(level: int, tasks: list[Task], codec: ChatCodec, out: Path, args: argparse.Namespace) -> dict:
    """One level of the runner, measured; the figures emitted and returned."""
    samples = args.samples_per_level or samples_for(level, len(tasks))
    out.mkdir(parents=True, exist_ok=True)
    script = write_script(out / "script.jsonl", codec, tasks, samples)
    spec = child_spec(out, script, level, samples, args)
    run = watch(lambda: start_child(spec, out / "child.log"), args.sample_s, out / "tmp")
    proc, rc, wall, mon, monitor_cpu = run.proc, run.rc, run.wall, run.mon, run.monitor_cpu
    # A descendant that outlives the runner for good shows here; one that only takes a while to
    # exit (a sandbox at nice 19 on a busy machine) is waited for and its delay reported.
    survivors, gone_after = mon.wait_survivors(args.survivor_wait)
    cgroups = sorted(cgroups_snapshot(proc.pid))
    ctx = {"level": level, "samples": samples, "system": "uniagent", "delay_s": args.delay}
    result_path = out / "child.json"
    if not result_path.exists():
        tail = (out / "child.log").read_text(errors="replace")[-2000:]
        emit("error", f"runner child exited {rc} without a report: {tail}", None, **ctx)
        return {"error": rc}
    child = json.loads(result_path.read_text())
    if not child["ok"]:
        emit("error", child["error"], None, **ctx)
    cpu = run.cpu
    figs = level_figures(store_rows(out / "run"), child, wall, cpu)
    figs["peak_rss_mb"] = {
        "runner": round(child["maxrss_kb"] / 1024, 1),
        "runner_sampled": round(mon.peak_root / 2**20, 1),
        "tree_sampled": round(mon.peak_tree / 2**20, 1),
    }
    figs["peak_memory_mb"] = mon.memory_mb()
    figs["peak_processes"] = mon.peak_procs
    figs["monitor_cpu_s"] = round(monitor_cpu, 2)  # this process's sampling, inside cpu_util
    figs["tree_gone_after_s"] = round(gone_after, 2)
    figs["leftovers"] = {
        "processes": survivors,
        "cgroups": cgroups,
        "tmp": sorted(p.name for p in (out / "tmp").iterdir()),
    }
    expected = {(t.instance_id, s) for t in tasks for s in range(samples)}
    check = check_run(out / "run", expected)
    figs["all_resolved"] = (
        not check["missing"] and not check["unresolved"] and figs["resolved"] == len(expected)
    )
    base = BASELINE_EP_PER_MIN.get(level)
    if base:
        figs["vs_baseline"] = round(figs["episodes_per_min"] / base, 2)
    for name, value in figs.items():
        unit = unit_of(name)
        extra: dict[str, Any] = {}
        if name == "episodes_per_min" and level >= 1000:
            extra = {"goal": GOAL_EP_PER_MIN_1000, "met": value >= GOAL_EP_PER_MIN_1000}
        if name == "vs_baseline":
            extra = {"baseline_episodes_per_min": base}
        emit(name, value, unit, **ctx, **extra)
    return figs


# -- the peer ---------------------------------------------------------------------------------------
def run_peer(level: int, tasks: list[Task], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """mini-swe-agent on the same episodes (bench/runner_peer.py in a child), then its submissions
    graded with uniagent's verifier."""
    samples = args.samples_per_level or samples_for(level, len(tasks))
    out.mkdir(parents=True, exist_ok=True)
    spec = {
        "tasks": args.tasks,
        "samples": samples,
        "concurrency": level,
        "delay_s": args.delay,
        "output": str(out),
        "result": str(out / "peer.json"),
    }
    (out / "peer-spec.json").write_text(json.dumps(spec))
    run = watch(
        lambda: spawn("runner_peer.py", out / "peer-spec.json", out / "peer.log"), args.sample_s, out / "tmp"
    )
    rc, wall, mon = run.rc, run.wall, run.mon
    ctx = {"level": level, "samples": samples, "system": "mini-swe-agent", "delay_s": args.delay}
    if rc != 0 or not (out / "peer.json").exists():
        tail = (out / "peer.log").read_text(errors="replace")[-2000:]
        emit("error", f"peer exited {rc}: {tail}", None, **ctx)
        return {"error": rc}
    peer = json.loads((out / "peer.json").read_text())
    figs: dict[str, Any] = {
        "episodes": len(peer["episodes"]),
        "wall_s": round(wall, 2),
        "episodes_per_min": round(len(peer["episodes"]) / wall * 60, 2),
        "turns_per_s": round(peer["turns"] / wall, 2),
        "startup_s": {"wall": round(peer["startup_wall_s"], 2), "cpu": round(peer["startup_cpu_s"], 2)},
        "framework_cpu_ms_per_step": round(
            (peer["user_s"] + peer["sys_s"] - peer["startup_cpu_s"]) / max(peer["turns"], 1) * 1e3, 2
        ),
        "children_cpu_s": round(peer["children_cpu_s"], 2),
        "cpu_util": round(run.cpu["busy"] / run.cpu["total"], 3),
        "peak_rss_mb": {
            "runner": round(peer["maxrss_kb"] / 1024, 1),
            "tree_sampled": round(mon.peak_tree / 2**20, 1),
        },
        "peak_memory_mb": mon.memory_mb(),
        "exits": dict(collections.Counter(e["exit_status"] for e in peer["episodes"])),
    }
    if not args.no_peer_verify:
        from runner_peer import grade

        t1 = time.monotonic()
        graded = grade(tasks, peer["episodes"], level)
        figs["peer_verify_wall_s"] = round(time.monotonic() - t1, 2)
        figs["resolved"] = sum(graded)
    for name, value in figs.items():
        unit = unit_of(name)
        emit(name, value, unit, **ctx, isolation=False, verifier="uniagent's, after the run")
    return figs


def emit_ratio(level: int, ours: dict[str, Any], peer: dict[str, Any]) -> None:
    if "wall_s" not in ours or "wall_s" not in peer:
        return
    ctx = {"level": level, "note": "peer wall / uniagent wall (> 1: uniagent is faster)"}
    emit("peer_vs_uniagent_wall", round(peer["wall_s"] / ours["wall_s"], 2), "x", **ctx, peer_verified=False)
    if "peer_verify_wall_s" in peer:
        total = peer["wall_s"] + peer["peer_verify_wall_s"]
        emit("peer_vs_uniagent_wall", round(total / ours["wall_s"], 2), "x", **ctx, peer_verified=True)
    emit(
        "peer_vs_uniagent_cpu_per_step",
        round(peer["framework_cpu_ms_per_step"] / max(ours["framework_cpu_ms_per_step"], 1e-9), 2),
        "x",
        level=level,
    )


# -- kill -9 and --resume ---------------------------------------------------------------------------
def kill_resume(level: int, tasks: list[Task], codec: ChatCodec, out: Path, args: argparse.Namespace) -> dict:
    """Run, kill -9 at a seeded random point, resume, check the store."""
    rng = random.Random(args.seed)
    samples = args.samples_per_level or samples_for(level, len(tasks))
    total = len(tasks) * samples
    target = max(1, int(total * rng.uniform(0.1, 0.7)))
    jitter = rng.uniform(0.0, 2.0)
    out.mkdir(parents=True, exist_ok=True)
    script = write_script(out / "script.jsonl", codec, tasks, samples)
    spec = child_spec(out, script, level, samples, args)
    t0 = time.monotonic()
    proc = start_child(spec, out / "child.log")
    mon = TreeMonitor(proc.pid, args.sample_s, str(out / "tmp"))
    mon.start()
    while proc.poll() is None and store_count(out / "run") < target:
        time.sleep(0.2)
    time.sleep(jitter)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    killed_at = time.monotonic() - t0
    proc.wait()
    mon.stop()
    # --die-with-parent: the kernel kills each bwrap when its parent dies, and with it the
    # sandbox's PID namespace; give that `--survivor-wait` seconds, and say how long it took.
    survivors, waited = mon.wait_survivors(args.survivor_wait)
    bwrap_left = [s for s in survivors if s.startswith("bwrap")]
    before = store_count(out / "run")
    tmp_after_kill = len(list((out / "tmp").iterdir()))
    killed_pid = proc.pid
    cgroups_after_kill = len(cgroups_snapshot(killed_pid))
    proc = start_child(spec, out / "child-resume.log", resume=True)
    proc.wait()
    expected = {(t.instance_id, s) for t in tasks for s in range(samples)}
    check = check_run(out / "run", expected)
    report = {
        "level": level,
        "episodes": total,
        "seed": args.seed,
        "killed": killed,
        "killed_at_s": round(killed_at, 2),
        "stored_before_kill": before,
        "stored_after_resume": check["stored"],
        "duplicates": len(check["duplicates"]) + len(check.get("export_duplicates", [])),
        "missing": len(check["missing"]) + len(check.get("export_missing", [])),
        "unresolved": len(check["unresolved"]),
        "rewritten": check["rewritten"],
        "survivors": survivors,
        "tree_gone_after_s": None if survivors else round(waited, 2),
        # host-side temp dirs of the sandboxes that were running (kill -9 runs no cleanup)
        "tmp_entries_after_kill": tmp_after_kill,
        "tmp_entries_after_resume": len(list((out / "tmp").iterdir())),
        "killed_run_cgroups_after_kill": cgroups_after_kill,
        "killed_run_cgroups_after_resume": len(cgroups_snapshot(killed_pid)),
        "bwrap_survivors": bwrap_left,
        "ok": killed
        and not bwrap_left
        and check["stored"] == total
        and not check["duplicates"]
        and not check["missing"]
        and not check["unresolved"],
    }
    emit("kill_resume", report, None, level=level)
    return report


# -- main ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,100,1000", help="concurrency levels, comma-separated")
    parser.add_argument("--samples-per-level", type=int, default=None, help="override samples per task")
    parser.add_argument("--tasks", type=int, default=None, help="only the first N starter tasks")
    parser.add_argument("--delay", type=float, default=1.0, help="replay latency per model turn (s)")
    parser.add_argument("--no-peer", action="store_true", help="skip mini-swe-agent")
    parser.add_argument("--peer-only", action="store_true", help="only mini-swe-agent")
    parser.add_argument("--no-peer-verify", action="store_true", help="do not grade the peer's patches")
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
        kill_resume(level, tasks, codec, root / f"kill-{level}", args)
    else:
        for level in levels:
            log.info("level %d", level)
            ours = {} if args.peer_only else run_level(level, tasks, codec, root / f"level-{level}", args)
            peer = {} if args.no_peer else run_peer(level, tasks, root / f"peer-{level}", args)
            emit_ratio(level, ours, peer)
    emit("runtime_s", round(time.monotonic() - t_start, 1), "s", **ctx)
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
