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

from uniagent.jsonio import write_text_atomic
from uniagent.train.verl_rows import EARLIER, exit_counts, is_verl_row, page_row

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


CHECKPOINT_MARK = "latest_checkpointed_iteration.txt"
"""verl's record of the last saved step in `trainer.default_local_dir`; `resume_mode=auto` loads it."""


def _row_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, TypeError, KeyError):
        return None


def keep_trained_rows(metrics: Path, checkpoints: Path | None) -> None:
    """Before a launch. verl's file logger truncates `metrics` when it opens it, so a run resuming
    from the checkpoint of step N would lose the rows of steps 1..N: those (from the last run and any
    earlier part) go to `metrics.earlier.jsonl` beside it, which the dashboard reads first and
    `join_rows` folds back after the run. A run with no checkpoint to resume starts afresh: both go."""
    earlier = metrics.with_name(EARLIER)
    mark = checkpoints / CHECKPOINT_MARK if checkpoints is not None else None
    text = mark.read_text().strip() if mark is not None and mark.is_file() else ""
    if not text.isdigit():
        earlier.unlink(missing_ok=True)
        metrics.unlink(missing_ok=True)
        return
    kept = [
        line
        for path in (earlier, metrics)
        if path.is_file()
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
        if (step := _row_step(line)) is not None and step <= int(text)
    ]
    write_text_atomic(earlier, "".join(f"{line}\n" for line in kept))
    metrics.unlink(missing_ok=True)


def join_rows(metrics: Path) -> None:
    """After the run: the earlier steps' rows and the run's own in one `metrics.jsonl` again."""
    earlier = metrics.with_name(EARLIER)
    if not earlier.is_file():
        return
    now = metrics.read_text(encoding="utf-8", errors="replace") if metrics.is_file() else ""
    write_text_atomic(metrics, earlier.read_text(encoding="utf-8", errors="replace") + now)
    earlier.unlink()
