"""The process bench/runner.py measures: `uniagent run`'s own code path plus in-process probes.

It builds the run config the way `uniagent run` does (`build_config` from the same flags and
`--set` overrides) and awaits `uniagent.runner.run.Runner(config).run()` -- the CLI's runner
without its progress display -- so what runs is the real runner, store, sandboxes and verifier.
Only the process itself can take these figures, so it takes them and writes one JSON file:

* event-loop lag: a coroutine asks to sleep `LAG_INTERVAL_S` and records how late it woke (from
  the first episode on: start-up is reported apart);
* the CPU and time used before the first episode starts (imports, tokenizer, codec, preflight);
* its own CPU (`getrusage(RUSAGE_SELF)`, all threads) and that of its reaped children;
* CPU spent grading logs in-process (`SweTask._grade`, the swebench parser), timed with
  `time.thread_time` around the call, so the parent can subtract the verifier;
* open fds at the end (after the run returned and closed its store);
* its peak RSS (VmHWM).

Sandbox commands and the tests the verifier runs are other processes (bubblewrap and what it
starts): their CPU is not in RUSAGE_SELF by construction.

    .venv/bin/python bench/runner_child.py SPEC.json    # written by bench/runner.py
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

LAG_INTERVAL_S = 0.05


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


def mark_first_episode(probe: LagProbe) -> dict[str, float]:
    """Wrap the runner's `run_episode` to note the CPU used before the first episode (imports, the
    tokenizer, the codec's template probe, preflight): start-up, reported apart from per-step CPU.
    The lag probe keeps only samples from then on."""
    import uniagent.runner.run  # noqa: F401  (the package's `run` attribute is the function)

    run_module = sys.modules["uniagent.runner.run"]
    mark: dict[str, float] = {}
    original = run_module.run_episode

    async def first(*args: Any, **kwargs: Any) -> Any:
        if not mark:
            me = resource.getrusage(resource.RUSAGE_SELF)
            mark.update(user_s=me.ru_utime, sys_s=me.ru_stime, at_s=time.monotonic())
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
    # The scripted turns carry no prompt hash (observations hold timestamps), so the replay engine
    # would log one "prompt differs" warning per turn: 10,000 lines at the top level, not the work.
    logging.getLogger("uniagent.models.replay").setLevel(logging.ERROR)
    spec = json.loads(Path(spec_path).read_text())
    from uniagent.runner import build_config
    from uniagent.runner.run import Runner

    cfg = build_config(None, spec.get("set", []), spec["flags"])
    grading = time_grading()
    probe = LagProbe()
    startup = mark_first_episode(probe)
    out: dict[str, Any] = {"pid": os.getpid()}

    async def go() -> dict[str, Any]:
        lag_task = asyncio.create_task(probe.run())
        try:
            return await Runner(cfg).run()
        finally:
            lag_task.cancel()

    t0 = time.monotonic()
    try:
        out["summary"] = asyncio.run(go())
        out["ok"] = True
    except Exception as exc:  # reported by the parent as a failed level
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    out["wall_s"] = time.monotonic() - t0
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out.update(
        user_s=me.ru_utime,
        sys_s=me.ru_stime,
        children_user_s=kids.ru_utime,
        children_sys_s=kids.ru_stime,
        maxrss_kb=peak_rss_kb(),
        grade_cpu_s=grading[0],
        startup_user_s=startup.get("user_s", 0.0),
        startup_sys_s=startup.get("sys_s", 0.0),
        startup_wall_s=startup.get("at_s", t0) - t0,
        open_fds=len(os.listdir("/proc/self/fd")) - 1,  # less the one listdir holds
        threads=len(os.listdir("/proc/self/task")),
        lag_s=probe.samples,
    )
    target = Path(spec["result"])
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(target)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
