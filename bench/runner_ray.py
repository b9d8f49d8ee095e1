"""bench/runner.py's scripted workload through `uniagent run --backend ray` on a local Ray cluster
of two nodes (two raylets on this machine, bench/ray_cluster.py), with a worker killed mid-run.

Same episodes as bench/runner.py (the 18 starter tasks, ten scripted turns each: eight exploration
commands, the gold patch applied with bash, submit; the real ReplayEngine with `--delay` seconds
per turn; real bubblewrap sandboxes, verifier and store), the same measured child process
(bench/runner_child.py: `Runner(config).run()`), here the Ray driver: the store and its exports
stay on it, the episodes run in `EpisodeActor`s spread over both nodes (SPREAD).

Once `--kill-at` of the episodes are stored, `--kill actor` SIGKILLs one actor worker that is
running an episode (a sandbox below it), `--kill node` SIGKILLs the second node's raylet, its
daemons and everything below them (its actors and their sandboxes), `--kill none` does nothing.
The backend replaces the dead actors and redoes their episodes from scratch. Figures, one JSON
object per line (bench/runner.py's format):

* ``cluster_start_s``; ``wall_s``, ``episodes_per_min``, ``turns_per_s``, ``exits``, ``resolved``,
  ``episode_median_s``, ``cpu_util`` (machine-wide), ``driver_cpu_ms_per_step`` (the driver's own
  CPU per model turn, its start-up included: the store, redaction, Ray's client side; the episodes'
  CPU is in the actors);
* ``actors_per_node`` (the most seen at once), ``kill`` {mode, at_s, stored_before, victims};
* ``redone``: stored episodes whose actor died under them (`metrics.ray_actor_deaths`);
* ``pairs``: stored, duplicates, missing, rewritten (a store row written twice), unresolved, for
  the store and its export (results.jsonl): every (instance, sample) pair must be there once;
* ``leftovers``: sandboxes of the cluster still alive and entries left in the nodes' TMPDIR
  after the run, and cluster processes that survived `stop()`.

    .venv/bin/python bench/runner_ray.py --concurrency 8 --tasks 4     # development: ~2 minutes
    .venv/bin/python bench/runner_ray.py                               # 108 episodes at 100, kill an actor
    .venv/bin/python bench/runner_ray.py --kill node
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import runner as base
from common import emit as common_emit
from ray_cluster import LocalCluster
from runner_probe import store_count
from uniagent.tasks import load_tasks
from uniagent.tasks.base import Task

BENCH = "runner_ray"
log = logging.getLogger("bench.runner_ray")


emit = partial(common_emit, BENCH)


def redone_pairs(run_dir: Path) -> list[str]:
    """Stored pairs whose Ray actor died under them at least once (redone from scratch)."""
    conn = sqlite3.connect(f"file:{run_dir / 'run.db'}?mode=ro", uri=True)
    try:
        sql = (
            "SELECT instance_id, sample FROM episodes "
            "WHERE COALESCE(json_extract(metrics, '$.ray_actor_deaths'), 0) > 0"
        )
        return sorted(f"{i}#{s}" for i, s in conn.execute(sql))
    finally:
        conn.close()


def kill(cluster: LocalCluster, mode: str) -> list[int]:
    """SIGKILL a busy actor worker or the second node; the pids killed ([] when none was busy yet)."""
    if mode == "node":
        return cluster.kill_node(cluster.nodes - 1)
    busy = cluster.busy_actors()
    if busy:
        os.kill(busy[0], signal.SIGKILL)
    return busy[:1]


def watch(
    cluster: LocalCluster, proc: Any, run_dir: Path, target: int, mode: str, t0: float
) -> dict[str, Any]:
    """Until the driver exits: track actors per node; kill once `target` episodes are stored."""
    peak: dict[int, int] = {}
    report: dict[str, Any] = {"mode": mode, "at_s": None, "stored_before": None, "victims": []}
    while proc.poll() is None:
        per_node = cluster.actors_per_node()
        if sum(per_node.values()) > sum(peak.values()):
            peak = per_node
        if mode != "none" and not report["victims"] and store_count(run_dir) >= target:
            stored = store_count(run_dir)
            victims = kill(cluster, mode)
            if victims:
                report.update(at_s=round(time.monotonic() - t0, 2), stored_before=stored, victims=victims)
                log.info("killed %s at %d stored: %s", mode, stored, victims)
        time.sleep(0.2)
    report["actors_per_node"] = peak
    return report


def run(args: argparse.Namespace, tasks: list[Task], root: Path) -> bool:
    level = args.concurrency
    samples = args.samples or base.samples_for(level, len(tasks))
    total = len(tasks) * samples
    out = root / f"ray-{level}"
    out.mkdir(parents=True, exist_ok=True)
    ctx = {"level": level, "samples": samples, "nodes": args.nodes, "actors": args.actors}
    ctx["delay_s"] = args.delay
    cluster = LocalCluster(nodes=args.nodes, cpus=args.cpus_per_node)
    try:
        cluster.start()
        emit("cluster_start_s", round(cluster.start_s, 2), "s", **ctx)
        # The driver (the runner child) joins with the cluster's token.
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=cluster.token)
        args.set += [
            "runner.backend=ray",
            f"runner.ray_address={cluster.address}",
            f"runner.ray_actors={args.actors}",
        ]
        script = base.write_script(out / "script.jsonl", base.load_codec(), tasks, samples)
        spec = base.child_spec(out, script, level, samples, args)
        c0, t0 = base.cpu_times(), time.monotonic()
        proc = base.start_child(spec, out / "child.log")
        target = max(1, int(total * args.kill_at))
        kill_report = watch(cluster, proc, out / "run", target, args.kill, t0)
        wall = time.monotonic() - t0
        c1 = base.cpu_times()
        time.sleep(1.0)
        leftovers = {
            "sandboxes": cluster.sandboxes(),
            "tmp": sorted(p.name for p in cluster.tmp.iterdir()),
        }
    finally:
        leftovers_survivors = cluster.stop()
    child_path = out / "child.json"
    if not child_path.exists():
        emit("error", (out / "child.log").read_text(errors="replace")[-2000:], None, **ctx)
        return False
    child = json.loads(child_path.read_text())
    if not child["ok"]:
        emit("error", child["error"], None, **ctx)
    cpu = base.cpu_delta(c0, c1)
    rows = base.store_rows(out / "run")
    figs = base.level_figures(rows, child, wall, cpu)
    expected = {(t.instance_id, s) for t in tasks for s in range(samples)}
    check = base.check_run(out / "run", expected)
    pairs = {
        "expected": total,
        "stored": check["stored"],
        "duplicates": len(check["duplicates"]) + len(check.get("export_duplicates", [])),
        "missing": len(check["missing"]) + len(check.get("export_missing", [])),
        "rewritten": len(check["rewritten"]),
        "unresolved": len(check["unresolved"]),
    }
    redone = redone_pairs(out / "run")
    leftovers["cluster_processes"] = leftovers_survivors
    killed = args.kill == "none" or bool(kill_report["victims"])
    ok = (
        child["ok"]
        and killed
        and pairs["stored"] == total
        and not any(pairs[k] for k in ("duplicates", "missing", "rewritten", "unresolved"))
        and (args.kill == "none" or bool(redone))
        and not leftovers["sandboxes"]
        and not leftovers_survivors
    )
    emit("wall_s", figs["wall_s"], "s", **ctx)
    emit("episodes_per_min", figs["episodes_per_min"], "episodes/min", **ctx)
    emit("turns_per_s", figs["turns_per_s"], "turns/s", **ctx)
    emit("exits", figs["exits"], None, **ctx)
    emit("resolved", figs["resolved"], None, **ctx)
    emit("episode_median_s", figs["episode_median_s"], "s", **ctx)
    emit("cpu_util", figs["cpu_util"], "fraction", **ctx, machine_cpu_s=figs["machine_cpu_s"])
    # Start-up (imports, ray.init, actors) included: the driver runs no episode to mark its end.
    emit("driver_cpu_ms_per_step", figs["cpu_self_ms_per_turn"], "ms/turn", **ctx, with_startup=True)
    emit("actors_per_node", kill_report.pop("actors_per_node"), None, **ctx)
    emit("kill", kill_report, None, **ctx)
    emit("redone", {"count": len(redone), "pairs": redone}, None, **ctx)
    emit("pairs", pairs, None, **ctx)
    emit("leftovers", leftovers, None, **ctx)
    emit("ok", ok, None, **ctx)
    return ok


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=100, help="episodes at once")
    parser.add_argument("--samples", type=int, default=None, help="samples per task (default: enough for it)")
    parser.add_argument("--tasks", type=int, default=None, help="only the first N starter tasks")
    parser.add_argument("--delay", type=float, default=1.0, help="replay latency per model turn (s)")
    parser.add_argument("--nodes", type=int, default=2, help="raylets on this machine")
    parser.add_argument("--cpus-per-node", type=int, default=1, help="Ray CPUs each node advertises")
    parser.add_argument("--actors", type=int, default=4, help="episode actors (spread over the nodes)")
    parser.add_argument("--kill", choices=("actor", "node", "none"), default="actor")
    parser.add_argument("--kill-at", type=float, default=0.3, help="kill once this fraction is stored")
    parser.add_argument("--keep", type=Path, default=None, help="output dir, kept (default: a temp dir)")
    parser.add_argument("--set", action="append", default=[], help="extra run config KEY=VALUE")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-runner-ray-"))
    root.mkdir(parents=True, exist_ok=True)
    tasks = load_tasks(base.TASKS, limit=args.tasks)
    emit("setup", {"output": str(root), "argv": shlex.join(sys.argv[1:])}, None, cpus=os.cpu_count())
    t0 = time.monotonic()
    ok = run(args, tasks, root)
    emit("runtime_s", round(time.monotonic() - t0, 1), "s")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
