"""`uniagent data prepare`: uniagent task files -> the parquet files verl's RL dataset reads.

verl's `RLHFDataset` wants, per row: `prompt` (chat messages; rendered by the agent loop, and used by
verl to filter over-long prompts), `data_source`, `reward_model`, `extra_info` (its `index` groups the
n samples of one prompt) and, for agent loops, `agent_name`, the registry entry that runs the row.
uniagent adds the whole task under `extra_info.uniagent_task` (see `spec.py`), so the agent loop
rebuilds the exact Task that `uniagent run` builds from the same file.

The split is a seeded shuffle, so the same seed gives the same train/validation sets on every
machine; files are written atomically (a crash never leaves half a parquet file behind). A task
that holds a secret (the value of an environment variable named like a key or token, see
`uniagent.redact`) is refused: a parquet file would keep it, and masking it would change the task.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from uniagent.errors import ConfigError
from uniagent.integrations.verl.spec import SPEC_KEY, encode_spec, task_spec
from uniagent.jsonio import atomic_path
from uniagent.redact import Redactor
from uniagent.tasks.base import Task

COLUMNS = ("data_source", "agent_name", "prompt", "ability", "reward_model", "extra_info")


def _messages(task: Task) -> list[dict[str, str]]:
    """Plain role/content messages: one struct type for the whole parquet column."""
    out = []
    for message in task.messages():
        content = message.get("content")
        out.append(
            {"role": str(message["role"]), "content": content if isinstance(content, str) else str(content)}
        )
    return out


def verl_row(task: Task, source: str, *, index: int, split: str, agent_name: str, data_source: str) -> dict:
    """One verl dataset row for `task` (`source` is `builtin:NAME` or the task file's path)."""
    return {
        "data_source": data_source,
        "agent_name": agent_name,
        "prompt": _messages(task),
        "ability": "agent",
        # The verifier runs inside the agent loop; this only tells verl's reward tooling what row it is.
        "reward_model": {"style": "uniagent_verifier", "ground_truth": task.instance_id},
        "extra_info": {
            "index": index,
            "split": split,
            "instance_id": task.instance_id,
            "family": task.family,
            SPEC_KEY: encode_spec(task_spec(task, source)),
        },
    }


def split_indices(
    n: int, *, val_fraction: float, val_size: int | None, seed: int
) -> tuple[list[int], list[int]]:
    """A seeded shuffle of range(n) cut into (train, validation)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_val = val_size if val_size is not None else round(n * val_fraction)
    if val_fraction > 0 and val_size is None and n > 1:
        n_val = max(1, n_val)
    if n_val >= n:
        raise ConfigError(f"validation would take {n_val} of {n} tasks and leave none to train on")
    return sorted(order[n_val:]), sorted(order[:n_val])


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def prepare(
    tasks: str,
    output: str | os.PathLike[str],
    *,
    val_fraction: float = 0.1,
    val_size: int | None = None,
    seed: int = 0,
    agent_name: str = "uniagent",
    data_source: str | None = None,
    family: str | None = None,
    limit: int | None = None,
    ids: list[str] | None = None,
) -> dict[str, Any]:
    """Write OUTPUT/train.parquet and OUTPUT/val.parquet; return paths and counts. `family`, `limit`,
    `ids` select tasks as `uniagent run` and the local trainer do."""
    from uniagent.tasks import load_tasks

    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction must be in [0, 1), got {val_fraction}")
    loaded = load_tasks(tasks, family, limit, ids or None)
    if not loaded:
        raise ConfigError(f"{tasks} holds no tasks")
    source = tasks if tasks.startswith("builtin:") else str(Path(tasks).resolve())
    train_idx, val_idx = split_indices(len(loaded), val_fraction=val_fraction, val_size=val_size, seed=seed)
    redactor = Redactor()
    for task in loaded:
        row = verl_row(task, source, index=0, split="", agent_name="", data_source="")
        if redactor.data(row) != row:
            raise ConfigError(
                f"task {task.instance_id} in {tasks} holds a secret (the value of an environment variable "
                "named like KEY, TOKEN, SECRET or PASSWORD); take it out of the task file or unset the "
                "variable: a parquet file would keep it"
            )
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"tasks": tasks, "seed": seed}
    for split, indices in (("train", train_idx), ("val", val_idx)):
        rows = [
            verl_row(
                loaded[i],
                source,
                index=i,
                split=split,
                agent_name=agent_name,
                data_source=data_source or f"uniagent/{loaded[i].family}",
            )
            for i in indices
        ]
        path = out / f"{split}.parquet"
        if rows:
            _write_parquet(rows, path)
        else:
            path.unlink(missing_ok=True)
        result[split] = str(path) if rows else None
        result[f"n_{split}"] = len(rows)
    return result
