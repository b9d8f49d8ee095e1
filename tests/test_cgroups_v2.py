"""The cgroup v2 path of sandbox/cgroups.py, run for real under a cgroup2 mount this test makes.

The machines this suite runs on are hybrid: memory, pids and cpu are bound to v1 hierarchies,
and the v2 tree (/sys/fs/cgroup/unified) offers none of them. A fresh `mount -t cgroup2`
shows that same v2 tree, so everything v2 does without those controllers runs for real here:
finding the base group, enabling controllers (refused, with the reason, for one not offered),
making the group, joining processes (a real local sandbox's shell), `cgroup.kill`, and removal
and orphan reaping. Where the kernel offers a controller to v2 (a v2-only machine), the same
tests check that its limit is written and holds (a fork past pids.max fails, a process past
memory.max is OOM-killed and counted in memory.events); where it does not, that it is reported
missing (so the local sandbox falls back to rlimits), never silently "applied".
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import needs_bwrap, require
from uniagent.sandbox import cgroups, create
from uniagent.sandbox.bwrap import child_setup
from uniagent.sandbox.cgroups import SandboxCgroup, cgroup_name, enable_controllers
from uniagent.sandbox.local import LocalSandbox
from uniagent.sandbox.settings import Limits


def _mount_v2(where: str) -> str:
    res = subprocess.run(["mount", "-t", "cgroup2", "none", where], capture_output=True, text=True)
    return "" if res.returncode == 0 else res.stderr.strip() or f"mount exit {res.returncode}"


@pytest.fixture
def v2_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cgroup2 mount made for this test, as cgroups.ROOT (so the module takes the v2 path)."""
    require("root", os.geteuid() == 0, "mounting a cgroup2 tree needs root")
    where = tempfile.mkdtemp(prefix="ua-cg2-")
    err = _mount_v2(where)
    if err:
        os.rmdir(where)
        require("a cgroup2 mount", False, err)
    monkeypatch.setattr(cgroups, "ROOT", Path(where))
    try:
        yield Path(where)
    finally:
        subprocess.run(["umount", "-l", where], check=False)
        os.rmdir(where)


def offered(root: Path) -> set[str]:
    base = cgroups._base("")
    return set((base / "cgroup.controllers").read_text().split())


def test_the_v2_tree_is_detected_and_the_base_is_this_process_group(v2_root: Path) -> None:
    assert cgroups.is_v2()
    own = next(line for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
    assert cgroups._base("") == v2_root / own.split("::", 1)[1].lstrip("/")
    assert (cgroups._base("") / "cgroup.procs").exists()


def test_a_controller_not_offered_is_refused_with_the_reason(v2_root: Path) -> None:
    base = cgroups._base("")
    why = enable_controllers(base, ["memory", "pids", "cpu", "no-such-controller"])
    assert "not offered" in why["no-such-controller"]
    for ctrl in ("memory", "pids", "cpu"):
        if ctrl in offered(v2_root):
            assert ctrl not in why and ctrl in (base / "cgroup.subtree_control").read_text().split()
        else:  # this machine: bound to its v1 hierarchy
            assert "not offered" in why[ctrl]


def test_an_offered_controller_is_enabled_for_children_and_busy_groups_are_named(v2_root: Path) -> None:
    """The kernel's own rules, with the controller v2 does offer here (hugetlb on this machine;
    memory/pids/cpu on a v2-only one): enabling one makes its files appear in a child; in a
    group that holds a process (not the root) the kernel refuses (EBUSY), and the reason says
    what to do."""
    base = cgroups._base("")
    spare = sorted(offered(v2_root))
    require("a controller offered to cgroup v2", bool(spare), f"{base}/cgroup.controllers is empty")
    ctrl = spare[0]
    before = set((base / "cgroup.subtree_control").read_text().split())
    parent = base / cgroup_name("v2busy")
    proc: subprocess.Popen[bytes] | None = None
    try:
        assert enable_controllers(base, [ctrl]) == {}
        assert ctrl in (base / "cgroup.subtree_control").read_text().split()
        parent.mkdir()
        assert ctrl in (parent / "cgroup.controllers").read_text().split()
        assert any(f.name.startswith(f"{ctrl}.") for f in parent.iterdir())
        proc = subprocess.Popen(["sleep", "60"])
        (parent / "cgroup.procs").write_text(str(proc.pid))
        why = enable_controllers(parent, [ctrl])
        assert "holds processes" in why[ctrl] and "Device or resource busy" in why[ctrl], why
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        if parent.exists():
            cgroups._remove_dir(parent)
        if ctrl not in before:
            (base / "cgroup.subtree_control").write_text(f"-{ctrl}")


def test_group_limits_processes_kill_and_removal(v2_root: Path) -> None:
    """One sandbox group end to end: made, limits written or reported missing, a process
    joined (as a sandbox's child joins), killed through cgroup.kill, the group removed."""
    name = cgroup_name("v2test")
    cg = SandboxCgroup(name, memory_mb=64, pids=16, cpus=0.5)
    group = cgroups._base("") / name
    try:
        assert cg.dirs == [group] and group.is_dir()
        assert cg.procs_files == [str(group / "cgroup.procs")]
        here = offered(v2_root)
        assert sorted(cg.applied) == sorted(c for c in ("memory", "pids", "cpu") if c in here)
        assert sorted(cg.missing) == sorted(c for c in ("memory", "pids", "cpu") if c not in here)
        assert set(cg.why) == set(cg.missing)
        if "memory" in here:
            assert (group / "memory.max").read_text().strip() == str(64 << 20)
        if "pids" in here:
            assert (group / "pids.max").read_text().strip() == "16"
        if "cpu" in here:
            assert (group / "cpu.max").read_text().split() == ["50000", "100000"]

        lim = Limits(memory_mb=64, pids=16, file_size_mb=None, open_files=None)
        proc = subprocess.Popen(["sleep", "60"], preexec_fn=child_setup(lim, cg))
        try:
            assert cg.pids() == {proc.pid}
            line = Path(f"/proc/{proc.pid}/cgroup").read_text()
            assert f"0::/{group.relative_to(v2_root)}\n" in line, line
            assert (group / "cgroup.events").read_text().split()[:2] == ["populated", "1"]
            cg.kill_all()
            assert proc.wait(5) == -9
            assert cg.pids() == set()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        cg.remove()
        assert not group.exists()
    finally:
        if group.exists():
            cg.kill_all()
            group.rmdir()


def test_orphan_groups_of_a_dead_owner_are_reaped_on_v2(v2_root: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = cgroups._base("") / f"uniagent-{dead.pid}-gone"
    mine = cgroups._base("") / cgroup_name("alive")
    orphan.mkdir()
    mine.mkdir()
    try:
        removed = cgroups.reap_orphans()
        assert orphan in removed and not orphan.exists()
        assert mine.exists()  # its owner (this process) is alive
    finally:
        for d in (orphan, mine):
            if d.exists():
                d.rmdir()


def test_pids_limit_holds_where_v2_offers_it(v2_root: Path) -> None:
    """A fork past pids.max fails; where v2 is not offered pids (this hybrid machine) the group
    says so, and no limit is claimed."""
    cg = SandboxCgroup(cgroup_name("v2pids"), memory_mb=None, pids=8, cpus=None)
    try:
        if "pids" not in offered(v2_root):
            assert cg.missing == ["pids"] and "not offered" in cg.why["pids"]
            return
        script = "for i in $(seq 20); do sleep 5 & done; wait"
        lim = Limits(pids=8, file_size_mb=None, open_files=None)
        res = subprocess.run(
            ["sh", "-c", script], preexec_fn=child_setup(lim, cg), capture_output=True, text=True, timeout=60
        )
        assert "fork" in res.stderr.lower(), res.stderr
    finally:
        cg.kill_all()
        cg.remove()


def grab_past_the_limit(cg: SandboxCgroup) -> int:
    """A process in `cg` (32 MB) that touches 256 MB; its exit status (-9: OOM-killed)."""
    lim = Limits(memory_mb=32, file_size_mb=None, open_files=None)
    grab = "x = bytearray(256 << 20); x[::4096] = b'1' * len(x[::4096])"
    return subprocess.run(
        [sys.executable, "-c", grab], preexec_fn=child_setup(lim, cg), timeout=60
    ).returncode


def test_memory_limit_ooms_and_is_counted_where_v2_offers_it(v2_root: Path) -> None:
    cg = SandboxCgroup(cgroup_name("v2mem"), memory_mb=32, pids=None, cpus=None)
    try:
        if "memory" not in offered(v2_root):
            assert cg.missing == ["memory"] and "not offered" in cg.why["memory"]
            assert cg.oom_kills() == 0
            return
        assert grab_past_the_limit(cg) == -9
        assert cg.oom_kills() >= 1
    finally:
        cg.kill_all()
        cg.remove()


def test_oom_kills_are_read_from_v1_memory_oom_control(tmp_path: Path) -> None:
    """`oom_kills` on the v1 memory hierarchy this machine does have (a real OOM kill)."""
    memory = Path("/sys/fs/cgroup/memory")
    require("the v1 memory cgroup", (memory / "cgroup.procs").exists() and os.geteuid() == 0, "needs root")
    assert not cgroups.is_v2()
    cg = SandboxCgroup(cgroup_name("v1mem"), memory_mb=32, pids=None, cpus=None)
    try:
        assert cg.applied == ["memory"], cg.missing
        assert grab_past_the_limit(cg) == -9
        assert cg.oom_kills() >= 1
    finally:
        cg.kill_all()
        cg.remove()


@needs_bwrap
async def test_a_local_sandbox_runs_in_its_v2_group(v2_root: Path) -> None:
    """The local sandbox on the v2 path: its shell and what it starts are in the sandbox's v2
    group while it runs, a limit v2 does not offer falls back to an rlimit, and stop leaves no
    group behind."""
    sb = create({"type": "local", "limits": {"memory_mb": 300, "pids": 64}})
    assert isinstance(sb, LocalSandbox)
    async with sb:
        assert sb._cgroup is not None and cgroups.is_v2()
        [group] = sb._cgroup.dirs
        assert group.parent == cgroups._base("")
        res = await sb.exec("sleep 30 & echo $!; ulimit -v")
        inner_pid, vmem = res.output.split()[:2]
        inside = sb._cgroup.pids()
        assert len(inside) >= 2, inside  # the sandbox's init and its shell, the sleep too
        if "memory" in sb._cgroup.missing:
            assert vmem == str(300 << 10)  # RLIMIT_AS in KiB
        else:
            assert (group / "memory.max").read_text().strip() == str(300 << 20)
        assert inner_pid.isdigit()
    for _ in range(100):
        if not group.exists():
            break
        await asyncio.sleep(0.05)
    assert not group.exists()
