"""What one bubblewrap `local` sandbox costs a node: processes, memory, fds, start time.

The per-node sandbox budget in docs/scaling.md comes from here. `--n` sandboxes are started at
once (the runner's `sandbox_start_concurrency` bounds starts, here `--starts`), each with its
persistent shell session open (`exec("true")`), then measured idle and again while each runs a
Python process (`--busy`: `python3 -c` importing json/re/subprocess and sleeping, a stand-in for
an agent's command or a small test run):

* ``processes_per_sandbox``: processes below this one (bwrap, the namespace's init, the nsenter'd
  shell and what it runs), divided by `--n`;
* ``pss_mb_per_sandbox`` / ``rss_mb_per_sandbox``: their proportional / resident set size summed
  from /proc/PID/smaps_rollup (PSS shares the host's read-only libraries fairly: the figure a
  node's memory budget adds up), divided by `--n`;
* ``driver_rss_mb_per_sandbox`` and ``driver_fds_per_sandbox``: this process's RSS and open fds
  growth (the runner's side: pipes, asyncio transports, the Sandbox objects);
* ``start_s`` p50/p99 (start + first command) at that concurrency, and ``stop_s`` for all.

One JSON object per line. The machine may be shared: read the figures as indicative.

    .venv/bin/python bench/sandbox_footprint.py [--n 50] [--starts 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from functools import partial
from pathlib import Path
from typing import Any

from common import emit as common_emit
from uniagent.sandbox import create, procs
from uniagent.sandbox.base import Sandbox

BENCH = "sandbox_footprint"
BUSY = "python3 -c 'import json, re, subprocess, time; time.sleep(4)' &"


emit = partial(common_emit, BENCH)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


def memory_kb(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of one process in kB; (0, 0) when it is gone or unreadable."""
    pss = rss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Rss:"):
                rss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return pss, rss


def own_rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def tree(n: int, **context: Any) -> None:
    kids = procs.descendants(os.getpid())
    pss = rss = 0
    for pid in kids:
        p, r = memory_kb(pid)
        pss, rss = pss + p, rss + r
    emit("processes_per_sandbox", round(len(kids) / n, 2), None, n=n, **context)
    emit("pss_mb_per_sandbox", round(pss / n / 1024, 2), "MB", n=n, **context)
    emit("rss_mb_per_sandbox", round(rss / n / 1024, 2), "MB", n=n, **context)


async def run(args: argparse.Namespace) -> None:
    Sandbox.set_start_concurrency(args.starts)
    rss0, fds0 = own_rss_kb(), len(os.listdir("/proc/self/fd"))
    boxes = [create({"type": "local"}) for _ in range(args.n)]
    times: list[float] = []

    async def start(sb: Any) -> None:
        t0 = time.monotonic()
        await sb.start()
        await sb.exec("true")
        times.append(time.monotonic() - t0)

    t0 = time.monotonic()
    try:
        await asyncio.gather(*(start(sb) for sb in boxes))
        emit("start_all_s", round(time.monotonic() - t0, 2), "s", n=args.n, starts=args.starts)
        emit("start_s", {"p50": round(percentile(times, 50), 3), "p99": round(percentile(times, 99), 3)}, "s")
        await asyncio.sleep(1.0)
        tree(args.n, state="idle")
        n = args.n
        emit("driver_rss_mb_per_sandbox", round((own_rss_kb() - rss0) / n / 1024, 3), "MB", n=n)
        emit("driver_fds_per_sandbox", round((len(os.listdir("/proc/self/fd")) - fds0) / n, 2), None, n=n)
        await asyncio.gather(*(sb.exec(BUSY) for sb in boxes))
        await asyncio.sleep(1.5)
        tree(args.n, state="busy", command=BUSY)
    finally:
        t1 = time.monotonic()
        await asyncio.gather(*(sb.stop() for sb in boxes), return_exceptions=True)
        emit("stop_all_s", round(time.monotonic() - t1, 2), "s", n=args.n)
        emit("left_after_stop", len(procs.descendants(os.getpid())), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="sandboxes at once")
    parser.add_argument("--starts", type=int, default=4, help="sandbox starts at once")
    args = parser.parse_args()
    context = {"cpus": os.cpu_count(), "python": platform.python_version()}
    emit("setup", {"n": args.n, "starts": args.starts}, None, **context)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
