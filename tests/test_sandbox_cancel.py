"""Cancelling a sandbox start or an episode's setup (Ctrl-C, a runner stopping early) must end
promptly and leave no bubblewrap process behind (real bubblewrap).

On Python 3.11 a cancellation that lands while create_subprocess_exec connects its pipes used
to hang forever in asyncio's own cleanup, and a cancelled start or setup leaked the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import needs_bwrap, require
from uniagent import sandbox
from uniagent.agent import EpisodeResult, ExitReason
from uniagent.models.base import ChatModel
from uniagent.sandbox import procs
from uniagent.sandbox.base import Sandbox
from uniagent.tasks.base import Task
from uniagent.tasks.episode import run_episode
from uniagent.tasks.episode_setup import setup_episode

pytestmark = needs_bwrap

CANCEL_BOUND_S = 5.0


def _pids_with_arg(arg: str) -> list[int]:
    """Live processes whose argv holds `arg` (bwrap carries its workspace path in its argv)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and arg in procs.cmdline(int(p.name)) and procs.alive(int(p.name)):
            out.append(int(p.name))
    return out


async def _assert_no_process(arg: str) -> None:
    # bwrap's init dies by its parent-death signal, a moment after bwrap itself.
    deadline = time.monotonic() + 3
    while _pids_with_arg(arg) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not _pids_with_arg(arg), f"processes of the sandbox left behind: {_pids_with_arg(arg)}"


async def _cancel_after(task: asyncio.Task[Any], point: tuple[str, float]) -> None:
    kind, n = point
    if kind == "yield":  # n trips round the loop: lands inside create_subprocess_exec's awaits
        for _ in range(int(n)):
            await asyncio.sleep(0)
    else:
        await asyncio.sleep(n)
    task.cancel()


CANCEL_POINTS = [("yield", n) for n in range(1, 9)] + [
    ("sleep", d) for d in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
]


async def test_cancelled_start_ends_promptly_and_leaks_nothing(tmp_path: Path) -> None:
    for i, point in enumerate(CANCEL_POINTS):
        ws = tmp_path / f"ws-cancel-{i}"
        sb = sandbox.create({"workspace": str(ws), "start_retries": 0})
        start = asyncio.ensure_future(sb.start())
        await _cancel_after(start, point)
        began = time.monotonic()
        done, _ = await asyncio.wait({start}, timeout=CANCEL_BOUND_S)
        assert start in done, f"cancelling the start at {point} hung for over {CANCEL_BOUND_S}s"
        assert time.monotonic() - began < CANCEL_BOUND_S
        if not start.cancelled():  # the start won the race: an ordinary stop must clean up
            start.result()
            await sb.stop()
        assert not await sb.alive()
        await _assert_no_process(str(ws))


class _BlockingSetupTask(Task):
    """Its setup starts work in the sandbox, then waits until cancelled."""

    family = "test-blocking-setup"

    def __init__(self, row: dict[str, Any]) -> None:
        super().__init__(row)
        self.entered = asyncio.Event()
        self.seen: list[Sandbox] = []

    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "never reached"}]

    def tools(self) -> list[str | dict[str, Any]]:
        return []

    async def setup(self, sandbox: Sandbox) -> None:
        self.seen.append(sandbox)
        await sandbox.exec("echo setting-up > marker")
        self.entered.set()
        await asyncio.Event().wait()

    async def score(self, sandbox: Sandbox, result: EpisodeResult) -> Any:
        raise AssertionError("not reached")


async def _cancel_in_setup(tmp_path: Path, episode: Any) -> tuple[_BlockingSetupTask, asyncio.Task[Any]]:
    task = _BlockingSetupTask({"instance_id": "cancel-setup"})
    runner = asyncio.ensure_future(episode(task))
    entered = asyncio.ensure_future(task.entered.wait())
    await asyncio.wait({runner, entered}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    assert task.entered.is_set(), f"setup never started: {runner}"
    runner.cancel()
    done, _ = await asyncio.wait({runner}, timeout=CANCEL_BOUND_S)
    assert runner in done, "cancelling during setup hung"
    return task, runner


async def test_cancel_run_episode_during_setup_stops_the_sandbox(tmp_path: Path) -> None:
    # Copies of the task run the episode: the copy's setup still records into our list.
    ws = tmp_path / "ws-episode"
    model: ChatModel = None  # type: ignore[assignment]  # never called: the episode ends in setup
    task, runner = await _cancel_in_setup(
        tmp_path, lambda t: run_episode(t, model, sandbox={"workspace": str(ws)})
    )
    result = runner.result()
    assert result.exit_reason == ExitReason.CANCELLED
    (sb,) = task.seen
    assert sb._stopped and not await sb.alive()
    assert (ws / "marker").exists()
    await _assert_no_process(str(ws))


async def test_cancel_setup_episode_stops_the_sandbox(tmp_path: Path) -> None:
    # The gateway harness calls setup_episode directly: the sandbox it never got must be stopped.
    ws = tmp_path / "ws-setup"
    task, runner = await _cancel_in_setup(tmp_path, lambda t: setup_episode(t, {"workspace": str(ws)}, {}))
    assert runner.cancelled()
    (sb,) = task.seen
    assert sb._stopped and not await sb.alive()
    await _assert_no_process(str(ws))


async def test_cancelled_host_start_ends_promptly_and_leaks_no_shell(tmp_path: Path) -> None:
    # The host backend's start spawns its first shell session: a cancel mid-spawn must not
    # hang either, nor leave that shell (a child of this process) running.
    before = set(procs.children(os.getpid()))
    for i, point in enumerate(CANCEL_POINTS):
        cfg = {"workdir": str(tmp_path / f"host-{i}"), "start_retries": 0}
        sb = sandbox.create({"type": "host", "i_understand_there_is_no_isolation": True, **cfg})
        start = asyncio.ensure_future(sb.start())
        await _cancel_after(start, point)
        done, _ = await asyncio.wait({start}, timeout=CANCEL_BOUND_S)
        assert start in done, f"cancelling the host start at {point} hung for over {CANCEL_BOUND_S}s"
        if not start.cancelled():
            start.result()
            await sb.stop()
    deadline = time.monotonic() + 3
    while set(procs.children(os.getpid())) - before and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    left = [p for p in set(procs.children(os.getpid())) - before if procs.alive(p)]
    assert not left, f"shells left behind: {[procs.cmdline(p)[-1:] for p in left]}"


NO_CGROUP = {"limits": {"memory_mb": None, "pids": None}}
"""No per-sandbox cgroup: its kill-all on stop used to hide a bwrap child left behind."""


async def test_cancelled_start_without_cgroup_leaks_nothing(tmp_path: Path) -> None:
    # bwrap's sandbox child waits on an eventfd until bwrap has set it up: a bwrap killed in
    # that window (a cancelled start) left the child blocked forever, reparented to init.
    for i in range(24):
        ws = tmp_path / f"ws-nocg-{i}"
        sb = sandbox.create({"workspace": str(ws), "start_retries": 0, **NO_CGROUP})
        start = asyncio.ensure_future(sb.start())
        await asyncio.sleep(0.0015 * i)
        start.cancel()
        done, _ = await asyncio.wait({start}, timeout=CANCEL_BOUND_S)
        assert start in done, f"cancelling the start after {0.0015 * i:.4f}s hung"
        if not start.cancelled():
            start.result()
            await sb.stop()
        await _assert_no_process(str(ws))


_CONTROLLER = """
import asyncio, sys
from uniagent import sandbox

async def main():
    cfg = {"workspace": sys.argv[1], "start_retries": 0, "limits": {"memory_mb": None, "pids": None}}
    await sandbox.create(cfg).start()
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def _sandbox_child_in_setup(controller: subprocess.Popen[bytes], ws: str) -> int | None:
    """bwrap's sandbox child, frozen (SIGSTOP) while it builds the sandbox: once its mounts show
    the workspace, before it has started its command (and armed its parent-death signal)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and controller.poll() is None:
        for bwrap in procs.children(controller.pid):
            for child in procs.children(bwrap):
                try:
                    mounts = Path(f"/proc/{child}/mountinfo").read_text()
                except OSError:
                    continue
                if ws in mounts:
                    os.kill(child, signal.SIGSTOP)
                    time.sleep(0.05)
                    if procs.children(child):  # too late: its command already runs
                        os.kill(child, signal.SIGCONT)
                        return None
                    return child
    return None


def test_controller_killed_mid_start_leaves_no_sandbox(tmp_path: Path) -> None:
    # What the kill -9 + --resume test did to one sandbox per CI run: the controller died while
    # bwrap's child was building the sandbox, bwrap died with it, and the child went on to run
    # its command (then `sleep infinity`) forever, reparented to init. Frozen in that window
    # here, so the test does not depend on luck.
    for attempt in range(6):
        ws = str(tmp_path / f"ws-kill9-{attempt}")
        controller = subprocess.Popen([sys.executable, "-c", _CONTROLLER, ws])
        try:
            child = _sandbox_child_in_setup(controller, ws)
        finally:
            controller.kill()
            controller.wait(30)
        if child is None:
            _kill_all_with_arg(ws)
            continue
        time.sleep(0.2)  # bwrap dies by its parent-death signal
        os.kill(child, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while _pids_with_arg(ws) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _pids_with_arg(ws)
        _kill_all_with_arg(ws)
        assert not left, f"the sandbox outlived its controller: {[procs.cmdline(p)[-2:] for p in left]}"
        return
    pytest.fail("never caught bwrap's child while it built the sandbox (6 attempts)")


def _kill_all_with_arg(arg: str) -> None:
    procs.signal_pids(_pids_with_arg(arg), signal.SIGKILL)


def test_cgroups_of_a_killed_controller_are_removed_by_the_next_one() -> None:
    # A controller killed with -9 never removes its sandboxes' cgroups; the owner's pid in their
    # names lets the next process that makes one remove those left empty.
    from uniagent.sandbox import cgroups

    dead = subprocess.Popen(["true"])
    dead.wait()
    v2 = (cgroups.ROOT / "cgroup.controllers").exists()
    base = cgroups._base("" if v2 else "pids")
    made = {}
    for kind, name in (("dead", f"uniagent-{dead.pid}-aaaa"), ("mine", cgroups.cgroup_name("bbbb"))):
        try:
            (base / name).mkdir()
        except OSError as exc:
            require("a cgroup this user may create", False, f"{base}: {exc}")
        made[kind] = base / name
    try:
        removed = cgroups.reap_orphans()
        assert made["dead"] in removed and not made["dead"].exists()
        assert made["mine"].exists() and made["mine"] not in removed
        assert cgroups.owner_pid(made["mine"].name) == os.getpid()
    finally:
        for d in made.values():
            with contextlib.suppress(OSError):
                d.rmdir()
