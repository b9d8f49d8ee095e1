"""The training export: one record per segment of every stored episode (`segments.jsonl`, written
with the run's other exports by `uniagent.runner.summary.export`, and `segments.parquet` on
request).

An episode whose history stopped being append-only (context condensed, a harness rewrote its
messages) has several segments, each an exact token sequence of its own. A trainer takes each
segment as its own sample: the episode's id, the segment's index and the reason it began, and the
episode's reward, so that the advantage computed per episode (grouped by `instance_id`, as GRPO
groups samples of one task) is broadcast to every segment of it. Every generated token is in
exactly one segment with mask 1; a segment's prompt may repeat earlier replies as context.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from uniagent.errors import UniAgentError
from uniagent.runner.store import RunStore

SEGMENTS_JSONL = "segments.jsonl"
SEGMENTS_PARQUET = "segments.parquet"
EPISODE_KEYS = ("instance_id", "sample", "exit_reason", "trainable", "reward", "resolved")
TOKEN_KEYS = ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "response_versions")
"""`response_versions`: the policy version of each response token (-1: context); empty = unknown."""


class ExportError(UniAgentError):
    """An export that cannot be written as asked (a missing optional package)."""


def episode_id(instance_id: str, sample: int) -> str:
    """The id every segment of one episode shares: `instance#sample`."""
    return f"{instance_id}#{sample}"


def segment_records(row: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One training record per segment of a stored row (`RunStore.rows(full=True)`), in order."""
    segments = row.get("segments") or []
    for index, traj in enumerate(segments):
        yield {
            "episode_id": episode_id(row["instance_id"], row["sample"]),
            **{k: row.get(k) for k in EPISODE_KEYS},
            "segment": index,
            "num_segments": len(segments),
            "reason": traj.get("reason") or "start",
            "chain": traj.get("chain") or 0,
            **{k: list(traj.get(k) or []) for k in TOKEN_KEYS},
            "num_turns": traj.get("num_turns") or 0,
            "drift": traj.get("drift"),
            "drift_kind": traj.get("drift_kind"),
        }


def all_segment_records(store: RunStore) -> Iterator[dict[str, Any]]:
    for row in store.rows(full=True):
        yield from segment_records(row)


def write_segments_parquet(store: RunStore, out: Path) -> int:
    """`out/segments.parquet` (the same records, one row each), written atomically."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ExportError("--parquet needs pyarrow: pip install pyarrow (or export jsonl only)") from exc
    records = list(all_segment_records(store))
    schema = pa.schema(
        [
            ("episode_id", pa.string()),
            ("instance_id", pa.string()),
            ("sample", pa.int64()),
            ("exit_reason", pa.string()),
            ("trainable", pa.bool_()),
            ("reward", pa.float64()),
            ("resolved", pa.bool_()),
            ("segment", pa.int64()),
            ("num_segments", pa.int64()),
            ("reason", pa.string()),
            ("chain", pa.int64()),
            ("prompt_ids", pa.list_(pa.int64())),
            ("response_ids", pa.list_(pa.int64())),
            ("response_mask", pa.list_(pa.int8())),
            ("response_logprobs", pa.list_(pa.float32())),
            ("response_versions", pa.list_(pa.int64())),
            ("num_turns", pa.int64()),
            ("drift", pa.int64()),
            ("drift_kind", pa.string()),
        ]
    )
    table = pa.Table.from_pylist(records, schema=schema)
    tmp = out / (SEGMENTS_PARQUET + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out / SEGMENTS_PARQUET)
    return len(records)
