"""Process-tree helpers over /proc: find a session's shell, signal what it started.

A timeout must stop everything a command started without killing the shell that keeps the
session's cwd and environment, so signals go to the shell's descendants, never its group.

Also the owner-pid convention: what a process leaves on the host (temp dirs, cgroups) carries
its pid in the name, so a later process can remove what one killed with -9 left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import cast

from uniagent.sandbox.child import start_child


def children(pid: int) -> list[int]:
    kids: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return kids
    for task in tasks:
        try:
            kids.extend(int(x) for x in (task / "children").read_text().split())
        except OSError:
            continue
    return kids


def descendants(pid: int) -> list[int]:
    """All descendants, parents before children."""
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children(p))
    return out


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def find_with_arg(root: int, arg: str, program: str | None = None) -> int | None:
    """The first process at or under `root` (breadth first) whose argv contains `arg`.

    With `program`, argv[0] must end with it: launchers (nsenter, env) carry the same
    arguments, and forked subshells below the match share its argv, so the first match
    that runs `program` is the one meant.
    """
    for pid in [root, *descendants(root)]:
        argv = cmdline(pid)
        if arg in argv and (program is None or argv[0].endswith(program)):
            return pid
    return None


def signal_pids(pids: list[int], sig: int) -> int:
    sent = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            sent += 1
    return sent


def signal_descendants(pid: int, sig: int) -> int:
    """Signal every process below `pid` (not `pid` itself). Returns how many were signalled."""
    return signal_pids(descendants(pid), sig)


def alive(pid: int) -> bool:
    return state(pid) not in ("Z", "X", None)


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists (signal 0). One of another user counts as alive: its
    things are not ours to remove. The owner check of every owner-pid name (temp dirs, cgroups)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_of(name: str, prefix: str) -> int | None:
    """The owner pid in `<prefix><pid>-<rest>`, or None for a name not of that form."""
    if not name.startswith(prefix):
        return None
    pid, sep, _ = name[len(prefix) :].partition("-")
    return int(pid) if sep and pid.isdigit() else None


_swept: set[tuple[str, str]] = set()
_sweep_guard = threading.Lock()


def _sweep_dead_owners(prefix: str, parent: Path) -> list[Path]:
    """Remove `<parent>/<prefix><pid>-*` whose owner process is gone (killed with -9, it could not
    clean up). Dirs of live owners (another run on this machine) are kept. Only before this
    process made its own dirs of `prefix` (see `owned_tempdir`): our own pid counts as dead."""
    removed: list[Path] = []
    for d in parent.glob(f"{prefix}*"):
        pid = owner_of(d.name, prefix)
        if pid is None or (pid != os.getpid() and pid_alive(pid)):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def owned_tempdir(prefix: str, parent: Path | None = None) -> Path:
    """`mkdtemp` named `<prefix><our pid>-...` (in `parent`, default the temp dir).

    The first call per (parent, prefix) in a process first sweeps the dirs of dead owners
    (`_sweep_dead_owners`). It runs before this process made any dir of that prefix there, so a
    dir bearing our own pid is a dead process's too (a pid reused, as in a fresh container).
    Blocking (the sweep can remove many trees once): call it from a worker thread in async code.
    """
    where = Path(parent if parent is not None else tempfile.gettempdir())
    key = (str(where.resolve()), prefix)
    with _sweep_guard:
        if key not in _swept:
            _sweep_dead_owners(prefix, where)
            _swept.add(key)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=where))


def tree_signal_script(pid: int, sig: int) -> str:
    """A POSIX sh script that signals all descendants of `pid`, for backends whose processes
    this machine cannot see (containers, remote servers). Needs only /proc and sh builtins."""
    return (
        "kids() { for s in /proc/[0-9]*/status; do while read -r k v; do "
        'if [ "$k" = PPid: ]; then [ "$v" = "$1" ] && p=${s#/proc/} && echo ${p%/status}; break; fi; '
        'done < "$s" 2>/dev/null; done; }; '
        'walk() { for k in $(kids "$1"); do echo "$k"; walk "$k"; done; }; '
        f'for p in $(walk {int(pid)}); do kill -{int(sig)} "$p" 2>/dev/null; done; true'
    )


async def spawn(*argv: str, **kwargs: object) -> asyncio.subprocess.Process:
    """`asyncio.create_subprocess_exec`, with the fork and exec off the event loop's thread
    (sandbox/child.py says why), that a cancellation cannot interrupt halfway.

    A start cancelled halfway would leave a child running or a pipe half connected, so the
    spawn runs shielded; a cancellation waits until the process exists, kills and reaps it,
    then goes on. The `Child` returned offers the `asyncio.subprocess.Process` interface.
    """
    task = asyncio.ensure_future(start_child(*argv, **kwargs))  # type: ignore[arg-type]
    try:
        return cast("asyncio.subprocess.Process", await asyncio.shield(task))
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        if not task.cancelled() and task.exception() is None:
            await kill_process_tree(cast("asyncio.subprocess.Process", task.result()))
        raise


async def run_to_end(*argv: str, **kwargs: object) -> int:
    """`spawn` and wait for the exit status; a cancelled wait kills the child (and what it
    forked) before the cancellation goes on. A host helper left running after its episode was
    stopped (a `cp` filling a workspace) writes into the directories the stop is removing."""
    proc = await spawn(*argv, **kwargs)
    try:
        return await proc.wait()
    except asyncio.CancelledError:
        await kill_process_tree(proc)
        raise


async def kill_process(proc: asyncio.subprocess.Process, wait_s: float = 5.0) -> None:
    """SIGKILL an asyncio child, close our pipe ends and wait (bounded) until it is reaped.

    The pipes are closed first: a grandchild the kill did not reach (bwrap's init before it
    armed its parent-death signal) may hold their other ends, and `wait()` waits for EOF too.
    """
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    transport = getattr(proc, "_transport", None)
    for fd in (0, 1, 2):
        with contextlib.suppress(Exception):
            pipe = transport.get_pipe_transport(fd) if transport is not None else None
            if pipe is not None:
                pipe.close()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.wait_for(proc.wait(), wait_s)
    with contextlib.suppress(Exception):
        transport.close()  # type: ignore[union-attr]


def state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, D, T, Z, ...), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


async def kill_process_tree(proc: asyncio.subprocess.Process, wait_s: float = 5.0) -> None:
    """`kill_process`, after SIGKILLing every descendant of `proc` first (`kill_tree`)."""
    if proc.returncode is None:
        kill_tree(proc.pid)
    await kill_process(proc, wait_s)


def kill_tree(pid: int) -> None:
    """SIGKILL every descendant of `pid`, then `pid`, then what `pid` forked meanwhile.

    Killing only the child is not enough when its children do not die with it. bwrap is the
    case in point: its sandbox child waits on an eventfd until bwrap has set it up, and arms
    its parent-death signal only once the sandbox is built, so a bwrap killed in between
    leaves that child (and what it starts) running forever, reparented to the host's init.

    Nothing is ever stopped (SIGSTOP) here: a controller killed -9 between a stop and the kill
    left its stopped processes stopped forever, out of reach of any parent-death signal or
    lifeline. What keeps a forking process from escaping instead:
    - inside a sandbox everything is in its PID namespace, whose init is bwrap's child: killing
      it makes the kernel kill every process in the namespace, however fast they fork;
    - once `pid` has a SIGKILL pending, no fork of it can complete (the kernel fails the clone),
      so the second listing holds any child it forked after the first one, unless `pid` exited
      (and that child was reparented) in between. The local sandbox's cgroup, or its argv scan
      where it has none (LocalSandbox._stop), catches that last one: bwrap forks only once.
    """
    signal_pids(descendants(pid), signal.SIGKILL)
    signal_pids([pid], signal.SIGKILL)
    signal_pids(descendants(pid), signal.SIGKILL)


def pids_with_arg(arg: str) -> list[int]:
    """Live processes anywhere on this machine (stopped ones too, not zombies) whose argv holds
    `arg`. A scan of all of /proc: for rare paths (a sandbox stopped mid-start), never per step."""
    out: list[int] = []
    for name in os.listdir("/proc"):
        if name.isdigit() and arg in cmdline(int(name)) and alive(int(name)):
            out.append(int(name))
    return out


def quote(s: str) -> str:
    return shlex.quote(s)
