"""Checkpoints of the local trainer: written atomically, everything a resume needs to continue the
same curve: model, optimizer, step (= policy version), every RNG the run draws from, and in async
mode the producer's bookkeeping (counters, staleness histogram, finished groups not yet trained,
groups in flight), with tasks named by id so a checkpoint never pickles task objects.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from uniagent.jsonio import atomic_path
from uniagent.train.outputs import METRICS, truncate_metrics
from uniagent.train.sample import Sample

if TYPE_CHECKING:
    from uniagent.redact import Redactor
    from uniagent.tasks.base import Task
    from uniagent.train.config import TrainConfig

log = logging.getLogger(__name__)


class Checkpointed(Protocol):
    """What a checkpoint saves and restores of the trainer (`train.local.LocalTrainer` is one; no
    import, no cycle)."""

    cfg: TrainConfig
    out: Path
    ckpt_dir: Path
    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    step: int
    rng: random.Random
    async_state: dict[str, Any]

    def redactor(self) -> Redactor: ...

    def task_by_id(self, instance_id: str) -> Task: ...


def save_checkpoint(trainer: Checkpointed) -> Path:
    """Model, optimizer, step and every RNG the run draws from, written atomically."""
    trainer.ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = trainer.ckpt_dir / f"step_{trainer.step:06d}.pt"
    state = {
        "step": trainer.step,
        "model": trainer.policy.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "rng": {
            "trainer": trainer.rng.getstate(),
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        },
        "config": trainer.redactor().data(trainer.cfg.model_dump(mode="json")),
        "async": _portable(trainer.async_state),
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    for old in sorted(trainer.ckpt_dir.glob("step_*.pt"))[: -trainer.cfg.trainer.keep_checkpoints]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(trainer: Checkpointed, path: Path) -> None:
    state = torch.load(path, map_location=trainer.cfg.model.device, weights_only=False)
    trainer.policy.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.step = int(state["step"])
    rng = state["rng"]
    trainer.rng.setstate(rng["trainer"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    trainer.async_state = _restored(state.get("async") or {}, trainer)
    truncate_metrics(trainer.out / METRICS, trainer.step)
    log.info("resumed from %s at step %d", path, trainer.step)


def _portable(state: dict[str, Any]) -> dict[str, Any]:
    """The async bookkeeping with tasks named by id (a checkpoint must not pickle task objects)."""
    out = dict(state)
    out["finished"] = [
        {**g, "samples": [(s.task.instance_id, s.group, s.result, s.start_version) for s in g["samples"]]}
        for g in state.get("finished", [])
    ]
    return out


def _restored(state: dict[str, Any], trainer: Checkpointed) -> dict[str, Any]:
    out = dict(state)
    out["finished"] = [
        {**g, "samples": [Sample(trainer.task_by_id(t), grp, r, v) for t, grp, r, v in g["samples"]]}
        for g in state.get("finished", [])
    ]
    return out
