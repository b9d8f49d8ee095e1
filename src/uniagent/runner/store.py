"""The run store: one SQLite file (WAL) per run directory, one row per (instance, sample).

Each finished episode is one transaction, so a crash (even `kill -9`) loses at most the
episodes still running; everything committed is complete. Readers (the dashboard, exports)
can open the file while a run writes to it.

An episode's token record is its list of segments (`segments`, one `Trajectory.to_dict()` per
segment, in order). Stores written before segments existed hold one `trajectory` per row: they
read as one segment with reason "start", and a writable open adds the new columns.

`min_version` / `max_version`: the oldest and newest policy version that generated the episode's
tokens (from each segment's `response_versions`), NULL when the engine did not say; an
asynchronous trainer's episodes span versions, and a run can then be sorted by age.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from uniagent import jsonio
from uniagent.agent.result import ExitReason
from uniagent.errors import UniAgentError
from uniagent.tokens.drift import DriftReport, episode_drift
from uniagent.tokens.trajectory import version_range

STORE_NAME = "run.db"
SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    instance_id TEXT NOT NULL,
    sample INTEGER NOT NULL,
    exit_reason TEXT NOT NULL,
    trainable INTEGER NOT NULL,
    reward REAL,
    resolved INTEGER NOT NULL,
    turns INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    drift INTEGER,
    drift_kind TEXT,
    wall_s REAL,
    timings TEXT NOT NULL,
    metrics TEXT NOT NULL,
    messages TEXT NOT NULL,
    patch TEXT,
    answer TEXT,
    verifier TEXT,
    segments TEXT,
    num_segments INTEGER NOT NULL DEFAULT 0,
    min_version INTEGER,
    max_version INTEGER,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 1,
    finished_at REAL NOT NULL,
    PRIMARY KEY (instance_id, sample)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

TIMING_KEYS = ("model_s", "tools_s", "verifier_s", "sandbox_start_s", "setup_s", "wall_s", "episode_s")
JSON_COLUMNS = ("timings", "metrics", "messages", "verifier", "segments", "trajectory")
LIGHT_COLUMNS = (
    "instance_id, sample, exit_reason, trainable, reward, resolved, turns, prompt_tokens, "
    "completion_tokens, drift, wall_s, timings, error, attempts, finished_at"
)
SEGMENT_COLUMNS = {
    "segments": "TEXT",
    "num_segments": "INTEGER NOT NULL DEFAULT 0",
    "drift_kind": "TEXT",
    "min_version": "INTEGER",
    "max_version": "INTEGER",
}
"""Columns added since the first store layout (`trajectory`, one per row, read as one segment)."""


def model_tokens(segments: list[dict[str, Any]]) -> int:
    """Generated tokens over all segments (mask 1): each is in exactly one segment."""
    return sum(sum(t.get("response_mask") or ()) for t in segments)


def episode_versions(segments: list[dict[str, Any]]) -> tuple[int, int] | None:
    """(oldest, newest) policy version of the generated tokens over all segments; None when there
    are none, or when a segment with generated tokens has no versions (unknown is never guessed)."""
    ranges = []
    for t in segments:
        mask = t.get("response_mask") or []
        found = version_range(t.get("response_versions") or [], mask)
        if found is None and any(mask):
            return None
        ranges += [found] if found else []
    return (min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges else None


def legacy_segments(trajectory: dict[str, Any] | None) -> list[dict[str, Any]]:
    """An old row's single `trajectory` as a segment list: one segment that began at the start."""
    if not trajectory:
        return []
    return [{"reason": "start", "chain": 0, "drift_kind": None, **trajectory}]


def episode_row(instance_id: str, sample: int, result: dict[str, Any]) -> dict[str, Any]:
    """A stored row from `EpisodeResult.to_dict()` (already redacted)."""
    metrics = result.get("metrics") or {}
    reward = result.get("reward")
    segments = list(result.get("segments") or [])
    completion = model_tokens(segments) if segments else int(metrics.get("completion_tokens", 0))
    drift = episode_drift(segments) if segments else DriftReport(metrics.get("drift"), None)
    versions = episode_versions(segments) or (None, None)
    return {
        "instance_id": instance_id,
        "sample": sample,
        "exit_reason": result["exit_reason"],
        "trainable": int(bool(result.get("trainable"))),
        "reward": None if reward is None else reward.get("value"),
        "resolved": int(bool(result.get("resolved"))),
        "turns": int(metrics.get("turns", 0)),
        "prompt_tokens": int(metrics.get("prompt_tokens", 0)),
        "completion_tokens": completion,
        "drift": drift.index,
        "drift_kind": drift.kind,
        "wall_s": metrics.get("episode_s") or metrics.get("wall_s"),
        "timings": {k: metrics[k] for k in TIMING_KEYS if k in metrics},
        "metrics": metrics,
        "messages": result.get("messages") or [],
        "patch": result.get("patch"),
        "answer": result.get("answer"),
        "verifier": None if reward is None else reward.get("details"),
        "segments": segments,
        "num_segments": len(segments),
        "min_version": versions[0],
        "max_version": versions[1],
        "error": result.get("error"),
        "finished_at": time.time(),
    }


class StoreError(UniAgentError):
    """A run directory with no run store to read."""


def store_path(run_dir: str | Path) -> Path:
    """`RUN_DIR/run.db`, or the .db file itself; an error that says what is missing."""
    path = Path(run_dir).expanduser()
    if path.is_file():
        return path
    db = path / STORE_NAME
    if db.is_file():
        return db
    if path.is_dir():
        raise StoreError(f"{path} holds no {STORE_NAME}: is it a run directory (uniagent run --output)?")
    raise StoreError(f"{path} does not exist: give a run directory made by `uniagent run`")


class RunStore:
    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        if readonly:
            self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.executescript(SCHEMA)
        self.conn.execute("PRAGMA busy_timeout=10000")
        self.conn.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        self.columns = {r[1] for r in self.conn.execute("PRAGMA table_info(episodes)")}
        if not readonly and not SEGMENT_COLUMNS.keys() <= self.columns:
            self._add_segment_columns()

    def _add_segment_columns(self) -> None:
        """Bring a store from before segments up to date: new rows go to `segments`; old rows keep
        their `trajectory` (read as one segment) and count it in `num_segments`."""
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:  # columns read again inside the write lock: another writer may have added them
                have = {r[1] for r in self.conn.execute("PRAGMA table_info(episodes)")}
                for name, kind in SEGMENT_COLUMNS.items():
                    if name not in have:
                        self.conn.execute(f"ALTER TABLE episodes ADD COLUMN {name} {kind}")
                if "trajectory" in have and "num_segments" not in have:
                    self.conn.execute("UPDATE episodes SET num_segments = (trajectory IS NOT NULL)")
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
        self.columns |= SEGMENT_COLUMNS.keys()

    def close(self) -> None:
        self.conn.close()

    # -- writes --------------------------------------------------------------------------
    def put(self, row: dict[str, Any]) -> None:
        """Insert, or replace a stored infrastructure failure of the same pair (a retry)."""
        values = {k: (jsonio.dumps(v) if k in JSON_COLUMNS and v is not None else v) for k, v in row.items()}
        cols = ", ".join(values)
        marks = ", ".join(f":{k}" for k in values)
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                prev = self.conn.execute(
                    "SELECT attempts FROM episodes WHERE instance_id=? AND sample=?",
                    (row["instance_id"], row["sample"]),
                ).fetchone()
                values["attempts"] = (prev[0] + 1) if prev else 1
                self.conn.execute(
                    f"INSERT OR REPLACE INTO episodes ({cols}, attempts) VALUES ({marks}, :attempts)", values
                )
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def set_meta(self, key: str, value: Any) -> None:
        with self._lock:
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    # -- reads ---------------------------------------------------------------------------
    def meta(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def done_pairs(self, include_untrainable_failures: bool = True) -> set[tuple[str, int]]:
        """Pairs a resumed run skips. An interrupted episode (`cancelled`: a signal stopped the run,
        runner/interrupt.py) never counts as done, whatever `include_untrainable_failures` says."""
        sql = "SELECT instance_id, sample, exit_reason FROM episodes"
        infra = {r.value for r in ExitReason if not r.trainable}
        return {
            (r[0], r[1])
            for r in self.conn.execute(sql)
            if r[2] != "cancelled" and (include_untrainable_failures or r[2] not in infra)
        }

    def count(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM episodes").fetchone()[0])

    def rows(
        self, full: bool = True, where: str = "", params: tuple[Any, ...] = ()
    ) -> Iterator[dict[str, Any]]:
        """Rows as dicts; `full` adds messages, verifier report, `segments` (always a list: an old
        row's `trajectory` becomes one segment) and the rest. A read-only store from before
        segments counts its trajectory as `num_segments`."""
        if full:
            cols = "*"
        elif "num_segments" in self.columns:
            cols = f"{LIGHT_COLUMNS}, num_segments"
        else:
            cols = f"{LIGHT_COLUMNS}, (trajectory IS NOT NULL) AS num_segments"
        if not full:  # a read-only store from before drift kinds has none
            cols += ", drift_kind" if "drift_kind" in self.columns else ", NULL AS drift_kind"
        sql = f"SELECT {cols} FROM episodes {where} ORDER BY instance_id, sample"
        for r in self.conn.execute(sql, params):
            d = dict(r)
            for k in JSON_COLUMNS:
                if d.get(k) is not None:
                    d[k] = jsonio.loads(d[k])
            d["trainable"], d["resolved"] = bool(d["trainable"]), bool(d["resolved"])
            if full:
                old = d.pop("trajectory", None)
                if d.get("segments") is None:
                    d["segments"] = legacy_segments(old)
                d["num_segments"] = len(d["segments"])
            yield d

    def get(self, instance_id: str, sample: int) -> dict[str, Any] | None:
        return next(self.rows(where="WHERE instance_id=? AND sample=?", params=(instance_id, sample)), None)
