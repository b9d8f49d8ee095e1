"""Replay files that script whole runs: per (instance, sample), the model's turns as text.

The ReplayEngine is real; only what the "model" says is scripted (a gold fix applied with
bash, or an empty submission), so runs are deterministic and need no model weights to
generate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_helpers import call
from uniagent.models.base import Generation
from uniagent.models.replay import ReplayRecord
from uniagent.tasks.base import Task
from uniagent.tokens import ChatCodec


def gold_turns(task: Task) -> list[str]:
    patch = task.row["patch"]
    apply = f"cat > /tmp/fix.diff <<'UA_EOF'\n{patch}UA_EOF\ngit apply /tmp/fix.diff && echo applied"
    return [call("bash", command=apply), call("submit")]


def write_turns(
    path: Path,
    codec: ChatCodec,
    plan: dict[str, list[str]],
    logprobs: Callable[[int], list[float]] = lambda n: [-0.1] * n,
) -> Path:
    """A replay file: for each request id (`INSTANCE#SAMPLE`) the model's turns as text, in order.
    `logprobs(n)`: the logprobs of a turn of `n` tokens. The records carry no prompt (any prompt)."""
    lines = []
    for rid, turns in plan.items():
        for turn, text in enumerate(turns):
            ids = codec.encode(text) + codec.eot_ids
            rec = ReplayRecord(rid, Generation(ids, logprobs(len(ids)), "stop"), turn, None, "0" * 64)
            lines.append(json.dumps(rec.to_json()))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_replay(
    path: Path,
    codec: ChatCodec,
    tasks: list[Task],
    samples: int = 1,
    wrong: set[tuple[str, int]] | None = None,
    first: list[str] | None = None,
) -> Path:
    """Sample s of each task applies the gold patch, unless (id, s) is in `wrong` (empty submit).
    `first`: turns every episode begins with (e.g. a slow command, to be caught mid-run)."""
    plan = {}
    for task in tasks:
        for s in range(samples):
            turns = [call("submit")] if wrong and (task.instance_id, s) in wrong else gold_turns(task)
            plan[f"{task.instance_id}#{s}"] = [*(first or []), *turns]
    return write_turns(path, codec, plan)


def starter_run(replay: Path | str, out: Path, *options: str) -> list[str]:
    """`uniagent run` arguments: the starter suite, a replay model, output in `out`, then `options`."""
    head = ["run", "--tasks", "builtin:starter", "--model", f"replay:{replay}"]
    return [*head, "--output", str(out), *options]


def replay_run_args(
    replay: Path, out: Path, ids: list[str], *, samples: int | None = None, concurrency: int = 2,
    sets: list[str] = (),
) -> list[str]:  # fmt: skip
    """`uniagent run` arguments for starter tasks `ids` with a replay model, written to `out`
    (`sets`: extra `--set KEY=VALUE` overrides, after `tasks.ids`)."""
    args = starter_run(replay, out)
    if samples is not None:
        args += ["--samples", str(samples)]
    args += ["--concurrency", str(concurrency), "--set", f"tasks.ids=[{','.join(ids)}]"]
    for item in sets:
        args += ["--set", item]
    return args


def run_one_task(
    tmp_path: Path, codec: ChatCodec, task: Task, turns: list[str], *options: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`uniagent run` as a real CLI process on starter `task` alone, the model's `turns` replayed,
    then `options`; asserts it exits 0 and returns its summary and its one stored row."""
    replay = write_turns(tmp_path / "replay.jsonl", codec, {f"{task.instance_id}#0": turns})
    out = tmp_path / "run"
    args = starter_run(replay, out, "--set", f"tasks.ids=[{task.instance_id}]", *options)
    proc = subprocess.run(
        [sys.executable, "-m", "uniagent.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return summary, row
