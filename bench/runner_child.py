"""The process bench/runner.py measures: `uniagent run`'s own code path plus in-process probes.

It builds the run config the way `uniagent run` does (`build_config` from the same flags and
`--set` overrides) and awaits `uniagent.runner.run.Runner(config).run()` -- the CLI's runner
without its progress display -- so what runs is the real runner, store, sandboxes and verifier.
Only the process itself can take these figures, so it takes them and writes one JSON file:

* the timed window: from the first episode's start (imports, tokenizer, codec, preflight and the
  verifier's imports done: start-up, reported apart, as the peer's is) to `Runner.run()`'s return;
* CPU at the window's start and end (`rusage`), the peer's read the same way: this process's own
  (RUSAGE_SELF, all threads), that of every descendant it reaped (RUSAGE_CHILDREN), and, in the
  cpuacct cgroup the spec names (`join_cpuacct`), the whole tree's: sandboxes, shells, commands,
  the verifier's test runs;
* event-loop lag: a coroutine asks to sleep `LAG_INTERVAL_S` and records how late it woke (from
  the first episode on);
* with `"stalls": true` in the spec (`bench/runner.py --stalls`), why the loop was late
  (`StallProbe`: the main thread's stacks and scheduler states during each stall over 100 ms).
  Off by default: its heartbeat and watchdog thread cost CPU that would count as the framework's;
* CPU spent grading logs in-process (`SweTask._grade`, the swebench parser), timed with
  `time.thread_time` around the call (reported, not subtracted: the peer grades in-process too);
* open fds at the end (after the run returned and closed its store);
* its peak RSS (VmHWM).

    .venv/bin/python bench/runner_child.py SPEC.json    # written by bench/runner.py
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

from runner_probe import group_cpu_s

STARTED = time.monotonic()  # as near the process's start as a script gets: start-up counts from here
LAG_INTERVAL_S = 0.05
CPU_KEYS = ("self_user_s", "self_sys_s", "children_user_s", "children_sys_s")
_cpuacct: list[Path] = []  # the cpuacct cgroup this process joined (`join_cpuacct`), if any


def join_cpuacct(group: str | None) -> None:
    """Move this process into `group`, a cgroup v1 cpuacct group bench/runner.py made for this run,
    before it starts any process: every descendant is born in it and stays (uniagent moves its
    sandboxes in the cpu, memory and pids hierarchies, never in cpuacct), so the group's usage is
    the whole tree's CPU, orphans and processes killed with their parents included."""
    if group:
        (Path(group) / "cgroup.procs").write_text(str(os.getpid()))
        _cpuacct.append(Path(group))


def rusage() -> dict[str, float | None]:
    """CPU seconds so far of this process (all its threads), of its reaped descendants (a child's
    figure includes whatever it reaped in turn, but a process reparented away from the chain, e.g.
    one whose parent died in the same cgroup kill, is lost to it) and, with `join_cpuacct`, of the
    whole tree (`tree_s`; None without one)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out: dict[str, float | None] = dict(
        zip(CPU_KEYS, (me.ru_utime, me.ru_stime, kids.ru_utime, kids.ru_stime), strict=True)
    )
    out["tree_s"] = group_cpu_s(_cpuacct[0]) if _cpuacct else None
    return out


def warm_imports() -> None:
    """What the verifier imports on its first grade (swebench's grading), imported before the timed
    window on both sides (this runner and the peer), so neither side's first episode pays for it."""
    import swebench.harness.constants
    import swebench.harness.grading
    import swebench.harness.log_parsers
    import swebench.types  # noqa: F401

    import uniagent.tasks.verify  # noqa: F401


class LagProbe:
    """How late the event loop runs a coroutine that asked to sleep `interval` seconds."""

    def __init__(self, interval: float = LAG_INTERVAL_S) -> None:
        self.interval = interval
        self.samples: list[float] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval)
            self.samples.append(max(0.0, loop.time() - t0 - self.interval))


class StallProbe:
    """Why the loop is late: a watchdog thread that, while the loop has not run a heartbeat for
    `threshold` s, samples the main thread every `every` s: its stack (innermost frames), its
    scheduler state (/proc .../stat: R running or runnable, S/D blocked in a syscall) and its
    CPU clock. A stall with the main thread on-CPU is work done inside the loop (fix the code);
    one with it runnable but off-CPU is starvation (fix priorities); S/D is a blocking call."""

    def __init__(self, threshold: float = 0.1, every: float = 0.01) -> None:
        self.threshold, self.every = threshold, every
        self.beat = time.monotonic()
        self.stalls: list[dict[str, Any]] = []
        self.stacks: collections.Counter[str] = collections.Counter()
        self.states: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()

    async def heartbeat(self) -> None:
        while True:
            self.beat = time.monotonic()
            await asyncio.sleep(self.every)

    def start(self) -> None:
        self.main_id = threading.main_thread().ident
        self.main_tid = threading.get_native_id()
        self.clock = time.pthread_getcpuclockid(self.main_id)  # type: ignore[arg-type]
        threading.Thread(target=self._watch, name="stall-probe", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _state(self) -> str:
        try:
            stat = Path(f"/proc/self/task/{self.main_tid}/stat").read_text()
            return stat.rsplit(")", 1)[1].split()[0]
        except OSError:
            return "?"

    def _stack(self) -> str:
        frame = sys._current_frames().get(self.main_id)
        parts = []
        while frame is not None and len(parts) < 8:
            code = frame.f_code
            parts.append(f"{Path(code.co_filename).name}:{code.co_name}")
            frame = frame.f_back
        return " < ".join(parts)

    def _watch(self) -> None:
        current: dict[str, Any] | None = None
        while not self._stop.wait(self.every):
            now = time.monotonic()
            late = now - self.beat > self.threshold
            if late:
                if current is None:
                    current = {"t0": self.beat, "cpu0": time.clock_gettime(self.clock)}
                self.stacks[self._stack()] += 1
                self.states[self._state()] += 1
            elif current is not None:
                cpu = time.clock_gettime(self.clock) - current["cpu0"]
                wall = self.beat - current["t0"]
                self.stalls.append({"wall_s": round(wall, 3), "main_cpu_s": round(cpu, 3)})
                current = None

    def report(self) -> dict[str, Any]:
        walls = sum(s["wall_s"] for s in self.stalls)
        cpus = sum(s["main_cpu_s"] for s in self.stalls)
        return {
            "count": len(self.stalls),
            "wall_s": round(walls, 2),
            "main_cpu_s": round(cpus, 2),
            "states": dict(self.states),
            "top_stacks": self.stacks.most_common(25),
            "longest": sorted(self.stalls, key=lambda s: -s["wall_s"])[:10],
        }


def time_grading() -> list[float]:
    """Wrap `SweTask._grade` (the in-process log parse) to add its thread CPU to a counter."""
    from uniagent.tasks.swe import SweTask

    spent = [0.0]
    original = SweTask._grade

    def timed(self: SweTask, *args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent[0] += time.thread_time() - t0

    SweTask._grade = timed  # type: ignore[method-assign]
    return spent


def mark_first_episode(probe: LagProbe) -> dict[str, Any]:
    """Wrap the episode worker's `run_episode` to note when the first episode starts and the CPU used
    before it (imports, the tokenizer, the codec's template probe, preflight): the timed window's
    start, start-up before it. The lag probe keeps only samples from then on."""
    import uniagent.runner.worker  # noqa: F401  (every episode of a run goes through the worker)

    run_module = sys.modules["uniagent.runner.worker"]
    mark: dict[str, Any] = {}
    original = run_module.run_episode

    async def first(*args: Any, **kwargs: Any) -> Any:
        if not mark:
            mark.update(cpu=rusage(), at=time.monotonic())
            probe.samples.clear()
        return await original(*args, **kwargs)

    run_module.run_episode = first  # type: ignore[assignment]
    return mark


def peak_rss_kb() -> int:
    """This process's peak RSS: VmHWM (ru_maxrss also counts the parent it was forked from)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(spec_path: str) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    spec = json.loads(Path(spec_path).read_text())
    join_cpuacct(spec.get("cpuacct"))
    from uniagent.runner import build_config
    from uniagent.runner.run import Runner

    cfg = build_config(None, spec.get("set", []), spec["flags"])
    warm_imports()
    grading = time_grading()
    probe = LagProbe()
    stalls = StallProbe()
    startup = mark_first_episode(probe)
    out: dict[str, Any] = {"pid": os.getpid()}

    async def go() -> dict[str, Any]:
        lag_task = asyncio.create_task(probe.run())
        beat_task = asyncio.create_task(stalls.heartbeat()) if spec.get("stalls") else None
        if beat_task is not None:
            stalls.start()
        try:
            return await Runner(cfg).run()
        finally:
            stalls.stop()
            lag_task.cancel()
            if beat_task is not None:
                beat_task.cancel()

    try:
        out["summary"] = asyncio.run(go())
        out["ok"] = True
    except Exception as exc:  # reported by the parent as a failed level
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    end, cpu_end = time.monotonic(), rusage()
    # No episode ran in this process (the Ray driver's episodes run in actors): all of it is the window.
    start, cpu_start = startup.get("at", STARTED), startup.get("cpu", dict.fromkeys(CPU_KEYS, 0.0))
    cpu_start.setdefault("tree_s", None)
    out.update(
        window_s=end - start,
        startup_wall_s=start - STARTED,
        cpu_start=cpu_start,
        cpu_end=cpu_end,
        maxrss_kb=peak_rss_kb(),
        grade_cpu_s=grading[0],
        open_fds=len(os.listdir("/proc/self/fd")) - 1,  # less the one listdir holds
        threads=len(os.listdir("/proc/self/task")),
        lag_s=probe.samples,
        stalls=stalls.report(),
    )
    target = Path(spec["result"])
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(target)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
