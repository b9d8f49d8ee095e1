"""Every segment of an episode in the run store and its exports, with the real RunStore, on the
real SmolLM2 codec and on each family's real tokenizer with its own template (the store and the
exports only carry ids, so one pair per family covers them); a store written before segments
existed still reads (as one segment)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

import real_tokenizers as real
from segment_helpers import REPLIES, two_segment_result
from uniagent.cli import app
from uniagent.runner.export import segment_records
from uniagent.runner.store import RunStore, StoreError, episode_row
from uniagent.runner.summary import export
from uniagent.tokens import ChatCodec, Trajectory

# The episodes table as the store created it before segments (one `trajectory` per row).
OLD_SCHEMA = """
CREATE TABLE episodes (
    instance_id TEXT NOT NULL, sample INTEGER NOT NULL, exit_reason TEXT NOT NULL,
    trainable INTEGER NOT NULL, reward REAL, resolved INTEGER NOT NULL, turns INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, drift INTEGER, wall_s REAL,
    timings TEXT NOT NULL, metrics TEXT NOT NULL, messages TEXT NOT NULL, patch TEXT, answer TEXT,
    verifier TEXT, trajectory TEXT, error TEXT, attempts INTEGER NOT NULL DEFAULT 1,
    finished_at REAL NOT NULL, PRIMARY KEY (instance_id, sample)
);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@pytest.fixture(scope="module", params=["smollm2", *real.OWN_PAIRS])
def codec(request, codec):  # type: ignore[no-untyped-def]
    """SmolLM2's codec and each family's real tokenizer with its own template."""
    return real.codec_or_smol(request, codec)


def old_store(path: Path, codec: ChatCodec) -> dict:
    """A store in the old layout: an episode with a trajectory and an infra failure without."""
    traj = two_segment_result(codec).segments[0].to_dict()
    for key in ("reason", "chain", "drift_kind"):  # an old trajectory knew nothing of segments
        traj.pop(key)
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA)
    row = (
        "INSERT INTO episodes VALUES (?, ?, ?, 1, 1.0, 1, 2, 10, ?, NULL, 1.0, "
        "'{}', '{}', '[]', NULL, NULL, NULL, ?, NULL, 1, 0.0)"
    )
    conn.execute(row, ("old-001", 0, "finished", sum(traj["response_mask"]), json.dumps(traj)))
    conn.execute(row.replace("1, 1.0, 1, 2", "0, NULL, 0, 0"), ("old-002", 0, "sandbox_dead", 0, None))
    conn.commit()
    conn.close()
    return traj


def test_every_segment_is_stored_and_token_counts_sum_over_them(tmp_path: Path, codec: ChatCodec) -> None:
    result = two_segment_result(codec)
    data = result.to_dict()
    assert "trajectory" not in data, "readers take `segments`; the last-segment copy is gone"
    store = RunStore(tmp_path / "run.db")
    store.put(episode_row("seg-001", 0, data))
    row = store.get("seg-001", 0)
    assert row is not None and "trajectory" not in row
    assert row["segments"] == data["segments"] and row["num_segments"] == 2
    assert [Trajectory.from_dict(t) for t in row["segments"]] == result.segments
    assert [t["reason"] for t in row["segments"]] == ["start", "rewritten"]
    # Generated tokens over every segment (the metrics carry no count of their own here).
    turns = [t.response_ids[s.start : s.end] for t in result.segments for s in t.spans if s.kind == "model"]
    for ids, text in zip(turns, REPLIES, strict=True):  # each turn as its template renders it
        assert text in codec.decode(ids) and ids[-1] in codec.stop_token_ids
    per_segment = [t.num_model_tokens for t in result.segments]
    assert row["completion_tokens"] == sum(per_segment) and min(per_segment) > 0
    (light,) = store.rows(full=False)
    assert light["num_segments"] == 2 and light["completion_tokens"] == sum(per_segment)
    store.close()


def test_a_store_from_before_segments_reads_each_trajectory_as_one_segment(
    tmp_path: Path, codec: ChatCodec
) -> None:
    db = tmp_path / "run.db"
    traj = old_store(db, codec)
    reader = RunStore(db, readonly=True)  # the dashboard's way: nothing is changed
    old, failed = reader.rows()
    assert old["segments"] == [{"reason": "start", "chain": 0, "drift_kind": None, **traj}]
    assert "trajectory" not in old and old["num_segments"] == 1
    assert failed["segments"] == [] and failed["num_segments"] == 0
    assert [r["num_segments"] for r in reader.rows(full=False)] == [1, 0]
    reader.close()
    writer = RunStore(db)  # a resumed run: the new columns are added, old rows keep their record
    writer.put(episode_row("seg-001", 0, two_segment_result(codec).to_dict()))
    assert [(r["instance_id"], r["num_segments"]) for r in writer.rows(full=False)] == [
        ("old-001", 1),
        ("old-002", 0),
        ("seg-001", 2),
    ]
    assert writer.get("old-001", 0)["segments"] == old["segments"]
    writer.close()


def test_exports_hold_a_record_per_segment_with_the_episodes_reward(tmp_path: Path, codec: ChatCodec) -> None:
    result = two_segment_result(codec, reward=0.5)
    old_store(tmp_path / "run.db", codec)
    store = RunStore(tmp_path / "run.db")
    store.put(episode_row("seg-001", 0, result.to_dict()))
    export(store, tmp_path, "m")
    store.close()
    records = [json.loads(line) for line in (tmp_path / "segments.jsonl").read_text().splitlines()]
    assert [(r["episode_id"], r["segment"], r["num_segments"], r["reason"]) for r in records] == [
        ("old-001#0", 0, 1, "start"),
        ("seg-001#0", 0, 2, "start"),
        ("seg-001#0", 1, 2, "rewritten"),
    ]
    assert [r["reward"] for r in records] == [1.0, 0.5, 0.5]
    assert all(r["trainable"] and r["exit_reason"] == "finished" for r in records)
    for rec, seg in zip(records[1:], result.segments, strict=True):
        assert rec["prompt_ids"] == seg.prompt_ids and rec["response_ids"] == seg.response_ids
        assert rec["response_mask"] == seg.response_mask
        assert rec["response_logprobs"] == seg.response_logprobs
    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["num_segments"] for r in results] == [1, 0, 2] and "trajectory" not in results[2]
    assert list(segment_records(results[2])) == records[1:]


def test_the_export_command_writes_jsonl_and_parquet_from_the_store(tmp_path: Path, codec: ChatCodec) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="--parquet needs pyarrow")
    store = RunStore(tmp_path / "run.db")
    store.put(episode_row("seg-001", 0, two_segment_result(codec).to_dict()))
    store.close()
    done = CliRunner().invoke(app, ["export", str(tmp_path), "--parquet"])
    assert done.exit_code == 0, done.output
    assert "1 episodes exported" in done.output and "segments.parquet" in done.output
    jsonl = [json.loads(line) for line in (tmp_path / "segments.jsonl").read_text().splitlines()]
    table = pq.read_table(tmp_path / "segments.parquet").to_pylist()
    assert [r["reason"] for r in table] == ["start", "rewritten"]
    for a, b in zip(table, jsonl, strict=True):
        assert a["response_logprobs"] == pytest.approx(b["response_logprobs"], abs=1e-6)
        assert {k: v for k, v in a.items() if k != "response_logprobs"} == {
            k: v for k, v in b.items() if k != "response_logprobs"
        }
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "results.jsonl").is_file()
    missing = CliRunner().invoke(app, ["export", str(tmp_path / "nothing")])
    assert isinstance(missing.exception, StoreError) and "does not exist" in str(missing.exception)


def test_policy_versions_are_stored_and_exported_per_token(tmp_path: Path, codec: ChatCodec) -> None:
    """An asynchronous trainer's episode: its tokens' policy versions round-trip through the store,
    the row says the oldest and newest, and segments.jsonl / parquet carry them per token."""
    pq = pytest.importorskip("pyarrow.parquet", reason="--parquet needs pyarrow")
    result = two_segment_result(codec, versions=True)
    first, second = result.segments
    assert first.version_range == (0, 1) and second.version_range == (2, 3)
    store = RunStore(tmp_path / "run.db")
    store.put(episode_row("seg-001", 0, result.to_dict()))
    plain = two_segment_result(codec)  # an engine that gave no versions
    store.put(episode_row("seg-002", 0, plain.to_dict()))
    row = store.get("seg-001", 0)
    assert [Trajectory.from_dict(t) for t in row["segments"]] == result.segments
    assert (row["min_version"], row["max_version"]) == (0, 3)
    unknown = store.get("seg-002", 0)
    assert (unknown["min_version"], unknown["max_version"]) == (None, None)
    assert all(t["response_versions"] == [] for t in unknown["segments"])
    store.close()
    done = CliRunner().invoke(app, ["export", str(tmp_path), "--parquet"])
    assert done.exit_code == 0, done.output
    jsonl = [json.loads(line) for line in (tmp_path / "segments.jsonl").read_text().splitlines()]
    table = pq.read_table(tmp_path / "segments.parquet").to_pylist()
    assert [r["response_versions"] for r in jsonl[:2]] == [s.response_versions for s in result.segments]
    assert [r["response_versions"] for r in jsonl[2:]] == [[], []]
    assert [r["response_versions"] for r in table] == [r["response_versions"] for r in jsonl]


def test_a_store_from_before_versions_gets_their_columns(tmp_path: Path, codec: ChatCodec) -> None:
    db = tmp_path / "run.db"
    conn = sqlite3.connect(db)
    conn.executescript(OLD_SCHEMA)
    for name in ("segments TEXT", "num_segments INTEGER NOT NULL DEFAULT 0", "drift_kind TEXT"):
        conn.execute(f"ALTER TABLE episodes ADD COLUMN {name}")
    conn.commit()
    conn.close()
    store = RunStore(db)
    store.put(episode_row("seg-001", 0, two_segment_result(codec, versions=True).to_dict()))
    assert store.get("seg-001", 0)["max_version"] == 3
    store.close()
