"""Per-sandbox cgroups (v1 controllers or a v2 unified tree), when this machine allows them.

A cgroup is what makes memory and process-count limits hold for a whole process tree (an
rlimit is per process, and RLIMIT_NPROC counts the host user's processes, not the
sandbox's). Where no cgroup can be created the caller falls back to rlimits and logs it.

v2 (a unified tree at ROOT) differs in what it takes: a group's memory.max / pids.max /
cpu.max exist only for the controllers its parent enables in `cgroup.subtree_control`
(none by default), and a controller bound to a v1 hierarchy on a hybrid machine is not
offered to v2 at all. Both are found out and reported per controller (`why`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import signal
import time
from pathlib import Path

from uniagent.sandbox.procs import owner_of, pid_alive

log = logging.getLogger(__name__)
ROOT = Path("/sys/fs/cgroup")


def is_v2() -> bool:
    """A unified (v2-only) tree at ROOT; a hybrid machine mounts its v2 tree elsewhere
    (/sys/fs/cgroup/unified) and keeps the controllers in v1, so it counts as v1."""
    return (ROOT / "cgroup.controllers").exists()


def enable_controllers(base: Path, wanted: list[str]) -> dict[str, str]:
    """v2: enable `wanted` controllers for the children of `base`; returns why each one that
    cannot be is missing. Idempotent (a `+memory` already there is a no-op), so sandboxes
    made at once on several threads may all call it."""
    try:
        offered = set((base / "cgroup.controllers").read_text().split())
        enabled = set((base / "cgroup.subtree_control").read_text().split())
    except OSError as exc:
        return {c: f"cannot read {base}: {exc.strerror or exc}" for c in wanted}
    why: dict[str, str] = {}
    for ctrl in wanted:
        if ctrl in enabled:
            continue
        if ctrl not in offered:
            why[ctrl] = (
                f"the {ctrl} controller is not offered in {base} (bound to a cgroup v1 hierarchy, "
                "or not delegated to this cgroup)"
            )
            continue
        try:
            (base / "cgroup.subtree_control").write_text(f"+{ctrl}")
        except OSError as exc:
            why[ctrl] = f"enabling +{ctrl} in {base}/cgroup.subtree_control failed: {exc.strerror or exc}"
            if exc.errno == errno.EBUSY:  # the "no internal processes" rule of v2
                why[ctrl] += (
                    " (that cgroup holds processes; run uniagent in a cgroup of its own, e.g. "
                    "`systemd-run --scope -p Delegate=yes`)"
                )
    return why


def _own_path(controller: str) -> str:
    """This process's cgroup for a v1 controller ('' for the v2 unified line)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return path
    return "/"


def _base(controller: str) -> Path:
    """Where this process makes its sandboxes' cgroups for a v1 controller ('' : v2)."""
    if controller:
        return ROOT / controller / _own_path(controller).lstrip("/")
    return ROOT / _own_path("").lstrip("/")


def cgroup_name(sandbox_id: str) -> str:
    """`uniagent-<owner pid>-<id>`: the owner's pid lets a later process remove what one that was
    killed (-9, so it never stopped its sandboxes) left behind; see `reap_orphans`."""
    return f"uniagent-{os.getpid()}-{sandbox_id}"


def owner_pid(name: str) -> int | None:
    return owner_of(name, "uniagent-")


SHARED_CPU = "sandboxes"


def shared_cpu_name() -> str:
    return f"uniagent-{os.getpid()}-{SHARED_CPU}"


_shared_cpu: list[Path | None] = []


def shared_cpu_group() -> Path | None:
    """One cpu cgroup (v1) per controller process that all its sandboxes share, created once.

    Why: where the kernel groups tasks by session (autogroups), every sandbox shell is its own
    scheduling entity, so 1,000 busy sandboxes outweigh the controller 1,000 to 1 and its event
    loop waits seconds for a core (measured: loop-lag p99 2.6 s at 1,000 episodes on 2 cores,
    with the sandboxes at nice 19). In one group of default weight the sandboxes together weigh
    what the controller does: each gets its share of the CPU when both want it, and the
    sandboxes get all of what the controller leaves. Removed at exit (or by `reap_orphans`).
    """
    if not _shared_cpu:
        d = _base("cpu") / shared_cpu_name()
        try:
            d.mkdir(exist_ok=True)
            (d / "cpu.shares").write_text("1024")
        except OSError:
            _shared_cpu.append(None)
            return None
        _shared_cpu.append(d)
        atexit.register(_remove_dir, d)
    return _shared_cpu[0]


def _remove_dir(d: Path, tries: int = 50) -> bool:
    for _ in range(tries):
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.02)
    return False


_leftover: list[Path] = []


def _retry_later(d: Path) -> None:
    if not _leftover:
        atexit.register(_retry_leftovers, 50)
    _leftover.append(d)


def _retry_leftovers(tries: int = 1) -> None:
    _leftover[:] = [d for d in _leftover if not _remove_dir(d, tries)]


def release_now() -> None:
    """What this module's exit hooks remove (the shared cpu group, cgroups still to retry), for an
    exit that skips them: `os._exit` after a forced stop (runner/interrupt.py)."""
    _retry_leftovers(5)
    if _shared_cpu and _shared_cpu[0] is not None:
        _remove_dir(_shared_cpu[0], 5)


def reap_orphans() -> list[Path]:
    """Remove the empty sandbox cgroups whose owner process is gone. A cgroup that still holds a
    process cannot be removed (rmdir fails) and is left alone; so are those of live owners."""
    removed: list[Path] = []
    for ctrl in ("",) if is_v2() else ("memory", "pids", "cpu"):
        try:  # a shared cpu group's per-sandbox children first: a group with children stays
            found = [*_base(ctrl).glob("uniagent-*/uniagent-*"), *_base(ctrl).glob("uniagent-*")]
        except OSError:
            continue
        for d in found:
            pid = owner_pid(d.name)
            if pid is None or pid == os.getpid() or pid_alive(pid):
                continue
            with contextlib.suppress(OSError):
                d.rmdir()
                removed.append(d)
    return removed


_reaped = False


class SandboxCgroup:
    """One cgroup per controller for one sandbox; `procs_files` are what a child joins.

    The first one a process makes also removes what killed controllers left (`reap_orphans`).
    """

    def __init__(self, name: str, memory_mb: int | None, pids: int | None, cpus: float | None) -> None:
        global _reaped
        if not _reaped:
            _reaped = True
            reap_orphans()
            # Again at exit: a killed run's cgroups that still held dying processes at our start.
            atexit.register(reap_orphans)
        if _leftover:
            _retry_leftovers()
        self.name = name
        self.dirs: list[Path] = []
        self.shared: list[Path] = []  # joined, never killed or removed per sandbox
        self.applied: list[str] = []
        self.missing: list[str] = []
        self.why: dict[str, str] = {}  # per missing controller, where known
        if is_v2():
            self._setup_v2(memory_mb, pids, cpus)
        else:
            self._setup_v1(memory_mb, pids, cpus)

    def _mk(self, base: Path) -> Path | None:
        d = base / self.name
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        self.dirs.append(d)
        return d

    @staticmethod
    def _write(path: Path, value: str) -> bool:
        try:
            path.write_text(value)
            return True
        except OSError:
            return False

    def _setup_v1(self, memory_mb: int | None, pids: int | None, cpus: float | None) -> None:
        wants = {"memory": memory_mb, "pids": pids, "cpu": cpus}
        shared = shared_cpu_group()
        if shared is not None and cpus is None:
            self.shared.append(shared)
        for ctrl, value in wants.items():
            if value is None:
                continue
            d = self._mk(shared if ctrl == "cpu" and shared is not None else _base(ctrl))
            ok = d is not None
            if d is not None and ctrl == "memory":
                ok = self._write(d / "memory.limit_in_bytes", str(int(value) << 20))
                if (d / "memory.memsw.limit_in_bytes").exists():
                    self._write(d / "memory.memsw.limit_in_bytes", str(int(value) << 20))
            elif d is not None and ctrl == "pids":
                ok = self._write(d / "pids.max", str(int(value)))
            elif d is not None and ctrl == "cpu":
                ok = self._write(d / "cpu.cfs_quota_us", str(int(float(value) * 100_000)))
            (self.applied if ok else self.missing).append(ctrl)

    def _setup_v2(self, memory_mb: int | None, pids: int | None, cpus: float | None) -> None:
        wants: dict[str, list[tuple[str, str]] | None] = {
            # no swap beyond the limit, as v1's memsw limit equal to the memory limit
            "memory": None if memory_mb is None else [("memory.max", str(int(memory_mb) << 20))],
            "pids": None if pids is None else [("pids.max", str(int(pids)))],
            "cpu": None if cpus is None else [("cpu.max", f"{int(float(cpus) * 100_000)} 100000")],
        }
        base = _base("")
        self.why = enable_controllers(base, [c for c, v in wants.items() if v is not None])
        d = self._mk(base)
        for ctrl, files in wants.items():
            if files is None:
                continue
            ok = d is not None and ctrl not in self.why and all(self._write(d / f, v) for f, v in files)
            if ok and d is not None and ctrl == "memory" and (d / "memory.swap.max").exists():
                self._write(d / "memory.swap.max", "0")
            if not ok and ctrl not in self.why:
                self.why[ctrl] = f"cannot make {base / self.name} or write its {files[0][0]}"
            (self.applied if ok else self.missing).append(ctrl)

    def oom_kills(self) -> int:
        """How many of the sandbox's processes the kernel killed for its memory limit (v2
        memory.events, v1 memory.oom_control: their `oom_kill` line); 0 where unreadable."""
        for d in self.dirs:
            for fname in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError, ValueError):
                    for line in (d / fname).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
        return 0

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in (*self.dirs, *self.shared)]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return out

    def limit_events(self) -> dict[str, int]:
        """How often the sandbox's own limits were hit: `oom_kill` (a process of it killed by its
        memory limit) and `pids_max` (a fork refused at its pids limit), from memory.events (v2) or
        memory.oom_control (v1), and pids.events. What ran inside caused these, nothing else."""
        out: dict[str, int] = {}
        for d in self.dirs:
            for fname, key, name in (
                ("memory.events", "oom_kill", "oom_kill"),
                ("memory.oom_control", "oom_kill", "oom_kill"),
                ("pids.events", "max", "pids_max"),
            ):
                try:
                    lines = (d / fname).read_text().splitlines()
                except OSError:
                    continue
                for line in lines:
                    k, _, v = line.partition(" ")
                    if k == key and v.strip().isdigit() and int(v) > 0:
                        out[name] = max(out.get(name, 0), int(v))
        return out

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILL until empty: forks racing the kill are caught by the next sweep."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for d in self.dirs:  # v2 (5.14+): the kernel kills the whole group at once, forks too
                if (d / "cgroup.kill").exists():
                    self._write(d / "cgroup.kill", "1")
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        log.warning("cgroup %s still has processes after %gs", self.name, timeout_s)

    def remove(self) -> None:
        """Remove the cgroups; one that still holds an exiting process (a zombie not yet reaped
        on a saturated machine) is retried by the next sandbox's cgroup and at exit."""
        for d in reversed(self.dirs):
            if not _remove_dir(d):
                _retry_later(d)
