"""bench/runner.py --kill-resume: run a level, `kill -9` the runner at a seeded random point, rerun it
with `--resume`, and check from the store and its export that every (instance, sample) pair is
stored exactly once and resolved, that no bwrap outlived the kill, and what the killed run left
behind (kill -9 runs no cleanup): its temp dirs and cgroups after the kill and after the resume."""

from __future__ import annotations

import argparse
import os
import random
import signal
import time
from pathlib import Path

from runner import child_spec, start_child
from runner_figures import emit
from runner_probe import TreeMonitor, cgroups_snapshot, check_run, store_count
from runner_workload import samples_for, write_script
from uniagent.tasks.base import Task
from uniagent.tokens import ChatCodec


def kill_resume(level: int, tasks: list[Task], codec: ChatCodec, out: Path, args: argparse.Namespace) -> dict:
    """Run, kill -9 at a seeded random point, resume, check the store."""
    rng = random.Random(args.seed)
    samples = args.samples_per_level or samples_for(level, len(tasks))
    total = len(tasks) * samples
    target = max(1, int(total * rng.uniform(0.1, 0.7)))
    jitter = rng.uniform(0.0, 2.0)
    out.mkdir(parents=True, exist_ok=True)
    script = write_script(out / "script.jsonl", codec, tasks, samples)
    spec = child_spec(out, script, level, samples, args, stalls=args.stalls)
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
