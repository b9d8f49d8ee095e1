"""A Ray cluster of several nodes on this machine: one raylet per node, started with `ray start`.

Used by bench/runner_ray.py and tests/test_runner_ray_cluster.py to run `uniagent run --backend
ray` across nodes and to kill a worker (or a whole node) mid-run. Each node is a real raylet with
its own temp dir and CPU count; they share this machine's filesystem, as nodes of a real cluster
share one for task repositories.

The cluster's daemons carry its own auth token in their environment (token authentication, as
`ray start --head` turns on by default) and its own TMPDIR: that, plus the process tree below
them, is how `pids()` finds exactly this cluster's processes and `stop()` kills them. `ray stop`
would kill every Ray on the machine, other runs' included. Linux only (/proc).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from uniagent.sandbox import procs

ACTOR_TITLE = "ray::EpisodeActor"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parent(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class LocalCluster:
    """`nodes` raylets with `cpus` CPUs each; `address` once started. A context manager."""

    def __init__(self, nodes: int = 2, cpus: int = 1) -> None:
        self.nodes = nodes
        self.cpus = cpus
        # Short: Ray's unix socket paths under the temp dirs must stay under 108 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="uaray-", dir="/tmp"))
        self.tmp = self.root / "tmp"  # the nodes' TMPDIR: actors keep sandbox workspaces there
        self.tmp.mkdir()
        self.token = uuid.uuid4().hex
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "TMPDIR": str(self.tmp),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        self.address = ""
        self.start_s = 0.0

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> str:
        """The head, then the other nodes, each `ray start` started as soon as the head's GCS port
        is chosen (a joining node waits for the GCS itself): they come up together."""
        t0 = time.monotonic()
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        starts = [
            self._ray_start(
                "--head",
                f"--port={port}",
                f"--temp-dir={self.node_dir(0)}",
                "--include-dashboard=false",
                f"--ray-client-server-port={free_port()}",
                f"--dashboard-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
            )
        ]
        for i in range(1, self.nodes):
            starts.append(
                self._ray_start(
                    f"--address={self.address}",
                    f"--temp-dir={self.node_dir(i)}",
                    f"--dashboard-agent-listen-port={free_port()}",
                )
            )
        failed = []
        for proc in starts:
            out, _ = proc.communicate(timeout=240)
            if proc.returncode != 0:
                failed.append(out[-2000:])
        if failed:
            self.stop()
            raise RuntimeError(f"ray start failed: {failed[0]}")
        self.start_s = time.monotonic() - t0
        return self.address

    def _ray_start(self, *args: str) -> subprocess.Popen[str]:
        ray = Path(sys.executable).parent / "ray"
        argv = [str(ray), "start", f"--num-cpus={self.cpus}", "--disable-usage-stats"]
        # log_to_driver is off in the runner: nobody reads what a log monitor would forward.
        argv += ["--include-log-monitor=false", *args]
        return subprocess.Popen(
            argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def stop(self, within_s: float = 20.0) -> list[int]:
        """SIGKILL every process of the cluster (repeatedly: a raylet may start a worker meanwhile),
        remove its folders; the pids still alive after `within_s` (none, normally)."""
        deadline = time.monotonic() + within_s
        while (pids := [p for p in self.pids() if procs.alive(p)]) and time.monotonic() < deadline:
            procs.signal_pids(pids, signal.SIGKILL)
            time.sleep(0.2)
        survivors = [p for p in self.pids() if procs.alive(p)]
        shutil.rmtree(self.root, ignore_errors=True)
        return survivors

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- processes ---------------------------------------------------------------------------------
    def node_dir(self, i: int) -> Path:
        return self.root / f"node{i}"

    def pids(self) -> list[int]:
        """Processes whose environment holds the token, and their descendants: raylets, GCS and Ray's
        Python daemons keep their environment; workers (a raylet's children) overwrite theirs with
        their process title, and sandboxes run below workers."""
        needle = f"RAY_AUTH_TOKEN={self.token}".encode()
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

    def raylets(self) -> dict[int, int]:
        """Node index -> its raylet's pid."""
        out = {}
        for pid in self.pids():
            argv = procs.cmdline(pid)
            if argv and argv[0].endswith("/raylet"):
                for i in range(self.nodes):
                    if any(str(self.node_dir(i)) + "/" in a for a in argv):
                        out[i] = pid
        return out

    def actors(self) -> list[int]:
        """Live episode actor workers (any node)."""
        return [
            p for p in self.pids() if procs.alive(p) and (procs.cmdline(p) or [""])[0].startswith(ACTOR_TITLE)
        ]

    def actors_per_node(self) -> dict[int, int]:
        nodes = {pid: i for i, pid in self.raylets().items()}
        counts = dict.fromkeys(range(self.nodes), 0)
        for actor in self.actors():
            node = nodes.get(parent(actor) or -1)
            if node is not None:
                counts[node] += 1
        return counts

    def busy_actors(self) -> list[int]:
        """Actors running an episode right now: a bubblewrap sandbox below them."""
        return [
            a for a in self.actors() if any("bwrap" in " ".join(procs.cmdline(k)) for k in procs.children(a))
        ]

    def sandboxes(self) -> list[int]:
        return [p for p in self.pids() if procs.alive(p) and "bwrap" in " ".join(procs.cmdline(p)[:1])]

    def kill_node(self, i: int) -> list[int]:
        """SIGKILL node `i`: its raylet and daemons (named by its temp dir) and everything below them
        (its workers, their sandboxes), as if the machine were lost."""
        mine = [p for p in self.pids() if any(str(self.node_dir(i)) + "/" in a for a in procs.cmdline(p))]
        victims = sorted({*mine, *(d for p in mine for d in procs.descendants(p))})
        procs.signal_pids(victims, signal.SIGKILL)
        return victims
