"""Run-level figures and the export files, always computed from the store (the one truth)."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any

from uniagent import jsonio
from uniagent.runner.export import SEGMENTS_JSONL, segment_records
from uniagent.runner.store import RunStore


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(store: RunStore, wall_s: float | None = None, total: int | None = None) -> dict[str, Any]:
    rows = list(store.rows(full=False))
    n = len(rows)
    exits = collections.Counter(r["exit_reason"] for r in rows)
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    per_task: dict[str, list[bool]] = collections.defaultdict(list)
    for r in rows:
        per_task[r["instance_id"]].append(r["resolved"])
    ks = sorted({1, *(len(v) for v in per_task.values())}) if per_task else [1]
    pass_k = {
        f"pass@{k}": round(sum(pass_at_k(len(v), sum(v), k) for v in per_task.values()) / len(per_task), 4)
        for k in ks
        if per_task and all(len(v) >= k for v in per_task.values())
    }
    tokens = sum(r["completion_tokens"] for r in rows)
    wall = wall_s if wall_s is not None else store.meta("wall_s", None)
    # A sampled retokenization is harmless (the record keeps the sampled ids), template drift is
    # expected (model.history: exact with a template that rewrites earlier turns); only bookkeeping
    # drift is a problem. Drift without a kind (a store from before kinds) counts as bookkeeping.
    drift_kinds = collections.Counter(
        r.get("drift_kind") or "bookkeeping" for r in rows if r["drift"] is not None
    )
    return {
        "episodes": n,
        "planned": total if total is not None else store.meta("planned", n),
        "tasks": len(per_task),
        "resolved": sum(r["resolved"] for r in rows),
        "resolved_rate": round(sum(r["resolved"] for r in rows) / n, 4) if n else 0.0,
        **pass_k,
        "mean_reward": round(sum(rewards) / len(rewards), 4) if rewards else None,
        "exit_reasons": dict(sorted(exits.items())),
        "trainable_fraction": round(sum(r["trainable"] for r in rows) / n, 4) if n else 0.0,
        "episodes_with_bookkeeping_drift": drift_kinds["bookkeeping"],
        "episodes_with_sampled_retokenization": drift_kinds["sampled"],
        "episodes_with_template_drift": drift_kinds["template"],
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2) if wall else None,
        "episodes_per_min": round(60 * n / wall, 2) if wall else None,
        "wall_s": round(wall, 2) if wall else None,
    }


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def export(store: RunStore, out: Path, model_name: str, wall_s: float | None = None) -> dict[str, Any]:
    """results.jsonl, preds.jsonl (SWE-bench predictions), segments.jsonl (one training record per
    segment: `uniagent.runner.export`) and summary.json."""
    results, preds, segments = [], [], []
    for r in store.rows(full=True):  # one pass: decoding the rows' token lists is a third of the time
        results.append(jsonio.dumps(r))
        segments.extend(jsonio.dumps(s) for s in segment_records(r))
        if r["sample"] == 0 and r.get("patch") is not None:
            preds.append(
                jsonio.dumps(
                    {
                        "instance_id": r["instance_id"],
                        "model_name_or_path": model_name,
                        "model_patch": r["patch"],
                    }
                )
            )
    _atomic_write(out / "results.jsonl", "".join(line + "\n" for line in results))
    _atomic_write(out / "preds.jsonl", "".join(line + "\n" for line in preds))
    _atomic_write(out / SEGMENTS_JSONL, "".join(line + "\n" for line in segments))
    summary = summarize(store, wall_s)
    _atomic_write(out / "summary.json", json.dumps(summary, indent=2))
    return summary
