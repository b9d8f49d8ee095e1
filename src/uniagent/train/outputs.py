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

from uniagent.train.config import TrainConfig

METRICS = "metrics.jsonl"
CURVE = "reward_curve.png"


def _libc() -> Any:
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
if _LIBC is not None and hasattr(_LIBC, "mallopt"):
    # glibc raises its mmap threshold as big blocks are freed, after which the KV caches and
    # activations of every step land in the heap arenas and are never given back: RSS grew by
    # ~3 GB per step until the OOM killer stopped a 135M-parameter run at step 7. A fixed threshold
    # (M_MMAP_THRESHOLD = -3) keeps big tensors in mmaps that return to the OS when freed.
    _LIBC.mallopt(-3, 4 * 2**20)


def release_memory() -> None:
    """Collect cycles and hand freed heap pages back to the OS (glibc's malloc_trim)."""
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


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
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)


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


def plot_rewards(metrics: Path, png: Path) -> Path | None:
    """Reward mean and resolved rate per step, with a 5-step moving average; `None` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("reward_mean") is not None]
    if not rows:
        return None
    steps = [r["step"] for r in rows]
    rewards = [r["reward_mean"] for r in rows]
    window = 5
    smooth = [
        sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
        for i in range(len(rewards))
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, "o-", alpha=0.5, label="reward mean")
    ax.plot(steps, smooth, "-", linewidth=2, label=f"moving average ({window})")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("uniagent train --engine local")
    fig.tight_layout()
    tmp = png.with_name(png.stem + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, png)
    return png
