"""The dashboard's training runs: a local trainer's output directory (`trainer.output`).

A training run is read from its files on every request, never cached: `metrics.jsonl` grows one
row per step while the trainer runs (and is rewritten shorter when a run resumes from an earlier
checkpoint), so an open page polls and always sees the file as it is now. The trainer appends a
row with one write, but a reader can still catch it half-written: a last line without its newline
is not a row yet and is left for the next read. Rows are passed on as written (every key the
trainer logs, whatever its version) after the redactor; the summary computes only what a page
cannot get by drawing the rows (totals over the run, the staleness histogram summed), and a key a
run does not log (a sync run has no staleness) is `None` there, never an error.

A verl run (`uniagent train --engine verl` with a local config) writes the same file in verl's own
row format, `{"step": N, "data": {...}}`, several rows to a step: those rows are merged by step and
read as the page's rows (`train.verl_rows.page_row`: the page's names added, every verl key kept),
and verl's checkpoints (`checkpoints/global_step_N/`) are listed beside the local trainer's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse

from uniagent.redact import Redactor
from uniagent.runner.store import STORE_NAME, StoreError
from uniagent.train.outputs import CURVE, METRICS, staleness_totals
from uniagent.train.verl_rows import EARLIER, is_verl_row, merge_verl_rows, page_row

CHECKPOINTS = "checkpoints"
MEANS = ("step_s", "rollout_tokens_per_s", "train_tokens_per_s", "trainer_idle_frac", "engine_idle_frac")
"""Per-step figures the summary averages over the steps that logged them."""
TOTALS = (
    "episodes",
    "untrainable",
    "interrupted",
    "groups_dropped_zero_variance",
    "episodes_stale_dropped",
    "episodes_no_gradient",
)
"""Per-step counts the summary adds up over the steps that logged them."""
EDGE = 5
"""Steps averaged at each end of the run for the first/last reward."""


def is_training_dir(path: Path) -> bool:
    """A directory holding a trainer's metrics.jsonl and no run store."""
    return path.is_dir() and (path / METRICS).is_file() and not (path / STORE_NAME).exists()


def training_dir(path: str | Path) -> Path:
    """The output directory of a training run: the directory itself, or the one holding the
    given metrics.jsonl. It may be empty still (a run that has not finished its first step)."""
    given = Path(path).expanduser()
    if given.is_file() and given.name == METRICS:
        return given.parent
    if not given.exists():
        raise StoreError(f"{given} does not exist: give a training run's trainer.output directory")
    if not given.is_dir():
        raise StoreError(f"{given} is not a directory: give trainer.output (it holds {METRICS})")
    return given


def read_metrics_live(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of a metrics.jsonl as the file is now, by step, and how many lines were skipped.

    A last line without its newline is being written: skipped. So is a line that is not a JSON
    object with a step (counted, so the page can say so). A step logged twice (a crash between
    writing a row and checkpointing it, then a resume) keeps its last row: the curve the resumed
    run continued. (`train.outputs.read_metrics` reads a finished file, for plots; this one reads a
    file that a running trainer is writing.) verl's rows of one step are merged instead, and the
    step read as the page's row (module docstring).
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        text = ""
    earlier = path.with_name(EARLIER)  # a resumed verl run's earlier steps, read first
    if earlier.is_file():
        text = earlier.read_text(encoding="utf-8", errors="replace") + text
    if not text:
        return [], 0
    lines = text.split("\n")
    lines.pop()  # "" after the last newline, or the half-written line
    by_step: dict[int, dict[str, Any]] = {}
    verl: list[dict[str, Any]] = []
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = int(row["step"])
        except (ValueError, TypeError, KeyError):
            skipped += 1
            continue
        if not isinstance(row, dict):
            skipped += 1
            continue
        if is_verl_row(row):
            verl.append(row)
        else:
            by_step[step] = row
    for step, data in merge_verl_rows(verl).items():
        by_step[step] = page_row(step, data)
    return [by_step[s] for s in sorted(by_step)], skipped


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _values(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [v for v in (_number(r.get(key)) for r in rows) if v is not None]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def staleness_total(rows: list[dict[str, Any]]) -> dict[str, int] | None:
    """Episodes trained at each lag (versions behind the trainer), summed over the run; `None`
    when no step logged a histogram (a run from before async training), not an empty one."""
    if not any(isinstance(r.get("staleness_hist"), dict) for r in rows):
        return None
    return {str(lag): n for lag, n in staleness_totals(rows).items()}


def summarize_training(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a page shows beside the curves: the mode, the policy version, totals and means."""
    last = rows[-1] if rows else {}
    rewards = _values(rows, "reward_mean")
    out: dict[str, Any] = {
        "steps": len(rows),
        "last_step": last.get("step"),
        "last_time": _number(last.get("time")),
        "mode": next((r["mode"] for r in reversed(rows) if isinstance(r.get("mode"), str)), None),
        "policy_version": next(
            (int(v) for r in reversed(rows) if (v := _number(r.get("policy_version"))) is not None), None
        ),
        "reward_first": _mean(rewards[:EDGE]),
        "reward_last": _mean(rewards[-EDGE:]),
        "resolved_last": _mean(_values(rows, "resolved_rate")[-EDGE:]),
        "wall_s": sum(_values(rows, "step_s")) if any("step_s" in r for r in rows) else None,
        "staleness_hist": staleness_total(rows),
        "staleness_max": max(map(int, _values(rows, "staleness_max")), default=None),
    }
    for key in MEANS:
        out[f"{key}_mean"] = _mean(_values(rows, key))
    for key in TOTALS:
        values = _values(rows, key)
        out[key] = int(sum(values)) if values else None
    return out


class TrainingRun:
    """One training output directory; every read goes to the files."""

    def __init__(self, index: int, path: str | Path) -> None:
        self.index = index
        self.dir = training_dir(path)
        self.name = self.dir.name

    def rows(self) -> tuple[list[dict[str, Any]], int]:
        return read_metrics_live(self.dir / METRICS)

    def checkpoints(self) -> list[str]:
        """The local trainer's `step_N.pt` files and verl's `global_step_N` directories, by step."""
        folder = self.dir / CHECKPOINTS
        if not folder.is_dir():
            return []
        verl = [p for p in folder.glob("global_step_*") if p.is_dir() and p.name[12:].isdigit()]
        return sorted(p.name for p in folder.glob("step_*.pt")) + [
            p.name for p in sorted(verl, key=lambda p: int(p.name[12:]))
        ]

    def info(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The run's figures, read now, and the rows they were computed from."""
        rows, skipped = self.rows()
        return {
            "id": self.index,
            "name": self.name,
            "path": str(self.dir),
            "summary": summarize_training(rows),
            "skipped_lines": skipped,
            "checkpoints": self.checkpoints(),
            "has_curve": (self.dir / CURVE).is_file(),
        }, rows


def register(app: FastAPI, train_dirs: list[Path], redactor: Redactor) -> list[TrainingRun]:
    """The /api/train routes over `train_dirs` (the app's token check covers them too)."""
    runs = [TrainingRun(i, d) for i, d in enumerate(train_dirs)]

    def get(tid: int) -> TrainingRun:
        if not 0 <= tid < len(runs):
            raise HTTPException(404, f"no training run {tid}; there are {len(runs)}")
        return runs[tid]

    @app.get("/api/train")
    def list_training() -> Any:
        return redactor.data([run.info()[0] for run in runs])

    @app.get("/api/train/{tid}")
    def training_detail(tid: int) -> Any:
        """The run's summary and every metrics row (all keys as logged), oldest step first."""
        info, rows = get(tid).info()
        return redactor.data({**info, "rows": rows})

    @app.get("/api/train/{tid}/" + CURVE)
    def training_curve(tid: int) -> FileResponse:
        """The trainer's own PNG of the reward curve, as written at its last checkpoint."""
        path = get(tid).dir / CURVE
        if not path.is_file():
            raise HTTPException(404, f"{path} is not written yet (the trainer draws it at each checkpoint)")
        return FileResponse(path, media_type="image/png", headers={"Cache-Control": "no-store"})

    return runs
