"""Process-tree helpers over /proc: find a session's shell, signal what it started.

A timeout must stop everything a command started without killing the shell that keeps the
session's cwd and environment, so signals go to the shell's descendants, never its group.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path


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
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


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


def quote(s: str) -> str:
    return shlex.quote(s)
