"""`uniagent run --backend ray` on a real two-node Ray cluster (two raylets on this machine,
started with `ray start` by bench/ray_cluster.py), with one episode actor's worker killed
(SIGKILL) mid-episode: its episodes are redone, every pair is stored once.

Model turns come from the real ReplayEngine (scripted gold fixes, a fixed latency per turn so
the kill lands while sandboxes run); sandboxes, verifier and store are real.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import needs_bwrap, require_module
from run_helpers import starter_run, write_replay
from uniagent.runner import RunStore
from uniagent.runner.ray_backend import EpisodeActor
from uniagent.sandbox import procs
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

pytestmark = needs_bwrap
CLI = [sys.executable, "-m", "uniagent.cli"]
REPO = Path(__file__).resolve().parents[1]


def ray_cluster_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_ray_cluster", REPO / "bench" / "ray_cluster.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cluster() -> Iterator[Any]:
    require_module("ray", "the Ray runner backend (a verl dependency)")
    c = ray_cluster_module().LocalCluster(nodes=2, cpus=1)
    try:
        c.start()
        yield c
    finally:
        survivors = c.stop()
        assert not survivors, f"processes of the test cluster survived: {survivors}"


def kill_a_busy_actor(c: Any, run: subprocess.Popen, within_s: float = 120.0) -> tuple[int, dict[int, int]]:
    """SIGKILL an episode actor's worker while it runs an episode (a sandbox below it); return its
    pid and the actors per node seen then."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and run.poll() is None:
        per_node = c.actors_per_node()
        busy = c.busy_actors()
        if sum(per_node.values()) >= 2 and busy:
            os.kill(busy[0], signal.SIGKILL)
            return busy[0], per_node
        time.sleep(0.2)
    raise AssertionError("no episode actor was running an episode to kill")


def test_a_killed_actor_s_episodes_are_redone_and_stored_once(
    cluster: Any, tmp_path: Path, codec: ChatCodec
) -> None:
    tasks = load_tasks("builtin:starter")[:4]
    replay = write_replay(tmp_path / "replay.jsonl", codec, tasks)
    out = tmp_path / "run"
    run = subprocess.Popen(
        [
            *CLI,
            *starter_run(
                replay, out, "--backend", "ray", "--ray-address", cluster.address, "--concurrency", "4"
            ),
            "--set",
            f"tasks.ids=[{','.join(t.instance_id for t in tasks)}]",
            "--set",
            "runner.ray_actors=2",
            "--set",
            "runner.preflight=false",
            "--set",
            "model.replay_delay_s=1.5",
        ],
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        killed, per_node = kill_a_busy_actor(cluster, run)
        _, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, stderr[-3000:]
    assert per_node == {0: 1, 1: 1}, "SPREAD put one actor on each node"
    assert not procs.alive(killed)

    store = RunStore(out / "run.db", readonly=True)
    rows = list(store.rows())
    store.close()
    pairs = [(r["instance_id"], r["sample"]) for r in rows]
    assert sorted(pairs) == sorted((t.instance_id, 0) for t in tasks), "every pair stored, none lost"
    assert all(r["attempts"] == 1 for r in rows), "no pair stored twice"
    assert all(r["exit_reason"] == "finished" and r["resolved"] and r["trainable"] for r in rows)
    redone = [r for r in rows if r["metrics"].get("ray_actor_deaths")]
    assert redone, "the killed actor's episodes were redone (and say so in their metrics)"
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["instance_id"], r["sample"]) for r in results) == sorted(pairs)

    assert not cluster.sandboxes(), "a sandbox outlived its episode"
    assert not list(cluster.tmp.iterdir()), "actor folders (the dead one's swept) and workspaces removed"


class DiesOnceActor(EpisodeActor):
    """An episode actor whose worker process exits the first time it is given each pair (marker
    files under the run's output): the death a SIGKILL would cause, at a chosen moment."""

    async def run(self, family: str, row: dict[str, Any], source: str | None, sample: int) -> dict[str, Any]:
        marker = Path(self.config.runner.output) / f"died-{row['instance_id']}-{sample}"
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            os._exit(1)
        return await super().run(family, row, source, sample)


class AlwaysDiesActor(EpisodeActor):
    """An episode that kills every worker it runs on."""

    async def run(self, family: str, row: dict[str, Any], source: str | None, sample: int) -> dict[str, Any]:
        os._exit(1)


def test_redo_is_bounded_and_a_redone_episode_is_stored_once(tmp_path: Path, codec: ChatCodec) -> None:
    """In-process `run_on_ray` on a local Ray: each pair's first actor dies, the redo finishes and
    is reported once; an episode that kills every actor is reported once, after MAX_REDOS redos,
    as an untrainable `internal_error` (rerun by --resume), not retried forever."""
    ray = require_module("ray", "the Ray runner backend (a verl dependency)")
    from uniagent.runner.config import build_config
    from uniagent.runner.ray_backend import MAX_REDOS, run_on_ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    tasks = load_tasks("builtin:starter")[:2]
    replay = write_replay(tmp_path / "replay.jsonl", codec, tasks)
    flags = {"model.spec": f"replay:{replay}", "runner.concurrency": 2, "runner.ray_actors": 1}
    seen: list[tuple[str, int, dict[str, Any]]] = []

    def go(actor: type, out: Path) -> None:
        cfg = build_config(None, ["runner.preflight=false"], {**flags, "runner.output": str(out)})
        asyncio.run(
            run_on_ray(cfg, [(t, 0) for t in tasks], lambda i, s, r: seen.append((i, s, r)), actor=actor)
        )

    try:
        go(DiesOnceActor, tmp_path / "once")
        assert sorted((i, s) for i, s, _ in seen) == sorted((t.instance_id, 0) for t in tasks)
        assert all(r["exit_reason"] == "finished" and r["resolved"] and r["trainable"] for *_, r in seen)
        assert all(r["metrics"]["ray_actor_deaths"] >= 1 for *_, r in seen)
        seen.clear()
        go(AlwaysDiesActor, tmp_path / "always")
    finally:
        ray.shutdown()
    assert sorted((i, s) for i, s, _ in seen) == sorted((t.instance_id, 0) for t in tasks)
    for _, _, result in seen:
        assert result["exit_reason"] == "internal_error" and not result["trainable"]
        assert result["metrics"]["ray_actor_deaths"] == MAX_REDOS + 1 and "died" in result["error"]
