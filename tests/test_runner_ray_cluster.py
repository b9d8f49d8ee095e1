"""`uniagent run --backend ray` on a real two-node Ray cluster (two raylets on this machine,
started with `ray start`), with one episode actor's worker killed (SIGKILL) mid-episode.

Model turns come from the real ReplayEngine (scripted gold fixes, a fixed latency per turn so
the kill lands while sandboxes run); sandboxes, verifier and store are real. The cluster's daemons
carry the fixture's own auth token in their environment: that (and the process tree below them)
is how teardown finds and kills exactly this cluster's processes (`ray stop` would kill every
Ray on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import needs_bwrap, require_module
from run_helpers import write_replay
from uniagent.runner import RunStore
from uniagent.sandbox import procs
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

pytestmark = needs_bwrap
CLI = [sys.executable, "-m", "uniagent.cli"]


@dataclass
class Cluster:
    address: str
    env: dict[str, str]
    token: str
    tmp: Path  # the nodes' TMPDIR: where actors keep sandbox workspaces


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def marked(token: str) -> list[int]:
    """Processes whose environment holds this cluster's token and their descendants: the raylets,
    GCS and Ray's Python daemons keep their environment; workers (children of a raylet) overwrite
    theirs with their process title, sandboxes are below workers."""
    needle = f"RAY_AUTH_TOKEN={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return sorted({*found, *(d for pid in found for d in procs.descendants(pid))})


def kill_marked(token: str, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while (pids := [p for p in marked(token) if procs.alive(p)]) and time.monotonic() < deadline:
        procs.signal_pids(pids, signal.SIGKILL)
        time.sleep(0.2)


def parent(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def ray_start(env: dict[str, str], *args: str) -> None:
    ray = Path(sys.executable).parent / "ray"
    proc = subprocess.run(
        [str(ray), "start", "--num-cpus=1", "--disable-usage-stats", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    require_module("ray", "the Ray runner backend (a verl dependency)")
    root = Path(tempfile.mkdtemp(prefix="uaray-", dir="/tmp"))  # short: Ray's socket paths stay < 108 bytes
    (root / "tmp").mkdir()
    token = uuid.uuid4().hex
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "TMPDIR": str(root / "tmp"),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    port = free_port()
    try:
        ray_start(
            env,
            "--head",
            f"--port={port}",
            f"--temp-dir={root / 'head'}",
            "--include-dashboard=false",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
        )
        ray_start(
            env,
            f"--address=127.0.0.1:{port}",
            f"--temp-dir={root / 'node2'}",
            f"--dashboard-agent-listen-port={free_port()}",
        )
        yield Cluster(f"127.0.0.1:{port}", env, token, root / "tmp")
    finally:
        kill_marked(token)
        survivors = [p for p in marked(token) if procs.alive(p)]
        shutil.rmtree(root, ignore_errors=True)
        assert not survivors, f"processes of the test cluster survived: {survivors}"


def kill_a_busy_actor(c: Cluster, run: subprocess.Popen, within_s: float = 90.0) -> tuple[int, set[int]]:
    """SIGKILL an EpisodeActor worker while it runs an episode (a sandbox below it); return its
    pid and the parents (raylets) of all actor workers seen then."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and run.poll() is None:
        actors = [p for p in marked(c.token) if (procs.cmdline(p) or [""])[0].startswith("ray::EpisodeActor")]
        busy = [p for p in actors if any("bwrap" in " ".join(procs.cmdline(k)) for k in procs.children(p))]
        if len(actors) >= 2 and busy:
            time.sleep(0.5)  # well inside the episode: past sandbox start
            raylets = {parent(p) for p in actors}
            os.kill(busy[0], signal.SIGKILL)
            return busy[0], raylets
        time.sleep(0.2)
    raise AssertionError("no episode actor was running an episode to kill")


def test_a_killed_actor_s_episodes_are_redone_and_stored_once(
    cluster: Cluster, tmp_path: Path, codec: ChatCodec
) -> None:
    tasks = load_tasks("builtin:starter")[:4]
    replay = write_replay(tmp_path / "replay.jsonl", codec, tasks)
    out = tmp_path / "run"
    run = subprocess.Popen(
        [
            *CLI,
            "run",
            "--tasks",
            "builtin:starter",
            "--model",
            f"replay:{replay}",
            "--backend",
            "ray",
            "--ray-address",
            cluster.address,
            "--concurrency",
            "4",
            "--output",
            str(out),
            "--set",
            f"tasks.ids=[{','.join(t.instance_id for t in tasks)}]",
            "--set",
            "runner.ray_actors=2",
            "--set",
            "model.replay_delay_s=1.5",
        ],
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        killed, raylets = kill_a_busy_actor(cluster, run)
        _, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, stderr[-3000:]
    assert len(raylets) == 2, "SPREAD put the actors on both nodes"
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

    assert not [p for p in marked(cluster.token) if "bwrap" in " ".join(procs.cmdline(p))], "sandbox left"
    assert not list(cluster.tmp.iterdir()), "actor folders (a dead actor's swept) and workspaces removed"
