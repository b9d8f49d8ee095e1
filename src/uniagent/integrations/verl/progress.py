"""One plain progress line per verl training step, for a CI log: followed from verl's metrics file.

verl's console logger prints every metric of a step on one long line, and its progress bar is tqdm
(carriage returns, meant for a TTY). `uniagent train --engine verl` has verl's file logger write
the step rows to `trainer.output/metrics.jsonl` (`launch.py`), and while verl runs the launching
process follows that file (`MetricsFollower`) and prints, per trained step, one short line:

    [uniagent] step 3/20 | reward 0.312 | resolved 0.250 | 118.2 s/step | 412 tok/s | exits finished=14

(`tok/s`: verl's `perf/throughput`, the step's tokens per second per GPU; exits: the
`uniagent/exit/*` counts of the trained batch). A row is trained when it carries
`training/global_step` (both of verl's trainers log it with the step's metrics); the other rows of
a step (the fully-async trainer's timings, validation) are merged into it but print nothing. The
follower reads only complete lines (verl writes a row with one unbuffered write, but a read can
land mid-row), and starts over when the file is shorter than what it read (a new run truncated it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniagent.train.verl_rows import exit_counts, is_verl_row, page_row

TRAINED = "training/global_step"
POLL_S = 2.0


def _fmt(value: Any, spec: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return format(value, spec)


def progress_line(step: int, data: dict[str, Any], total: int | None) -> str:
    """The line for one trained step (module docstring); a figure the step lacks is left out."""
    row = page_row(step, data)
    parts = [f"step {step}/{total if total else '?'}"]
    for label, key, spec, unit in (
        ("reward", "reward_mean", ".3f", ""),
        ("resolved", "resolved_rate", ".3f", ""),
        ("", "step_s", ".1f", " s/step"),
        ("", "train_tokens_per_s", ".0f", " tok/s"),
    ):
        text = _fmt(row.get(key), spec)
        if text is not None:
            parts.append(f"{label} {text}{unit}".strip())
    exits = exit_counts(data)
    if exits:
        parts.append("exits " + " ".join(f"{reason}={n}" for reason, n in exits.items()))
    return "[uniagent] " + " | ".join(parts)


class MetricsFollower:
    """Reads what verl appended to its metrics file since the last `poll` and returns the progress
    lines of the steps it completed (each step once)."""

    def __init__(self, path: Path, total_steps: int | None) -> None:
        self.path = path
        self.total = total_steps
        self.offset = 0
        self.partial = b""
        self.steps: dict[int, dict[str, Any]] = {}
        self.printed: set[int] = set()

    def poll(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # truncated: a new run's file
            self.offset, self.partial, self.steps, self.printed = 0, b"", {}, set()
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        out = []
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not is_verl_row(row):
                continue
            step = int(row["step"])
            self.steps.setdefault(step, {}).update(row["data"])
            if TRAINED in row["data"] and step not in self.printed:
                self.printed.add(step)
                out.append(progress_line(step, self.steps[step], self.total))
        return out


def follow(
    path: Path,
    total_steps: int | None,
    done: threading.Event,
    emit: Callable[[str], None] = lambda line: print(line, flush=True),
    interval_s: float = POLL_S,
) -> None:
    """Emit the progress lines of `path` until `done` is set, then read it a last time."""
    follower = MetricsFollower(path, total_steps)
    while not done.wait(interval_s):
        for line in follower.poll():
            emit(line)
    for line in follower.poll():
        emit(line)
