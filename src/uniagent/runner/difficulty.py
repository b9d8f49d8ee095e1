"""Difficulty filtering of made tasks (`uniagent tasks make --filter-k K --model SPEC`).

A row a model solves in every one of K samples teaches it nothing, one it never solves gives no
signal either (an RL curriculum's reward would be constant): both are dropped. The K samples are
an ordinary `uniagent run` (its store in OUT/filter-run, so an interrupted filter resumes); the
unfiltered rows stay in OUT/tasks.all.jsonl, each kept row records its pass rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from uniagent import jsonio
from uniagent.runner.config import build_config
from uniagent.runner.run import run
from uniagent.runner.store import STORE_NAME, RunStore, store_path


def _rows(path: Path) -> list[dict[str, Any]]:
    return [jsonio.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def filter_rows(
    out: Path, model: str, k: int, sandbox: dict[str, Any] | None = None, sets: list[str] | None = None
) -> dict[str, Any]:
    """Run `model` k times on OUT/tasks.jsonl and keep the rows solved 1..k-1 times."""
    all_rows = out / "tasks.all.jsonl"
    if not all_rows.exists():
        jsonio.write_text_atomic(all_rows, (out / "tasks.jsonl").read_text())
    rows = _rows(all_rows)
    run_dir = out / "filter-run"
    flags: dict[str, Any] = {
        "tasks.spec": str(all_rows),
        "model.spec": model,
        "runner.samples": k,
        "runner.output": str(run_dir),
        "runner.resume": True if (run_dir / STORE_NAME).exists() else None,
    }
    if sandbox:
        flags["sandbox.type"] = sandbox.get("type")
    await run(build_config(None, sets or [], flags))
    solved: dict[str, int] = {}
    store = RunStore(store_path(run_dir), readonly=True)
    try:
        for r in store.rows(full=False):
            solved[r["instance_id"]] = solved.get(r["instance_id"], 0) + int(r["resolved"])
    finally:
        store.close()
    kept = []
    for row in rows:
        n = solved.get(row["instance_id"], 0)
        if 0 < n < k:
            kept.append({**row, "pass_rate": n / k})
    jsonio.write_text_atomic(out / "tasks.jsonl", "".join(jsonio.dumps(r) + "\n" for r in kept))
    return {
        "k": k,
        "rows": len(rows),
        "kept": len(kept),
        "always_solved": sum(solved.get(r["instance_id"], 0) == k for r in rows),
        "never_solved": sum(solved.get(r["instance_id"], 0) == 0 for r in rows),
    }
