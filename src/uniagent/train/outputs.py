"""What a local training run writes and how it keeps its memory flat: metrics.jsonl (plus
TensorBoard and W&B when installed), the reward curve PNG, and the glibc settings that give freed
tensors back to the OS between steps. Kept apart from the trainer's algorithm (local.py).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
from pathlib import Path
from typing import Any

from uniagent.jsonio import atomic_path, write_text_atomic
from uniagent.models.local_memory import trim_heap
from uniagent.train.config import TrainConfig

METRICS = "metrics.jsonl"
CURVE = "reward_curve.png"


def release_memory() -> None:
    """Collect cycles and hand freed heap pages back to the OS (glibc's malloc_trim) between steps."""
    gc.collect()
    trim_heap()


def rss_mb() -> float:
    """Resident memory now (Linux), to spot growth across steps; 0 where /proc is missing."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after the checkpoint: those steps run again."""
    if not path.exists():
        return
    keep = [
        line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step
    ]
    write_text_atomic(path, "".join(line + "\n" for line in keep))


class Writers:
    """metrics.jsonl always; TensorBoard and W&B only when installed (and W&B only when asked)."""

    def __init__(self, out: Path, cfg: TrainConfig, redactor: Any) -> None:
        """`redactor()`: the trainer's redactor; the config and every row pass through it."""
        self.path = out / METRICS
        self.redactor = redactor
        self.tb: Any = None
        self.wandb: Any = None
        if cfg.trainer.tensorboard:
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tensorboard"))
        if cfg.trainer.wandb_project:
            with contextlib.suppress(ImportError):
                import wandb

                config = redactor().data(cfg.model_dump(mode="json"))
                self.wandb = wandb.init(project=cfg.trainer.wandb_project, config=config, dir=str(out))

    def write(self, row: dict[str, Any]) -> None:
        row = self.redactor().data(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        scalars = {
            k: float(v)
            for k, v in row.items()
            if isinstance(v, int | float) and v is not None and k not in ("step", "time") and math.isfinite(v)
        }
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(f"train/{key}", value, row["step"])
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=row["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a `metrics.jsonl`, in order (blank lines skipped)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wall_clock(rows: list[dict[str, Any]]) -> list[float]:
    """Seconds from the start of the first step to the end of each row's step.

    Every row is stamped (`time`) when its step ends and the first step began `step_s` before its
    stamp, so this holds whatever a mode counts inside `step_s` (an async step overlaps the next
    rollout). Rows without stamps fall back to the running sum of `step_s`.
    """
    if rows and all(isinstance(r.get("time"), int | float) for r in rows):
        start = rows[0]["time"] - float(rows[0].get("step_s") or 0.0)
        return [r["time"] - start for r in rows]
    total, out = 0.0, []
    for r in rows:
        total += float(r.get("step_s") or 0.0)
        out.append(total)
    return out


def staleness_totals(rows: list[dict[str, Any]]) -> dict[int, int]:
    """Episodes trained per staleness lag (versions behind the trainer), summed over the rows'
    `staleness_hist`; empty when no row has one (a run from before versions were tracked)."""
    totals: dict[int, int] = {}
    for r in rows:
        for lag, count in (r.get("staleness_hist") or {}).items():
            totals[int(lag)] = totals.get(int(lag), 0) + int(count)
    return dict(sorted(totals.items()))


def moving_average(values: list[float], window: int = 5) -> list[float]:
    """Trailing mean over at most `window` values (shorter at the start)."""
    spans = [values[max(0, i - window + 1) : i + 1] for i in range(len(values))]
    return [sum(span) / len(span) for span in spans]


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _save(fig: Any, png: Path) -> Path:
    """Write the figure atomically (a dashboard may be reading the previous one)."""
    import matplotlib.pyplot as plt

    with atomic_path(png, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)
    return png


def plot_rewards(metrics: Path, png: Path) -> Path | None:
    """Reward mean per step with a 5-step moving average; `None` without matplotlib or rewards."""
    plt = _pyplot()
    if plt is None:
        return None
    rows = [r for r in read_metrics(metrics) if r.get("reward_mean") is not None]
    if not rows:
        return None
    steps = [r["step"] for r in rows]
    rewards = [r["reward_mean"] for r in rows]
    window = 5
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, "o-", alpha=0.5, label="reward mean")
    ax.plot(steps, moving_average(rewards, window), "-", linewidth=2, label=f"moving average ({window})")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("uniagent train --engine local")
    fig.tight_layout()
    return _save(fig, png)


def plot_comparison(runs: dict[str, list[dict[str, Any]]], png: Path, title: str = "") -> Path | None:
    """Several runs of one experiment (e.g. sync vs async) in one PNG: reward per step, per wall-clock
    minute and per episode trained (raw points faint, 5-step moving average bold), and each run's
    staleness histogram (episodes per lag). `None` without matplotlib or without any reward."""
    plt = _pyplot()
    if plt is None:
        return None
    runs = {name: [r for r in rows if r.get("reward_mean") is not None] for name, rows in runs.items()}
    if not any(runs.values()):
        return None
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (by_step, by_wall), (by_sample, hist) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, rows) in enumerate(runs.items()):
        if not rows:
            continue
        color = colors[i % len(colors)]
        rewards = [r["reward_mean"] for r in rows]
        smooth = moving_average(rewards)
        trained, total = [], 0.0
        for r in rows:
            total += float(r.get("episodes_trained") or r.get("episodes") or 0)
            trained.append(total)
        xs = {
            by_step: [r["step"] for r in rows],
            by_wall: [t / 60 for t in wall_clock(rows)],
            by_sample: trained,
        }
        for ax, x in xs.items():
            ax.plot(x, rewards, "o", color=color, alpha=0.3, markersize=4)
            ax.plot(x, smooth, "-", color=color, linewidth=2, label=name)
    by_step.xaxis.get_major_locator().set_params(integer=True)
    for ax, label in ((by_step, "step"), (by_wall, "wall clock (min)"), (by_sample, "episodes trained")):
        ax.set_xlabel(label)
        ax.set_ylabel("reward mean")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend()
    totals = {name: staleness_totals(rows) for name, rows in runs.items()}
    lags = sorted({lag for t in totals.values() for lag in t})
    width = 0.8 / max(len(runs), 1)
    for i, (name, t) in enumerate(totals.items()):
        if t:
            offset = (i - (len(runs) - 1) / 2) * width
            counts = [t.get(lag, 0) for lag in lags]
            hist.bar(
                [lag + offset for lag in lags], counts, width=width, color=colors[i % len(colors)], label=name
            )
    hist.set_xticks(lags)
    hist.set_xlabel("staleness (policy versions behind the trainer)")
    hist.set_ylabel("episodes trained")
    hist.grid(alpha=0.3, axis="y")
    if lags:
        hist.legend()
    else:
        hist.text(0.5, 0.5, "no staleness recorded", ha="center", va="center", transform=hist.transAxes)
    fig.suptitle(title or "uniagent train --engine local: " + " vs ".join(runs))
    fig.tight_layout()
    return _save(fig, png)
