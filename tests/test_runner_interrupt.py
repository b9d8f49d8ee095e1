"""`uniagent run` stopped by SIGTERM (a cluster's preemption) or SIGINT (Ctrl-C), mid-run: real CLI
processes, real bubblewrap sandboxes, scripted model turns (the ReplayEngine).

A stop must leave nothing of its sandboxes on the host (processes, control dirs, workspaces,
cgroups), store the episodes it cut short as interrupted, print the exact command that resumes the
run, and exit 128 + the signal; that command then finishes the run with every pair stored once.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import leftovers
from agent_helpers import call
from conftest import needs_bwrap
from run_helpers import replay_run_args, write_replay
from uniagent.runner import RunStore
from uniagent.sandbox import cgroups, procs
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

pytestmark = needs_bwrap
CLI = [sys.executable, "-m", "uniagent.cli"]
SAMPLES = 2
NOTHING = {"dirs": [], "cgroups": [], "processes": []}


def _processes_with(text: str) -> list[int]:
    """Live processes whose argv has an argument containing `text`."""
    return [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and any(text in a for a in procs.cmdline(int(p))) and procs.alive(int(p))
    ]


def _stored(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM episodes").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def _left_behind(pid: int, session: str, mark: str) -> dict[str, list[str]]:
    """What the run `pid` left on this machine: its sandboxes' control dirs and workspaces under
    the temp dir, its sandbox cgroups (not reaped first: a later run's sweep is no excuse), and
    processes (its session marker, or the scripted command's marker argument)."""
    tmp = Path(tempfile.gettempdir())
    dirs = [str(d) for prefix in ("uniagent-ctl-", "uniagent-ws-") for d in tmp.glob(f"{prefix}{pid}-*")]
    groups = [g for g in leftovers.sandbox_cgroups() if cgroups.owner_pid(Path(g).name) == pid]
    found = set(leftovers.leftover_processes(session, me=pid)) | set(_processes_with(mark))
    return {"dirs": dirs, "cgroups": groups, "processes": [leftovers.describe(p) for p in sorted(found)]}


def _interrupt_mid_run(tmp_path: Path, codec: ChatCodec, sig: signal.Signals, tasks: int = 3):
    """Start a run of `tasks` x SAMPLES episodes (each first sleeps in its sandbox), send `sig` once
    an episode is stored and another one's command runs; (process, output, args, pairs, mark)."""
    chosen = load_tasks("builtin:starter")[:tasks]
    mark = f"uniagent-stop-test-{secrets.token_hex(4)}"
    slow = call("bash", command=f"sh -c 'sleep 3; echo slept' {mark}")
    replay = write_replay(tmp_path / "replay.jsonl", codec, chosen, samples=SAMPLES, first=[slow])
    out = tmp_path / "run"
    args = replay_run_args(replay, out, [t.instance_id for t in chosen], samples=SAMPLES)
    session = f"stop-{secrets.token_hex(4)}"
    env = {**os.environ, leftovers.MARKER: session}
    proc = subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path
    )
    db = out / "run.db"
    try:
        while not (_stored(db) >= 1 and _processes_with(mark)):  # mid-run: one stored, one running
            assert proc.poll() is None, proc.stdout.read()[-3000:] if proc.stdout else ""
            time.sleep(0.05)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    pairs = sorted((t.instance_id, s) for t in chosen for s in range(SAMPLES))
    return proc, output, session, mark, out, pairs


def _resume_command(output: str) -> str:
    found = re.findall(r"^resume with: (.+)$", output, re.MULTILINE)
    assert len(found) == 1, f"no single resume command in the output:\n{output[-3000:]}"
    return found[0]


def test_sigterm_mid_run_cleans_up_stores_interrupted_and_resumes(tmp_path: Path, codec: ChatCodec) -> None:
    proc, output, session, mark, out, pairs = _interrupt_mid_run(tmp_path, codec, signal.SIGTERM)
    assert proc.returncode == 143, output[-3000:]
    assert _left_behind(proc.pid, session, mark) == NOTHING, output[-3000:]
    assert "interrupted by SIGTERM" in output, output[-3000:]

    store = RunStore(out / "run.db", readonly=True)
    before = {(r["instance_id"], r["sample"]): r for r in store.rows(full=False)}
    store.close()
    interrupted = {k for k, r in before.items() if r["exit_reason"] == "cancelled"}
    finished = {k for k, r in before.items() if r["exit_reason"] == "finished"}
    assert interrupted and finished and interrupted | finished == set(before), before
    assert len(before) < len(pairs), "the stop started no new episode"
    assert all("interrupted by SIGTERM" in (before[k]["error"] or "") for k in interrupted)

    # The printed command, as printed (a shell line from anywhere: it changes to the run's cwd).
    command = _resume_command(output)
    again = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=300, cwd="/", env=dict(os.environ)
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    store = RunStore(out / "run.db", readonly=True)
    rows = list(store.rows(full=False))
    store.close()
    assert sorted((r["instance_id"], r["sample"]) for r in rows) == pairs, "every pair stored once"
    assert all(r["exit_reason"] == "finished" and r["resolved"] for r in rows)
    attempts = {(r["instance_id"], r["sample"]): r["attempts"] for r in rows}
    assert all(attempts[k] == 2 for k in interrupted), "the interrupted episodes were run again"
    assert all(attempts[k] == 1 for k in finished), "finished episodes were not run again"


def test_sigint_mid_run_exits_130_and_leaves_nothing(tmp_path: Path, codec: ChatCodec) -> None:
    proc, output, session, mark, out, _ = _interrupt_mid_run(tmp_path, codec, signal.SIGINT, tasks=2)
    assert proc.returncode == 130, output[-3000:]
    assert _left_behind(proc.pid, session, mark) == NOTHING, output[-3000:]
    command = _resume_command(output)
    assert command.endswith("--resume") and str(out.name) in command
    assert "Traceback" not in output, output[-3000:]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/x/uniagent", "run", "--output", "my run"], "cd /w && /x/uniagent run --output 'my run' --resume"),
        (["/x/uniagent", "train", "--resume"], "cd /w && /x/uniagent train --resume"),
    ],
)
def test_resume_command_is_the_invocation_plus_resume(argv: list[str], expected: str) -> None:
    from uniagent.runner.interrupt import resume_command

    assert resume_command(argv, cwd="/w") == expected


_STOPPER = r"""
import asyncio, sys
from uniagent import sandbox
from uniagent.errors import RunInterruptedError
from uniagent.runner.interrupt import Stopper

mode, mark = sys.argv[1:3]


async def busy(sb):
    await sb.exec(f"sh -c 'sleep 600' {mark}", timeout=900)


async def work():
    sb = sandbox.create({"start_retries": 0})
    await sb.start()
    left_alone = asyncio.ensure_future(busy(sb))  # a task the work never waits for (nor stops)
    await asyncio.sleep(0.5)
    print("ready", flush=True)
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        if mode == "hang":
            print("stopping", flush=True)
            await asyncio.sleep(3600)  # a stop that never ends: only a second signal ends it
        raise


try:
    asyncio.run(Stopper(lambda signum: f"stopped by {signum}").run(work()))
except RunInterruptedError as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_status)
"""


@pytest.mark.parametrize("mode", ["hang", "orphan"])
def test_stopper_tears_down_what_the_work_left_and_a_second_signal_forces(tmp_path: Path, mode: str) -> None:
    """`hang`: the work's own stop never ends; the second SIGTERM forces the exit (143) and still
    tears its sandbox down. `orphan` (the trainer's case): the work stops at once but a task it
    never waited for still holds a sandbox running a command; the clean stop tears that down too."""
    mark = f"uniagent-stopper-test-{secrets.token_hex(4)}"
    session = f"stopper-{secrets.token_hex(4)}"
    proc = subprocess.Popen(
        [sys.executable, "-c", _STOPPER, mode, mark],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, leftovers.MARKER: session},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.stderr
        assert _processes_with(mark), "the sandbox's command did not start"
        proc.send_signal(signal.SIGTERM)
        if mode == "hang":
            assert proc.stdout.readline().strip() == "stopping"
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-3000:]
    assert f"stopped by {signal.SIGTERM.value}" in err
    assert ("forced by a second SIGTERM" in err) == (mode == "hang"), err[-3000:]
    assert _left_behind(proc.pid, session, mark) == NOTHING, err[-3000:]


def test_an_interrupted_row_is_never_done_whatever_retry_failed_says(tmp_path: Path) -> None:
    from uniagent.runner.store import episode_row

    store = RunStore(tmp_path / "run.db")
    for iid, reason in (("a", "cancelled"), ("b", "sandbox_dead"), ("c", "finished")):
        store.put(episode_row(iid, 0, {"exit_reason": reason, "metrics": {}, "reward": None}))
    assert store.done_pairs(include_untrainable_failures=True) == {("b", 0), ("c", 0)}
    assert store.done_pairs(include_untrainable_failures=False) == {("c", 0)}
    store.close()
