"""Children started off the event loop's thread (sandbox/child.py) behave like asyncio's."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time

import pytest

from uniagent.sandbox import procs

PIPE = asyncio.subprocess.PIPE


def test_the_fork_and_exec_run_off_the_loop_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vfork waits until the child has exec'd: on a loaded machine seconds, which on the
    loop's thread stalled every episode (bench/runner.py's stall probe, 1,000 episodes)."""
    threads: list[threading.Thread] = []
    real = subprocess.Popen

    def recording(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        threads.append(threading.current_thread())
        return real(*args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(subprocess, "Popen", recording)

    async def go() -> int:
        proc = await procs.spawn("true", stdout=PIPE)
        return await proc.wait()

    assert asyncio.run(go()) == 0
    assert threads and all(t is not threading.main_thread() for t in threads)


def test_streams_exit_codes_and_communicate() -> None:
    async def go() -> None:
        cat = await procs.spawn("cat", stdin=PIPE, stdout=PIPE)
        assert cat.stdin is not None and cat.stdout is not None
        cat.stdin.write(b"line\n")
        await cat.stdin.drain()
        assert await cat.stdout.readline() == b"line\n"
        assert await cat.communicate(b"rest") == (b"rest", None)
        assert cat.returncode == 0
        sh = await procs.spawn("sh", "-c", "echo out; echo err >&2; exit 3", stdout=PIPE, stderr=PIPE)
        assert await sh.communicate() == (b"out\n", b"err\n")
        assert await sh.wait() == 3 and sh.returncode == 3

    asyncio.run(go())


def test_kill_and_wait_report_the_signal_and_a_cancelled_waiter_leaves_the_watch() -> None:
    async def go() -> None:
        proc = await procs.spawn("sleep", "30", stdin=PIPE, stdout=PIPE)
        waiter = asyncio.create_task(proc.wait())
        await asyncio.sleep(0.05)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        await procs.kill_process_tree(proc, 5)
        assert proc.returncode == -9 and await proc.wait() == -9
        with pytest.raises(ProcessLookupError):
            proc.kill()

    asyncio.run(go())


def test_a_start_cancelled_halfway_leaves_no_process() -> None:
    async def go() -> list[int]:
        pids: list[int] = []
        real = subprocess.Popen

        def record(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
            p = real(*args, **kwargs)  # type: ignore[call-overload]
            pids.append(p.pid)
            return p  # type: ignore[no-any-return]

        subprocess.Popen = record  # type: ignore[misc]
        try:
            task = asyncio.create_task(procs.spawn("sleep", "30", stdin=PIPE, stdout=PIPE))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            subprocess.Popen = real  # type: ignore[misc]
        return pids

    pids = asyncio.run(go())
    assert len(pids) == 1
    assert procs.state(pids[0]) is None  # killed and reaped


def test_many_spawns_at_once_all_exit() -> None:
    async def go() -> list[int]:
        children = await asyncio.gather(*[procs.spawn("sh", "-c", f"exit {i % 3}") for i in range(60)])
        return list(await asyncio.gather(*[c.wait() for c in children]))

    assert asyncio.run(go()) == [i % 3 for i in range(60)]


def test_a_cancelled_run_to_end_kills_its_child_and_what_it_forked() -> None:
    """A host helper (the `cp` that fills a workspace) cancelled with its episode must not go on
    writing into the directories the stop removes: that left a workspace behind after SIGTERM."""

    async def go() -> list[int]:
        run = asyncio.ensure_future(procs.run_to_end("sh", "-c", "sleep 3301 & sleep 3302; wait"))
        pids: list[int] = []
        for _ in range(1500):
            pids = procs.pids_with_arg("3301") + procs.pids_with_arg("3302")
            if len(pids) == 2:
                break
            await asyncio.sleep(0.02)
        assert len(pids) == 2, "the child never started"
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        return pids

    pids = asyncio.run(go())
    deadline = time.monotonic() + 10  # SIGKILL is sent, not yet done: a loaded machine takes a moment
    while [p for p in pids if procs.alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if procs.alive(p)]
    assert asyncio.run(_run_true()) == 0


async def _run_true() -> int:
    return await procs.run_to_end("true")
