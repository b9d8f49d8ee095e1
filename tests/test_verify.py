"""`uniagent verify` on the bundled starter suite, and search-QA episodes, for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_helpers import call, scripted_model
from conftest import needs_bwrap
from uniagent.agent import ExitReason
from uniagent.tasks import load_tasks, run_episode
from uniagent.tasks.search import exact_match, f1_score
from uniagent.tokens import ChatCodec

pytestmark = needs_bwrap
CLI = [sys.executable, "-m", "uniagent.cli"]


def verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "verify", *args], capture_output=True, text=True, timeout=900, env=os.environ
    )


def test_gold_resolves_everything_and_empty_nothing(tmp_path: Path) -> None:
    tasks = load_tasks("builtin:starter")
    proc = verify("--tasks", "builtin:starter", "--gold", "--output", str(tmp_path / "gold"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "gold" / "report.json").read_text())
    assert report["resolved_ids"] == sorted(t.instance_id for t in tasks)
    assert report["error_ids"] == [] and report["unresolved_ids"] == []
    witnessed = {i: r["details"]["witness"] for i, r in report["instances"].items()}
    assert witnessed == {t.instance_id: "used" for t in tasks}, "the CLI's report says how each was graded"

    preds = tmp_path / "preds.jsonl"
    rows = [{"instance_id": t.instance_id, "model_name_or_path": "empty", "model_patch": ""} for t in tasks]
    broken = "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1,1 +1,1 @@\n-x = 1\n+x = 2\n"
    rows[0]["model_patch"] = broken
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = verify(
        "--tasks", "builtin:starter", "--predictions", str(preds), "--output", str(tmp_path / "empty")
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "empty" / "report.json").read_text())
    assert report["resolved_ids"] == []
    assert report["error_ids"] == [tasks[0].instance_id]
    assert "does not apply" in report["instances"][tasks[0].instance_id]["error"]
    assert len(report["unresolved_ids"]) == len(tasks) - 1


def test_bad_inputs_give_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "x"}\n')
    proc = verify("--tasks", "builtin:starter", "--predictions", str(bad))
    assert proc.returncode == 2 and "model_patch" in proc.stderr and "Traceback" not in proc.stderr
    proc = verify("--tasks", str(tmp_path / "missing.jsonl"), "--gold")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    bad.write_text('{"instance_id": "nope", "model_patch": ""}\n')
    proc = verify("--tasks", "builtin:starter", "--predictions", str(bad))
    assert proc.returncode == 2 and "unknown instances" in proc.stderr


def test_search_metrics_use_squad_normalisation() -> None:
    assert exact_match("The Velmora Islands.", ["velmora islands"]) == 1.0
    assert f1_score("Port of Ormen", ["Ormen"]) == pytest.approx(0.5)
    assert exact_match("", ["x"]) == 0.0


async def test_search_episode_right_and_wrong_answers(codec: ChatCodec) -> None:
    task = load_tasks("builtin:search")[0]
    answer = task.answers[0]
    script = [call("search", query=task.row["question"], k=3), call("finish", answer=answer)]
    res = await run_episode(task, scripted_model(codec, script))
    assert res.exit_reason == ExitReason.FINISHED and res.resolved, res.error
    observation = res.messages[3]["content"]
    assert any(sid in observation for sid in task.row["supporting_ids"]), "BM25 finds a supporting passage"
    res = await run_episode(task, scripted_model(codec, [call("finish", answer="Atlantis")]))
    assert res.exit_reason == ExitReason.FINISHED and res.reward and res.reward.value == 0.0 and res.trainable
