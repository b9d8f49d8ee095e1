"""The run store: one SQLite file (WAL) per run directory, one row per (instance, sample).

Each finished episode is one transaction, so a crash (even `kill -9`) loses at most the
episodes still running; everything committed is complete. Readers (the dashboard, exports)
can open the file while a run writes to it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    wall_s REAL,
    timings TEXT NOT NULL,
    metrics TEXT NOT NULL,
    messages TEXT NOT NULL,
    patch TEXT,
    answer TEXT,
    verifier TEXT,
    trajectory TEXT,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 1,
    finished_at REAL NOT NULL,
    PRIMARY KEY (instance_id, sample)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

TIMING_KEYS = ("model_s", "tools_s", "verifier_s", "sandbox_start_s", "setup_s", "wall_s", "episode_s")
JSON_COLUMNS = ("timings", "metrics", "messages", "verifier", "trajectory")


def episode_row(instance_id: str, sample: int, result: dict[str, Any]) -> dict[str, Any]:
    """A stored row from `EpisodeResult.to_dict()` (already redacted)."""
    metrics = result.get("metrics") or {}
    reward = result.get("reward")
    return {
        "instance_id": instance_id,
        "sample": sample,
        "exit_reason": result["exit_reason"],
        "trainable": int(bool(result.get("trainable"))),
        "reward": None if reward is None else reward.get("value"),
        "resolved": int(bool(result.get("resolved"))),
        "turns": int(metrics.get("turns", 0)),
        "prompt_tokens": int(metrics.get("prompt_tokens", 0)),
        "completion_tokens": int(metrics.get("completion_tokens", 0)),
        "drift": metrics.get("drift"),
        "wall_s": metrics.get("episode_s") or metrics.get("wall_s"),
        "timings": {k: metrics[k] for k in TIMING_KEYS if k in metrics},
        "metrics": metrics,
        "messages": result.get("messages") or [],
        "patch": result.get("patch"),
        "answer": result.get("answer"),
        "verifier": None if reward is None else reward.get("details"),
        "trajectory": result.get("trajectory"),
        "error": result.get("error"),
        "finished_at": time.time(),
    }


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

    def close(self) -> None:
        self.conn.close()

    # -- writes --------------------------------------------------------------------------
    def put(self, row: dict[str, Any]) -> None:
        """Insert, or replace a stored infrastructure failure of the same pair (a retry)."""
        values = {k: (json.dumps(v) if k in JSON_COLUMNS and v is not None else v) for k, v in row.items()}
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
        sql = "SELECT instance_id, sample, exit_reason FROM episodes"
        infra = {"sandbox_dead", "model_error", "verifier_error", "cancelled", "internal_error"}
        return {
            (r[0], r[1]) for r in self.conn.execute(sql) if include_untrainable_failures or r[2] not in infra
        }

    def count(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM episodes").fetchone()[0])

    def rows(
        self, full: bool = True, where: str = "", params: tuple[Any, ...] = ()
    ) -> Iterator[dict[str, Any]]:
        cols = (
            "*"
            if full
            else (
                "instance_id, sample, exit_reason, trainable, reward, resolved, turns, prompt_tokens, "
                "completion_tokens, drift, wall_s, timings, error, attempts, finished_at"
            )
        )
        sql = f"SELECT {cols} FROM episodes {where} ORDER BY instance_id, sample"
        for r in self.conn.execute(sql, params):
            d = dict(r)
            for k in JSON_COLUMNS:
                if d.get(k) is not None:
                    d[k] = json.loads(d[k])
            d["trainable"], d["resolved"] = bool(d["trainable"]), bool(d["resolved"])
            yield d

    def get(self, instance_id: str, sample: int) -> dict[str, Any] | None:
        return next(self.rows(where="WHERE instance_id=? AND sample=?", params=(instance_id, sample)), None)
