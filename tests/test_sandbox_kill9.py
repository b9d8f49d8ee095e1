"""A controller killed with -9 while it stops a sandbox leaves nothing of it (real bubblewrap).

Stopping used to freeze bwrap (SIGSTOP) before listing and killing its tree: a controller killed
in that window left the frozen process stopped forever (state T), where neither a parent-death
signal armed too late nor the stdin lifeline could end it (issue 14: 6 stopped bwraps 28 minutes
after the kill -9 bench). Here the controller is a child process that SIGKILLs itself right
after its first signal to the sandbox's processes, so the window is hit every time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import needs_bwrap
from uniagent.sandbox import procs

pytestmark = needs_bwrap

_CONTROLLER = r"""
import asyncio, os, signal, sys, time
from uniagent import sandbox
from uniagent.sandbox import local

ws, mode = sys.argv[1:3]
marker = os.environ.pop("KILL9_MARKER")  # not in our own argv: it names the sandbox's processes
real_kill = os.kill


def kill_then_die(pid, sig):
    # The stop's first signal to a sandbox process goes out, lands, then this controller dies.
    real_kill(pid, sig)
    if sig in (signal.SIGSTOP, signal.SIGKILL) and pid != os.getpid():
        time.sleep(0.3)
        real_kill(os.getpid(), signal.SIGKILL)


async def main():
    cfg = {"workspace": ws, "start_retries": 0}
    if mode == "starting":
        # The stop comes while the launcher still runs (a start timing out on a loaded machine):
        # before bwrap armed its parent-death signal. A 1 s pause in the launcher holds it there.
        orig = local.launcher

        def slow(lim, cgroup, own_session=False):
            prefix, preexec = orig(lim, cgroup, own_session)
            return ["/bin/sh", "-c", 'sleep 1; exec "$@"', marker, *prefix], preexec

        local.launcher = slow
        cfg["start_timeout_s"] = 0.3
        os.kill = kill_then_die
        await sandbox.create(cfg).start()
        return
    sb = sandbox.create(cfg)
    await sb.start()
    forker = f"sh -c 'while :; do /bin/true; done' {marker}"
    await sb.exec(f"for i in 1 2; do {forker} >/dev/null 2>&1 & done; echo forking", timeout=30)
    print("ready", flush=True)
    sys.stdin.readline()
    os.kill = kill_then_die
    await sb.stop()


asyncio.run(main())
"""


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _in_ns(ns: str) -> list[int]:
    """Live processes in the PID namespace `ns`, which must not be ours (that is every process)."""
    assert ns != _pid_ns(os.getpid())
    return [
        int(p) for p in os.listdir("/proc") if p.isdigit() and _pid_ns(int(p)) == ns and procs.alive(int(p))
    ]


def _left(ws: str, marker: str, ns: str | None) -> dict[int, tuple[str | None, list[str]]]:
    pids = {*procs.pids_with_arg(ws), *procs.pids_with_arg(marker), *(_in_ns(ns) if ns else [])}
    return {p: (procs.state(p), procs.cmdline(p)[:3]) for p in pids}


@pytest.mark.parametrize("mode", ["started", "starting"])
def test_controller_killed_while_stopping_leaves_no_sandbox_process(tmp_path: Path, mode: str) -> None:
    ws = str(tmp_path / f"ws-{mode}")
    marker = f"uniagent-kill9-{mode}-{os.getpid()}"
    ctl = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER, ws, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "KILL9_MARKER": marker},
    )
    ns = None
    try:
        if mode == "started":
            assert ctl.stdout is not None and ctl.stdin is not None
            assert ctl.stdout.readline().strip() == b"ready", "the controller did not start its sandbox"
            forkers = procs.pids_with_arg(marker)
            assert forkers, "the forking process did not start"
            spaces = {_pid_ns(p) for p in forkers}
            assert len(spaces) == 1 and None not in spaces and _pid_ns(os.getpid()) not in spaces, spaces
            ns = spaces.pop()
            ctl.stdin.write(b"stop\n")
            ctl.stdin.flush()
        assert ctl.wait(60) == -9, "the controller was not killed mid-stop"
        deadline = time.monotonic() + 10
        while (left := _left(ws, marker, ns)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"processes of the sandbox outlived its controller (pid: state, argv): {left}"
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait()
        procs.signal_pids(list(_left(ws, marker, ns)), 9)
