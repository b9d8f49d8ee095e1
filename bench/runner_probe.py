"""What bench/runner.py measures from outside a child process, and its checks of a run store.

Machine-wide CPU from /proc/stat, `uniagent-*` cgroups, a sampler of a process tree (peak RSS of
the root and of the tree, every pid seen, so survivors can be found after the root exits), and the
store checks of the kill -9 / --resume test: every (instance, sample) pair stored exactly once,
in the store and in its export, and resolved.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sqlite3
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import psutil


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def cpu_times() -> tuple[float, float, float, float]:
    """Machine-wide (user, system, busy, total) seconds summed over cores, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait = fields[:5]
    total = sum(fields[:8])  # guest time is already in user
    busy = total - idle - iowait
    return (user + nice) / tick, system / tick, busy / tick, total / tick


def cpu_delta(before: tuple[float, ...], after: tuple[float, ...]) -> dict[str, float]:
    """Two `cpu_times()` readings as the seconds spent between them: user, sys, busy, total."""
    return dict(
        zip(
            ("user", "sys", "busy", "total"), (b - a for a, b in zip(before, after, strict=True)), strict=True
        )
    )


def cgroups_snapshot(owner: int | None = None) -> set[str]:
    """Sandbox cgroups (`uniagent-PID-ID`): those `owner` made, or all of them (machine-wide: on a
    shared machine another run's too)."""
    prefix = "uniagent-" if owner is None else f"uniagent-{owner}-"
    cgroups: set[str] = set()
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        if root.count("/") > 7:
            dirs[:] = []
            continue
        cgroups.update(os.path.join(root, d) for d in dirs if d.startswith(prefix))
    return cgroups


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def cpuacct_group(name: str) -> Path | None:
    """A cgroup v1 cpuacct group for one run of one side (see runner_child.join_cpuacct), or None
    where this machine offers none (cgroup v2 only, or no write access): that run's CPU is then
    read with rusage, and `cpu_basis` says so."""
    try:
        group = CPUACCT / name
        group.mkdir()
        return group
    except OSError:
        return None


def group_cpu_s(group: Path) -> float:
    """The CPU seconds every process that was ever in `group` has used in it."""
    return int((group / "cpuacct.usage").read_text()) / 1e9


def remove_group(group: Path | None, wait_s: float = 10.0) -> bool:
    """Remove a run's cpuacct group once its last process is gone (an exiting one may linger)."""
    deadline = time.monotonic() + wait_s
    while group is not None:
        try:
            group.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            return False
        break
    return True


STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def strays(marker: str, root: int | None = None) -> dict[int, tuple[str, str]]:
    """Processes anywhere on the machine (not `root`) with `marker` in an argument, zombies aside:
    {pid: (name, status)}. The marker is a run's private TMPDIR, which bwrap and its launcher name
    in their arguments (the sandbox's workspace and control dirs). Found by argv, not by the tree:
    a sandbox process that outlived the run was reparented to init, possibly before any sample
    saw it (issue 14: six bwraps left stopped, state T, by a kill -9, unseen by the tree check)."""
    out = {}
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        info = p.info
        if p.pid == root or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(marker in arg for arg in info["cmdline"] or ()):
            out[p.pid] = (info["name"], info["status"])
    return out


def mem_used() -> int:
    """Machine memory in use, bytes: MemTotal - MemAvailable (/proc/meminfo). What a run adds to it
    is its real footprint, shared pages once and kernel memory (page tables, sockets) included."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    kb = int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])
    return kb * 1024


def pss(pid: int) -> int:
    """A process's proportional set size, bytes (its shared pages divided among their users)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class TreeMonitor(threading.Thread):
    """Samples a process tree: peak RSS of the root and of the whole tree (summed RSS counts shared
    pages once per process), the tree's peak PSS (every `pss_every`-th sample: reading smaps walks
    page tables), the machine's memory in use above what it used before the run, and every pid
    seen (with its start time, so a reused pid is not mistaken for a survivor)."""

    def __init__(self, pid: int, interval: float, marker: str | None = None, pss_every: int = 5) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.marker = marker  # see `strays`
        self.interval = interval
        self.pss_every = pss_every
        self.peak_root = 0
        self.peak_tree = 0
        self.peak_tree_pss = 0
        self.peak_pss_by_name: collections.Counter[str] = collections.Counter()
        self.mem_baseline = mem_used()
        self.peak_mem_used = self.mem_baseline
        self.peak_procs = 0
        self.samples = 0
        self.seen: dict[int, tuple[float, str]] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        tree = 0
        for p in procs:
            try:
                rss = p.memory_info().rss
                if p.pid not in self.seen:
                    self.seen[p.pid] = (p.create_time(), p.name())
            except psutil.Error:
                continue
            tree += rss
            if p.pid == self.root.pid:
                self.peak_root = max(self.peak_root, rss)
        self.peak_tree = max(self.peak_tree, tree)
        self.peak_procs = max(self.peak_procs, len(procs))
        self.peak_mem_used = max(self.peak_mem_used, mem_used())
        if self.samples % self.pss_every == 0:
            by_name: collections.Counter[str] = collections.Counter()
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    by_name[p.name()] += pss(p.pid)
            total = sum(by_name.values())
            if total > self.peak_tree_pss:
                self.peak_tree_pss, self.peak_pss_by_name = total, by_name
        self.samples += 1

    def memory_mb(self) -> dict[str, float]:
        """Peak memory figures, MB: the tree's PSS, and the machine's memory in use above its use
        before the run started (`machine_delta`)."""
        mb = 1 << 20
        return {
            "tree_pss": round(self.peak_tree_pss / mb, 1),
            "tree_pss_by_command": {k: round(v / mb, 1) for k, v in self.peak_pss_by_name.most_common(6)},
            "machine_delta": round((self.peak_mem_used - self.mem_baseline) / mb, 1),
        }

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def survivors(self) -> list[str]:
        """Processes of the tree (not its root) still there, `name(pid)` each, `name(pid, stopped)`
        for one stopped (state T: it never ends by itself), and the run's `strays`. A zombie (dead,
        waiting for its new parent to reap it) has ended and is not counted."""
        alive = {}
        for pid, (created, name) in self.seen.items():
            if pid == self.root.pid:
                continue
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    alive[pid] = (name, p.status())
            except psutil.Error:
                continue
        if self.marker:
            alive.update(
                (pid, seen) for pid, seen in strays(self.marker, self.root.pid).items() if pid not in alive
            )
        return [
            f"{name}({pid}{', stopped' if status in STOPPED else ''})"
            for pid, (name, status) in alive.items()
        ]

    def wait_survivors(self, timeout: float) -> tuple[list[str], float]:
        """Survivors once none is left or `timeout` passed, and how long that took."""
        t0 = time.monotonic()
        while (left := self.survivors()) and time.monotonic() - t0 < timeout:
            time.sleep(0.25)
        return left, time.monotonic() - t0


def store_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "run.db"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.execute("PRAGMA busy_timeout=10000")
    conn.row_factory = sqlite3.Row
    try:
        sql = "SELECT instance_id, sample, exit_reason, resolved, turns, timings, attempts FROM episodes"
        return [dict(r) for r in conn.execute(sql)]
    finally:
        conn.close()


def store_count(run_dir: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{run_dir / 'run.db'}?mode=ro", uri=True)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM episodes").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def check_pairs(
    pairs: list[tuple[str, int]],
    expected: set[tuple[str, int]],
    unresolved: set[tuple[str, int]] = frozenset(),
) -> dict[str, Any]:
    """Every expected pair present exactly once: duplicates, missing and unexpected pairs."""
    counts = collections.Counter(pairs)
    return {
        "stored": len(pairs),
        "duplicates": sorted(f"{i}#{s}" for (i, s), n in counts.items() if n > 1),
        "missing": sorted(f"{i}#{s}" for i, s in expected - set(counts)),
        "unexpected": sorted(f"{i}#{s}" for i, s in set(counts) - expected),
        "unresolved": sorted(f"{i}#{s}" for i, s in unresolved),
    }


def check_run(run_dir: Path, expected: set[tuple[str, int]]) -> dict[str, Any]:
    """`check_pairs` on the store and on its export (results.jsonl), plus pairs stored twice (a
    store row whose `attempts` > 1: written again over an earlier row)."""
    rows = store_rows(run_dir)
    unresolved = {(r["instance_id"], r["sample"]) for r in rows if not r["resolved"]}
    out = check_pairs([(r["instance_id"], r["sample"]) for r in rows], expected, unresolved)
    out["rewritten"] = sorted(f"{r['instance_id']}#{r['sample']}" for r in rows if r["attempts"] > 1)
    results = run_dir / "results.jsonl"
    if results.exists():
        lines = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
        exported = check_pairs([(r["instance_id"], r["sample"]) for r in lines], expected)
        out["export_duplicates"], out["export_missing"] = exported["duplicates"], exported["missing"]
    return out


def side_figures(
    report: dict[str, Any],
    counts: tuple[int, int, int],
    turns: int,
    wall: float,
    cpu: dict[str, float],
) -> dict[str, Any]:
    """The figures both sides share, taken the same way from either child's report (`window_s`,
    `startup_wall_s`, `cpu_start`/`cpu_end`: runner_child.rusage at the timed window's two ends),
    `wall` (its process's start to exit, seen from outside) and the machine's CPU meanwhile.
    Episodes per minute count resolved episodes only; CPU per model turn is the whole process tree's
    over the window (its cpuacct cgroup; without one, its own plus its reaped descendants'), split
    into the process's own (RUSAGE_SELF) and the rest (sandboxes, commands, the verifier's tests).
    `counts`: the episodes scripted, those that ran, those resolved."""
    expected, episodes, resolved = counts
    window = report["window_s"]
    c0, c1 = report["cpu_start"], report["cpu_end"]
    own = c1["self_user_s"] + c1["self_sys_s"] - c0["self_user_s"] - c0["self_sys_s"]
    reaped = c1["children_user_s"] + c1["children_sys_s"] - c0["children_user_s"] - c0["children_sys_s"]
    if c0.get("tree_s") is not None and c1.get("tree_s") is not None:
        total, basis = c1["tree_s"] - c0["tree_s"], "cpuacct cgroup: the whole process tree"
    else:
        total, basis = own + reaped, "rusage: self + reaped children (orphans' CPU may be lost)"
    kids = total - own
    per_turn = 1e3 / max(turns, 1)
    return {
        "episodes": episodes,
        "resolved": resolved,
        "failed": expected - resolved,
        "turns": turns,
        "wall_s": round(window, 2),
        "episodes_per_min": round(resolved / window * 60, 2) if window > 0 else 0.0,
        "turns_per_s": round(turns / window, 2) if window > 0 else 0.0,
        "cpu_ms_per_turn": round((own + kids) * per_turn, 2),
        "cpu_self_ms_per_turn": round(own * per_turn, 2),
        "cpu_children_ms_per_turn": round(kids * per_turn, 2),
        "cpu_basis": {"total": basis, "rusage_reaped_children_ms_per_turn": round(reaped * per_turn, 2)},
        "startup_wall_s": round(report["startup_wall_s"], 2),
        "startup_cpu_s": round(sum(v for k, v in c0.items() if k != "tree_s"), 2),  # rusage, no tree
        "process_wall_s": round(wall, 2),
        "episodes_per_min_with_startup": round(resolved / wall * 60, 2) if wall else 0.0,
        "cpu_util": round(cpu["busy"] / cpu["total"], 3) if cpu["total"] else 0.0,
        "machine_cpu_s": {"user": round(cpu["user"], 1), "sys": round(cpu["sys"], 1)},
    }


def level_figures(
    rows: list[dict[str, Any]],
    child: dict[str, Any],
    wall: float,
    cpu: dict[str, float],
    expected: int | None = None,
) -> dict[str, Any]:
    """uniagent's figures from the store rows, the runner child's report and the machine's CPU;
    `expected`: the episodes scripted (default: those stored)."""
    timings = [json.loads(r["timings"]) if isinstance(r["timings"], str) else r["timings"] for r in rows]
    medians = {
        key: round(statistics.median(t[key] for t in timings if key in t), 3)
        for key in ("setup_s", "sandbox_start_s", "tools_s", "model_s", "verifier_s", "episode_s")
        if any(key in t for t in timings)
    }
    lags = child.get("lag_s") or []
    resolved = sum(bool(r["resolved"]) for r in rows)
    counts = (len(rows) if expected is None else expected, len(rows), resolved)
    figs = side_figures(child, counts, sum(r["turns"] for r in rows), wall, cpu)
    return {
        **figs,
        "verifier_parse_cpu_s": round(child["grade_cpu_s"], 2),
        "loop_lag_ms": {
            "p50": round(percentile(lags, 50) * 1e3, 2),
            "p99": round(percentile(lags, 99) * 1e3, 2),
            "max": round(max(lags, default=0.0) * 1e3, 2),
        },
        "loop_stalls": {k: v for k, v in (child.get("stalls") or {}).items() if k != "top_stacks"},
        "exits": dict(collections.Counter(r["exit_reason"] for r in rows)),
        "episode_median_s": medians,
        "open_fds_at_end": child["open_fds"],
        "threads_at_end": child["threads"],
    }


def peer_figures(peer: dict[str, Any], expected: int, wall: float, cpu: dict[str, float]) -> dict[str, Any]:
    """The peer's figures from bench/runner_peer.py's report, on `side_figures`' basis: an episode
    counts as resolved when mini-swe-agent submitted and the verifier (in its worker) resolved it."""
    episodes = peer["episodes"]
    resolved = sum(e["exit_status"] == "Submitted" and e["resolved"] for e in episodes)
    figs = side_figures(peer, (expected, len(episodes), resolved), peer["turns"], wall, cpu)
    spans = {
        "agent_s": ("start", "agent_end"),
        "verifier_s": ("verify_start", "verify_end"),
        "episode_s": ("start", "end"),
    }
    medians = {
        key: round(statistics.median(e["window"][b] - e["window"][a] for e in episodes), 3)
        for key, (a, b) in spans.items()
        if episodes and all(a in e["window"] and b in e["window"] for e in episodes)
    }
    return {
        **figs,
        "exits": dict(collections.Counter(e["exit_status"] for e in episodes)),
        "verifier": dict(collections.Counter(e["verify_status"] for e in episodes)),
        "episode_median_s": medians,
        "open_fds_at_end": peer["open_fds"],
    }
