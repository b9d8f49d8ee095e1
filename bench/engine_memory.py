"""LocalEngine's memory at concurrency: peak RSS and throughput of `uniagent run` on the starter suite.

Each level runs, as a user would, `uniagent run --tasks builtin:starter --model local --concurrency N
--max-turns 3` (samples raised so that N episodes can run at once: 18 starter tasks) in a child process,
and samples the child's resident memory every `--sample-s`. Figures per level, one JSON line each:
``peak_rss_mb`` (the run's process: the engine lives there), ``wall_s``, ``episodes`` (stored / planned),
``tokens_per_s`` (completion tokens / wall), ``exit_code`` and ``memory_budget`` (the line the engine
logs at start: what it may use and where that figure comes from). A level *completes within the
budget* when the run exits 0 with every planned episode stored, and its peak RSS stays under the
budget plus ``--overhead-mb`` (weights, torch, the runner). Exit status 1 when the highest level does
not (the issue's acceptance: 64 episodes at once complete, nothing killed).

    .venv/bin/python bench/engine_memory.py                      # levels 4, 18, 64 (long on 2 cores)
    .venv/bin/python bench/engine_memory.py --max-tokens 64      # shorter turns, the same shape
    .venv/bin/python bench/engine_memory.py --levels 2 --limit 2 --max-tokens 4   # the smoke test's size
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from common import emit as common_emit

BENCH = "engine_memory"
STARTER_TASKS = 18
UNIAGENT = [sys.executable, "-c", "from uniagent.cli import main; main()"]  # `uniagent`, this interpreter


emit = partial(common_emit, BENCH)


def rss_mb(pid: int) -> float:
    """Resident memory of one process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def command(level: int, args: argparse.Namespace, out: Path) -> list[str]:
    tasks = min(args.limit or STARTER_TASKS, STARTER_TASKS)
    argv = [*UNIAGENT, "run", "--tasks", "builtin:starter", "--model", "local", "--concurrency", str(level)]
    argv += [
        "--max-turns",
        str(args.max_turns),
        "--samples",
        str(math.ceil(level / tasks)),
        "--output",
        str(out),
    ]
    if args.limit:
        argv += ["--limit", str(args.limit)]
    sets = [f"model.max_tokens={args.max_tokens}"] if args.max_tokens else []
    if args.budget_bytes is not None:
        sets.append(f"model.memory_budget_bytes={args.budget_bytes}")
    for item in sets:
        argv += ["--set", item]
    return argv


def run_level(level: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One `uniagent run`, its RSS sampled; the figures of the level."""
    log = out.with_suffix(".log")
    began = time.perf_counter()
    with log.open("w") as stderr:
        child = subprocess.Popen(command(level, args, out), stdout=subprocess.DEVNULL, stderr=stderr)
        peak = 0.0
        while child.poll() is None:
            peak = max(peak, rss_mb(child.pid))
            time.sleep(args.sample_s)
    wall = time.perf_counter() - began
    budget_line = next((x for x in log.read_text().splitlines() if "memory budget" in x), "")
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    budget = _budget_bytes(budget_line)
    within = (
        child.returncode == 0
        and summary.get("episodes", 0) == summary.get("planned", -1) > 0
        and budget is not None
        and peak <= budget / 2**20 + args.overhead_mb
    )
    return {
        "level": level,
        "exit_code": child.returncode,
        "peak_rss_mb": round(peak, 1),
        "wall_s": round(wall, 1),
        "episodes": summary.get("episodes", 0),
        "planned": summary.get("planned"),
        "completion_tokens": summary.get("completion_tokens", 0),
        "tokens_per_s": round(summary.get("completion_tokens", 0) / wall, 2),
        "exit_reasons": summary.get("exit_reasons", {}),
        "memory_budget": budget_line.strip(),
        "budget_mb": round(budget / 2**20, 1) if budget is not None else None,
        "within_budget": within,
    }


def _budget_bytes(line: str) -> int | None:
    """The budget in bytes from the engine's start line (`... memory budget 5.40 GiB (...) ...`)."""
    words = line.split()
    for i, word in enumerate(words[:-1]):
        if word == "budget" and words[i + 1].replace(".", "", 1).isdigit():
            return int(float(words[i + 1]) * 1024**3)
    return None


def report(result: dict[str, Any]) -> None:
    context = {"concurrency": result["level"]}
    emit("peak_rss_mb", result["peak_rss_mb"], "MB", **context, budget_mb=result["budget_mb"])
    emit("tokens_per_s", result["tokens_per_s"], "tokens/s", **context)
    emit("wall_s", result["wall_s"], "s", **context)
    emit("episodes", result["episodes"], "episodes", **context, planned=result["planned"])
    emit("exit_code", result["exit_code"], None, **context, exit_reasons=result["exit_reasons"])
    emit("memory_budget", result["memory_budget"], None, **context)
    emit("within_budget", result["within_budget"], None, **context)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[4, 18, 64], help="concurrency levels")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=None, help="model.max_tokens (default: the run's)")
    parser.add_argument("--limit", type=int, default=None, help="starter tasks used (default: all 18)")
    parser.add_argument("--budget-bytes", type=int, default=None, help="model.memory_budget_bytes")
    parser.add_argument("--overhead-mb", type=float, default=2048.0, help="RSS allowed past the budget")
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--output", type=Path, default=None, help="where the runs go (default: a temp dir)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    root = args.output or Path(tempfile.mkdtemp(prefix="engine-memory-"))
    root.mkdir(parents=True, exist_ok=True)
    emit("machine", {"cpus": os.cpu_count()}, None, output=str(root))
    results = []
    for level in args.levels:
        result = run_level(level, args, root / f"c{level}")
        report(result)
        results.append(result)
    return 0 if results and results[-1]["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
