"""Grade SWE-bench-format predictions in sandboxes (`uniagent verify`).

Each prediction gets a fresh sandbox prepared exactly as for an episode (repo at base, history
scrubbed); its patch is graded by the task's own verifier. A patch that does not apply, a patch
refused because it changes how the tests run (`uniagent.tasks.guard`), or an environment that
fails, is an error with its reason, never a silent "unresolved".
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniagent import sandbox as sandboxes
from uniagent.errors import ConfigError, SandboxError
from uniagent.sandbox.config import SandboxConfig
from uniagent.tasks.harbor import HarborTask
from uniagent.tasks.loading import load_rows
from uniagent.tasks.swe import PatchApplyError, SweTask

log = logging.getLogger(__name__)


def load_predictions(path: str | Path) -> dict[str, dict[str, Any]]:
    rows = load_rows(path)
    preds: dict[str, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        if "instance_id" not in row or "model_patch" not in row:
            raise ConfigError(f"{path} row {i}: a prediction needs `instance_id` and `model_patch`")
        preds[str(row["instance_id"])] = row
    return preds


async def grade_one(
    task: SweTask | HarborTask, patch: str, sandbox_cfg: SandboxConfig | None
) -> dict[str, Any]:
    """One prediction graded in a fresh sandbox; a Harbor task runs its own solution (the
    oracle) instead of a patch."""
    t0 = time.perf_counter()
    task = copy.copy(task)  # setup() records per-sandbox state
    out: dict[str, Any] = {"instance_id": task.instance_id}
    try:
        async with sandboxes.create(task.sandbox_config(sandbox_cfg)) as sb:
            await task.setup(sb)
            if isinstance(task, HarborTask):
                reward = await task.grade_oracle(sb)
            else:
                reward = await task.grade_patch(sb, patch or "")
        out.update(status="resolved" if reward.resolved else "unresolved", reward=reward.value)
        out["details"] = {k: v for k, v in reward.details.items() if k != "status_map"}
        if reward.details.get("refused"):  # it changes how the tests run: not graded
            out.update(status="error", error=f"patch refused: {reward.details['refused']}")
    except PatchApplyError as exc:
        out.update(status="error", error=f"patch does not apply: {exc}")
    except (SandboxError, OSError, TimeoutError, ConfigError) as exc:
        out.update(status="error", error=f"environment failed: {exc}")
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


async def verify(
    tasks: list[SweTask | HarborTask],
    predictions: dict[str, dict[str, Any]] | None,
    output: Path,
    concurrency: int = 4,
    sandbox_cfg: SandboxConfig | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`predictions=None` grades each task's gold patch (a Harbor task's solution/solve.sh)."""
    by_id = {t.instance_id: t for t in tasks}
    if predictions is not None and any(isinstance(t, HarborTask) for t in tasks):
        raise ConfigError("Harbor tasks take no patch predictions: verify them with --gold")
    if predictions is not None:
        unknown = sorted(set(predictions) - set(by_id))
        if unknown:
            raise ConfigError(f"predictions for unknown instances: {', '.join(unknown[:5])}")
        jobs = [(by_id[i], p.get("model_patch") or "") for i, p in predictions.items()]
    else:
        jobs = [(t, "" if isinstance(t, HarborTask) else t.gold_patch) for t in tasks]
    sem = asyncio.Semaphore(concurrency)

    async def run(task: SweTask | HarborTask, patch: str) -> dict[str, Any]:
        async with sem:
            res = await grade_one(task, patch, sandbox_cfg)
        if progress:
            progress(res)
        return res

    t0 = time.perf_counter()
    results = await asyncio.gather(*(run(t, p) for t, p in jobs))
    report = {
        "total_instances": len(tasks),
        "submitted_instances": len(jobs),
        "resolved_instances": sum(r["status"] == "resolved" for r in results),
        "unresolved_instances": sum(r["status"] == "unresolved" for r in results),
        "error_instances": sum(r["status"] == "error" for r in results),
        "resolved_ids": sorted(r["instance_id"] for r in results if r["status"] == "resolved"),
        "unresolved_ids": sorted(r["instance_id"] for r in results if r["status"] == "unresolved"),
        "error_ids": sorted(r["instance_id"] for r in results if r["status"] == "error"),
        "seconds": round(time.perf_counter() - t0, 2),
        "instances": {r["instance_id"]: r for r in results},
    }
    output.mkdir(parents=True, exist_ok=True)
    tmp = output / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(output / "report.json")
    return report
