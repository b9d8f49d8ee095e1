"""bench/runner_ray.py at a tiny size: the scripted workload (2 starter tasks, one sample each, 2 actors)
through `uniagent run --backend ray` on its own two-node local cluster, no kill. The bench must print
every figure, store every pair once, leave no sandbox or cluster process behind and exit 0. The killed
actor and node cases at size are the bench's job (and tests/test_runner_ray_cluster.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import needs_bwrap, require_module

pytestmark = needs_bwrap
REPO = Path(__file__).resolve().parents[1]
FIGURES = {
    "setup", "cluster_start_s", "wall_s", "episodes_per_min", "turns_per_s", "exits", "resolved",
    "episode_median_s", "cpu_util", "driver_cpu_ms_per_step", "actors_per_node", "kill", "redone",
    "pairs", "leftovers", "ok", "runtime_s",
}  # fmt: skip


def test_tiny_run_prints_every_figure_stores_each_pair_once_and_leaves_nothing() -> None:
    require_module("ray", "the Ray runner backend (a verl dependency)")
    argv = ["--concurrency", "2", "--tasks", "2", "--samples", "1", "--delay", "0.05"]
    argv += ["--actors", "2", "--kill", "none"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "runner_ray.py"), *argv],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = {row["figure"]: row for row in map(json.loads, filter(None, done.stdout.splitlines()))}
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert set(lines) >= FIGURES, sorted(FIGURES - set(lines))
    assert lines["ok"]["value"] is True
    pairs = lines["pairs"]["value"]
    assert pairs["stored"] == pairs["expected"] == 2
    assert not any(pairs[k] for k in ("duplicates", "missing", "rewritten", "unresolved"))
    assert lines["leftovers"]["value"] == {"sandboxes": [], "tmp": lines["leftovers"]["value"]["tmp"],
                                           "cluster_processes": []}  # fmt: skip
    assert lines["resolved"]["value"] == 2
