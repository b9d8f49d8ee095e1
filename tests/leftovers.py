"""What the test session leaves running: the session-end check of tests/conftest.py.

Every process a test starts inherits `MARKER` (set in this process's environment when the
session begins), and keeps it: a fork without exec (bwrap's sandbox child) keeps the very
environment block, and an exec keeps the environment unless it is scrubbed. So a leftover is
found even after it was reparented to init, and processes of other sessions, benchmarks or
users on the same machine are never taken for ours. Children of this process count too, with
or without the marker. Sandbox cgroups (`uniagent-*`) that appeared during the session and are
still there, with their owner gone, are reported beside them.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

from uniagent.sandbox import cgroups, procs

MARKER = "UNIAGENT_TEST_SESSION"
CGROUP_ROOT = Path("/sys/fs/cgroup")

# Python's own helpers that end with the interpreter, not before the session ends.
BENIGN = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def begin() -> str:
    """Mark this session: every process started from now on carries the returned value."""
    value = os.environ.get(MARKER) or f"{os.getpid()}-{secrets.token_hex(4)}"
    os.environ[MARKER] = value
    return value


def _has_marker(pid: int, value: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER}={value}".encode() in env.split(b"\0")


def leftover_processes(value: str, me: int | None = None) -> list[int]:
    """Live processes of this session other than `me` (default: this process): its children
    and every process that carries the session's marker, with their descendants."""
    me = os.getpid() if me is None else me
    found = set(procs.descendants(me))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != me and _has_marker(int(entry.name), value):
            found.add(int(entry.name))
            found.update(procs.descendants(int(entry.name)))
    found.discard(me)
    return sorted(
        p for p in found if procs.alive(p) and not any(b in " ".join(procs.cmdline(p)) for b in BENIGN)
    )


def describe(pid: int) -> str:
    """`pid (parent ppid): argv`, clipped, for the report."""
    try:
        ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        ppid = "?"
    argv = " ".join(procs.cmdline(pid)) or "?"
    if len(argv) > 160:
        argv = argv[:70] + " ... " + argv[-85:]
    return f"{pid} (parent {ppid}): {argv}"


def settle(value: str, wait_s: float = 3.0) -> list[int]:
    """The leftovers once processes that are already dying had a moment to go (a sandbox's
    init dies by its parent-death signal just after bwrap)."""
    deadline = time.monotonic() + wait_s
    left = leftover_processes(value)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = leftover_processes(value)
    return left


def kill(pids: list[int]) -> None:
    procs.signal_pids(pids, signal.SIGKILL)


def leaked_cgroups(before: set[str]) -> list[str]:
    """Sandbox cgroups made during the session whose owner process is gone and that could not
    be removed (a process is still inside). Empty ones are removed first, as the next sandbox
    start would (`reap_orphans`); those of live owners (another run on this machine) are not
    leaks."""
    cgroups.reap_orphans()
    out = []
    for path in sorted(sandbox_cgroups() - before):
        pid = cgroups.owner_pid(Path(path).name)
        try:
            inside = (Path(path) / "cgroup.procs").read_text().split()
        except OSError:
            continue
        if pid is not None and not procs.alive(pid) and inside:
            out.append(path)
    return out


def sandbox_cgroups() -> set[str]:
    """Every `uniagent-*` cgroup directory on this machine (v1 controllers or v2)."""
    if not CGROUP_ROOT.is_dir():
        return set()
    try:
        return {str(d) for d in CGROUP_ROOT.rglob("uniagent-*") if d.is_dir()}
    except OSError:
        return set()
