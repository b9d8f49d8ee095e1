"""Behaviour of the episode path's speed-ups (issue 14, part 2). Not timed: each test checks
what a speed-up must keep true (limits still hold, the same base commit, nothing left behind).
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import needs_bwrap
from uniagent import sandbox
from uniagent.sandbox import bwrap, procs


@needs_bwrap
async def test_local_sandbox_spawns_without_preexec_fn_and_keeps_its_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preexec_fn makes Python fork() its whole address space (page tables copied, the event
    loop blocked until exec); the cgroups, rlimits and nice level are set by an exec'd launcher."""
    seen: list[dict[str, Any]] = []
    real = procs.spawn

    async def spy(*argv: str, **kwargs: Any):  # type: ignore[no-untyped-def]
        seen.append({"argv": argv, **kwargs})
        return await real(*argv, **kwargs)

    monkeypatch.setattr(procs, "spawn", spy)
    cfg = {"workspace": str(tmp_path), "limits": {"open_files": 333, "file_size_mb": 3}}
    async with sandbox.create(cfg) as sb:
        probe = (
            "ulimit -n; grep 'Max file size' /proc/self/limits;"
            " echo ag=$(cat /proc/self/autogroup 2>/dev/null); echo nice=$(nice)"
        )
        res = await sb.exec(probe)
        cgroup = sb._cgroup
        shell = sb._shell_host_pid(sb._sessions["default"])
        members = cgroup.pids() if cgroup is not None else set()
    assert seen and all(s.get("preexec_fn") is None for s in seen), [s.get("preexec_fn") for s in seen]
    lines = res.output.split()
    assert lines[0] == "333" and lines[4] == str(3 << 20), res.output
    fields = dict(line.split("=", 1) for line in res.output.splitlines() if "=" in line)
    assert fields["nice"] == str(bwrap.SANDBOX_NICE), "sandboxes run below the controller's priority"
    # The kernel shows an autogroup only for a task in the root cpu cgroup (an empty file
    # otherwise, e.g. inside a container or the run's shared cpu group): check where shown.
    if fields["ag"]:  # the session's scheduler group too
        assert fields["ag"].split()[-1] == str(bwrap.SANDBOX_NICE), res.output
    ours = Path("/proc/self/autogroup")
    if ours.exists() and ours.read_text().split():  # ... and not the controller's own
        assert ours.read_text().split()[-1] == "0"
    if cgroup is not None and cgroup.applied:  # the shell runs in the sandbox's own cgroup
        assert shell in members, (shell, members)
    assert not any(os.path.exists(d) for d in (cgroup.dirs if cgroup else [])), "cgroups removed"


@pytest.fixture
def ws_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    from uniagent.tasks import workspace

    cache = workspace.WorkspaceCache(tmp_path / "cache")
    (tmp_path / "cache").mkdir()
    monkeypatch.setattr(workspace, "_cache", cache)
    return cache


def _record_commands(sb: Any) -> list[str]:
    commands: list[str] = []
    real_exec = sb.exec

    async def spy(command: str, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        commands.append(command)
        return await real_exec(command, *args, **kwargs)

    sb.exec = spy
    return commands


@needs_bwrap
async def test_workspace_cache_gives_the_same_base_commit_and_no_future(tmp_path: Path, ws_cache) -> None:  # type: ignore[no-untyped-def]
    """The second episode of a task gets a copy of the first one's prepared tree: the same
    base sha, the same files, history still scrubbed, and no git run to prepare it."""
    import json

    from agent_helpers import make_swe_task_file
    from test_task_repos import _repo_with_a_future, _write
    from uniagent.tasks import load_tasks

    row = json.loads(make_swe_task_file(tmp_path).read_text())
    upstream, base, future = _repo_with_a_future(tmp_path)
    row.update(repo_dir=str(upstream), base_commit=base)
    [task] = load_tasks(str(_write(tmp_path / "git.jsonl", row)))
    probe = (
        "git log --all --format=%H; git tag; git branch -a; git stash list; git reflog | wc -l; "
        f"git cat-file -e {future} && echo FUTURE-REACHABLE; cat calc.py; git status --porcelain"
    )
    outputs = []
    for i in range(2):
        async with sandbox.create({"workspace": str(tmp_path / f"ws{i}")}) as sb:
            commands = _record_commands(sb)
            t = copy.copy(task)
            await t.setup(sb)
            assert t.base == base
            # A repository goes into the bind-mounted workdir by a host copy, never as a tarball
            # through the shell; a cache hit runs no command at all.
            assert not any("base64" in c or "tar -x" in c for c in commands), commands
            assert i == 0 or not commands, commands
            outputs.append((await sb.exec(probe)).output)
    assert ws_cache.hits == 1 and len(ws_cache.entries) == 1
    assert outputs[0] == outputs[1], outputs
    assert (
        future not in outputs[1] and "FUTURE-REACHABLE" not in outputs[1] and "v1.0-fixed" not in outputs[1]
    )
    assert outputs[1].split()[0] == base and "return a - b" in outputs[1]


@needs_bwrap
async def test_workspace_cache_snapshot_sha_matches_an_uncached_setup(
    tmp_path: Path, ws_cache, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from uniagent.tasks import load_tasks

    task = load_tasks("builtin:starter", limit=1)[0]
    shas = []
    for env in ("1", "1", "0"):
        monkeypatch.setenv("UNIAGENT_WORKSPACE_CACHE", env)
        async with sandbox.create({}) as sb:
            t = copy.copy(task)
            await t.setup(sb)
            shas.append(t.base)
            assert (await sb.exec("git rev-parse HEAD; git status --porcelain | wc -l")).output.split() == [
                t.base,
                "0",
            ]
            assert (await t.grade_patch(sb, t.gold_patch)).resolved
    assert ws_cache.hits == 1 and shas[0] == shas[1] == shas[2]


def test_workspace_cache_is_removed_at_close_and_a_dead_process_cache_is_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from uniagent.sandbox import procs
    from uniagent.tasks import workspace

    # The sweep runs once per process and prefix: in a private temp dir, as a fresh process would.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(procs, "_swept", set())
    dead = Path(tempfile.gettempdir()) / f"{workspace.PREFIX}999999999-x"
    dead.mkdir(exist_ok=True)
    cache = workspace.WorkspaceCache()
    assert cache.root.is_dir() and not dead.exists()
    cache.close()
    assert not cache.root.exists()


@needs_bwrap
def test_runner_stores_off_the_event_loop_and_waits_on_pidfds(
    tmp_path: Path, codec, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Serialising and committing a finished episode and the end-of-episode drift check (a full
    render and tokenization) run in worker threads, not on the event loop; subprocesses are
    waited for with pidfds, not one waitpid thread each."""
    import asyncio
    import sys
    import threading

    from run_helpers import write_replay
    from uniagent.runner import RunStore, build_config
    from uniagent.runner.pidfd import LoopPidfdWatcher
    from uniagent.runner.run import Runner
    from uniagent.tasks import load_tasks
    from uniagent.tokens import ChatCodec

    tasks = load_tasks("builtin:starter")[:3]
    replay = write_replay(tmp_path / "replay.jsonl", codec, tasks)
    ids = ",".join(t.instance_id for t in tasks)
    cfg = build_config(
        None,
        [f"model.spec=replay:{replay}", f"tasks.ids=[{ids}]", f"runner.output={tmp_path / 'run'}"],
    )
    threads: list[str] = []
    real_put = RunStore.put

    def put(self: RunStore, row: dict[str, Any]) -> None:
        threads.append(threading.current_thread().name)
        real_put(self, row)

    monkeypatch.setattr(RunStore, "put", put)
    drift_threads: list[str] = []
    real_drift = ChatCodec.drift

    def drift(self: ChatCodec, *args: Any, **kwargs: Any) -> int | None:
        drift_threads.append(threading.current_thread().name)
        return real_drift(self, *args, **kwargs)

    monkeypatch.setattr(ChatCodec, "drift", drift)
    before = asyncio.get_child_watcher() if sys.version_info < (3, 12) else None
    try:
        summary = asyncio.run(Runner(cfg).run())
        if sys.version_info < (3, 12) and hasattr(os, "pidfd_open"):
            assert isinstance(asyncio.get_child_watcher(), LoopPidfdWatcher)
    finally:
        if before is not None:
            asyncio.set_child_watcher(before)
    assert summary["episodes"] == 3 and summary["resolved"] == 3
    assert len(threads) == 3 and "MainThread" not in threads, threads
    assert len(drift_threads) == 3 and "MainThread" not in drift_threads, drift_threads


def test_sandbox_starts_are_bounded_at_16_by_default() -> None:
    """4 slots queued a thousand episodes behind each other for minutes; a local start is cheap."""
    from uniagent.runner.config import RunnerConfig

    assert RunnerConfig().sandbox_start_concurrency == 16


@needs_bwrap
async def test_local_sandbox_removes_its_dirs_with_rm(monkeypatch: pytest.MonkeyPatch) -> None:
    """shutil.rmtree walks every file in Python holding the GIL; stop runs `rm -rf` instead."""
    import shutil

    spawned: list[tuple[str, ...]] = []
    real = procs.spawn

    async def spy(*argv: str, **kwargs: Any):  # type: ignore[no-untyped-def]
        spawned.append(argv)
        return await real(*argv, **kwargs)

    def no_rmtree(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("shutil.rmtree called")

    monkeypatch.setattr(procs, "spawn", spy)
    async with sandbox.create({}) as sb:
        await sb.exec("mkdir -p a/b && touch a/b/c && chmod 500 a/b")
        ws, ctl = sb.workspace, sb._ctl
        monkeypatch.setattr(shutil, "rmtree", no_rmtree)
    assert ws is not None and ctl is not None and not ws.exists() and not ctl.exists()
    rms = [a for a in spawned if a[0] == "rm"]
    assert len(rms) == 1, spawned  # one child for both (a spawn costs the controller ~1 ms of CPU)
    assert list(rms[0][rms[0].index("--") + 1 :]) == [str(ctl), str(ws)], spawned


@needs_bwrap
async def test_local_upload_of_a_tree_is_a_cp_child_with_the_same_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Modes and mtimes kept, links copied as links, into an existing workdir (merged), by a
    `cp` child process instead of shutil.copytree's Python loop."""
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg" / "run.sh").write_text("#!/bin/sh\necho ok\n")
    (src / "pkg" / "run.sh").chmod(0o750)
    (src / "pkg" / "sub" / "data.txt").write_text("data")
    os.utime(src / "pkg" / "sub" / "data.txt", (1_000_000_000, 1_000_000_000))
    (src / "link").symlink_to("pkg/sub/data.txt")
    spawned: list[str] = []
    real = procs.spawn

    async def spy(*argv: str, **kwargs: Any):  # type: ignore[no-untyped-def]
        spawned.append(os.path.basename(argv[0]))
        return await real(*argv, **kwargs)

    monkeypatch.setattr(procs, "spawn", spy)
    async with sandbox.create({"workspace": str(tmp_path / "ws")}) as sb:
        await sb.exec("echo kept > already.txt")
        await sb.upload(src, sb.workdir)
        res = await sb.exec("stat -c '%a %Y' pkg/run.sh pkg/sub/data.txt; readlink link; cat link *.txt")
        ws = sb.workspace
    assert "cp" in spawned
    lines = res.output.split("\n")
    assert lines[0].split()[0] == "750" and lines[1] == "644 1000000000", res.output
    assert lines[2:4] == ["pkg/sub/data.txt", "datakept"], res.output
    assert ws is not None and (tmp_path / "ws" / "link").is_symlink()


@pytest.mark.skipif(
    sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"), reason="3.11 pidfd watcher only"
)
def test_pidfd_watcher_takes_the_exit_code_from_popen_when_popen_reaped_it() -> None:
    """asyncio's transport.close() polls its Popen, which reaps an exited child before the watcher
    sees it: the exit code is the Popen's, not 255 with a warning on the CLI's stderr.

    Runs in a fresh interpreter: a thread or signal handler left by another test in this process
    may reap the child first, and then the Popen itself reads no exit code."""
    import subprocess

    script = """
import asyncio, logging, os, warnings
from uniagent.runner.pidfd import LoopPidfdWatcher
logging.basicConfig(level=logging.WARNING)

async def main():
    # The child exits only when told: one that exits while the subprocess is being set up is
    # reaped by the watcher (the loop runs then), and the case below never arises.
    r, w = os.pipe()
    proc = await asyncio.create_subprocess_exec("sh", "-c", "read x; exit 3", stdin=r)
    os.close(r)
    os.write(w, b"go\\n")
    os.close(w)
    # block the loop (the watcher cannot run) until the child has exited, leaving it unreaped
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    assert proc._transport._proc.poll() == 3  # the Popen reaps it
    return await proc.wait()

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    asyncio.set_child_watcher(LoopPidfdWatcher())
print(asyncio.run(main()))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"
    assert "already read" not in out.stderr
