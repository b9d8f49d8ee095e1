"""What the CPU verl end-to-end tests share: run a recipe (or a command) as a user would, in a
subprocess with the CPU plugin and the probe loaded, and read back what verl and the rollout server
report: verl's console step metrics (`parse_steps`), its file logger (`read_metrics`), the
`uniagent_local` server's event log (`events_override`, `RecipeRun.events_of`), and the run's peak
memory summed over its processes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
ROOT = TESTS.parent
PLUGIN = "uniagent.integrations.verl.cpu"
RUN_TOKEN = "UNIAGENT_VERL_CPU_RUN"


def cpu_env(*modules: str) -> dict[str, str]:
    path = os.pathsep.join([str(SRC), str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])
    """The environment of a CPU verl process: our sources and tests on the path, the CPU plugin (and
    `modules` after it) loaded by verl's hook, the CPU platform."""
    return {
        **os.environ,
        "PYTHONPATH": path,
        "VERL_USE_EXTERNAL_MODULES": ",".join([PLUGIN, *modules]),
        "VERL_PLATFORM": "cpu",
    }


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?|nan|inf")


def parse_steps(text: str) -> dict[int, dict[str, float]]:
    """verl's console logger lines `step:N - key:value - ...` (values may read `np.float64(0.1)`)."""
    steps: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        match = re.search(r"step:(\d+) - (.*)$", line)
        if not match:
            continue
        metrics: dict[str, float] = {}
        for item in match.group(2).split(" - "):
            key, _, value = item.partition(":")
            number = _NUMBER.search(value.split("(")[-1])
            if number:
                metrics[key.strip()] = float(number.group(0))
        steps[int(match.group(1))] = metrics
    return steps


class _RssSampler:
    """Peak memory of every process carrying this run's token (driver, Ray, workers, servers), summed:
    RSS (shared pages counted in each process) and PSS (shared pages split among their users)."""

    def __init__(self, token: str) -> None:
        self.token = f"{RUN_TOKEN}={token}".encode()
        self.peak_bytes = 0
        self.peak_pss_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def pids(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if self.token in (entry / "environ").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(1.0):
            rss = pss = 0
            for pid in self.pids():
                try:
                    rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().split("\n")
                    pss += next(int(line.split()[1]) for line in rollup if line.startswith("Pss:")) * 1024
                except (OSError, IndexError, ValueError, StopIteration):
                    continue
            self.peak_bytes = max(self.peak_bytes, rss)
            self.peak_pss_bytes = max(self.peak_pss_bytes, pss)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class RecipeRun:
    """One verl recipe run to its end in a subprocess, as a user would launch it (see `run_command`)."""

    def __init__(
        self, returncode: int, log: str, wall_s: float, rss: _RssSampler, events: list[dict]
    ) -> None:
        self.returncode, self.log, self.wall_s, self.events = returncode, log, wall_s, events
        self.peak_rss_gib = round(rss.peak_bytes / 2**30, 2)
        self.peak_pss_gib = round(rss.peak_pss_bytes / 2**30, 2)

    def events_of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]


def events_override(tmp_path: Path) -> str:
    """The verl override that makes the rollout server log its events under `tmp_path`."""
    return f"+actor_rollout_ref.rollout.custom={{uniagent_local_events:{tmp_path / 'rollout_events.jsonl'}}}"


def run_recipe(tmp_path: Path, recipe: str, overrides: list[str], timeout: int = 1200) -> RecipeRun:
    """Prepare the lookup data and run `recipe`'s command (data, checkpoints and the rollout server's
    event log under `tmp_path`) with the CPU plugin and the probe loaded (`run_command`)."""
    from uniagent.integrations.verl.data import prepare
    from uniagent.integrations.verl.launch import build_command

    data = tmp_path / "data"
    prepare("builtin:lookup", data, val_size=0)
    command = build_command(
        recipe,
        [
            f"data_dir@={data}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            events_override(tmp_path),
            *overrides,
        ],
    )
    env = {**cpu_env("verl_cpu_probe"), "OMP_NUM_THREADS": "2"}
    env["VERL_FILE_LOGGER_PATH"] = str(tmp_path / "metrics.jsonl")  # used where trainer.logger has "file"
    return run_command(tmp_path, command, env, recipe, timeout)


def run_command(
    tmp_path: Path, command: list[str], env: dict[str, str], name: str, timeout: int
) -> RecipeRun:
    """Run `command` in `tmp_path` to its end, sampling the summed memory of every process of the run
    (they carry a token in their environment) until Ray's have ended; the server's events read back."""
    from uniagent.train.outputs import release_memory

    release_memory()  # what earlier tests of this process freed goes back before ~11 GB launch beside it
    events = tmp_path / "rollout_events.jsonl"
    token = secrets.token_hex(6)
    env = {**env, RUN_TOKEN: token, "RAY_DEDUP_LOGS": "0"}
    log_path = tmp_path / f"{name}.log"
    start = time.monotonic()
    with _RssSampler(token) as rss, log_path.open("w") as log:
        before = memory_line()
        proc = subprocess.run(
            command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
        )
    wall = time.monotonic() - start
    deadline = time.monotonic() + 60  # Ray's processes end with the driver; wait for them here
    while rss.pids() and time.monotonic() < deadline:
        time.sleep(1)
    # a process that outlived its driver (a trainer worker holds several GB) would be charged to the
    # next run and can push the node over Ray's memory threshold there: end it, and say so
    leftovers = rss.pids()
    for pid in leftovers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    # on stdout, not in the run's log (whose last line the tests read): pytest shows it on a failure
    print(f"[test harness] {name}: before the run {before}; exit {proc.returncode} after {wall:.0f} s")
    if leftovers:
        print(f"[test harness] {name}: killed {len(leftovers)} process(es) left after the run: {leftovers}")
    lines = events.read_text().splitlines() if events.exists() else []
    return RecipeRun(
        proc.returncode, log_path.read_text(errors="replace"), wall, rss, [json.loads(x) for x in lines]
    )


def memory_line(top: int = 5) -> str:
    """The node's used memory (as Ray's monitor counts it: total less available) and its largest
    processes, so that a run killed for memory says who else held it."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = {key: int(value.split()[0]) for key, value in info.items() if key in ("MemTotal", "MemAvailable")}
    sizes = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                rss = int((entry / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                sizes.append((rss, entry.name, (entry / "comm").read_text().strip()))
            except (OSError, IndexError, ValueError):
                continue
    largest = ", ".join(
        f"{name}[{pid}] {rss / 2**30:.2f} GiB" for rss, pid, name in sorted(sizes)[-top:][::-1]
    )
    used = (kib["MemTotal"] - kib["MemAvailable"]) / 2**20
    return f"{used:.2f} of {kib['MemTotal'] / 2**20:.2f} GiB used; largest: {largest}"


def read_metrics(path: Path) -> list[dict]:
    """verl's file logger (`trainer.logger=[...,file]`): one `{"step": N, "data": {...}}` per log call."""
    from uniagent.train.outputs import read_metrics as read_rows

    return read_rows(path) if path.exists() else []
