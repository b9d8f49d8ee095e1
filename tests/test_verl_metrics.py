"""uniagent's figures in verl's step metrics, and the progress line printed from verl's metrics file.

`step_metrics` is checked on columns shaped as verl's agent-loop worker makes them (numpy object
arrays of the loop's extra fields; `test_verl_loop.py` checks it on a batch from the real worker);
the plugin is checked in a fresh process, as verl loads it (`VERL_USE_EXTERNAL_MODULES`), on both
trainers' `compute_data_metrics`; the follower reads rows written by verl's own `FileLogger`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import require_module
from uniagent.integrations.verl.launch import metrics_file
from uniagent.integrations.verl.metrics import step_metrics
from uniagent.integrations.verl.progress import MetricsFollower, follow, progress_line

verl = require_module("verl", "verl is the training backend (pip install -e .[verl])")

from verl.utils.tracking import FileLogger  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"


def column(values: list[Any]) -> np.ndarray:
    """A non-tensor column as verl's `AgentLoopWorker._postprocess` builds it."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def batch(**columns: list[Any]) -> dict[str, np.ndarray]:
    return {k: column(v) for k, v in columns.items()}


def test_step_metrics_count_exits_trainable_drift_segments_and_versions() -> None:
    nt = batch(
        exit_reason=["finished", "max_turns", "sandbox_dead", "finished"],
        trainable=[True, True, False, True],
        no_gradient=[None, "unfinished", None, None],
        drift=[None, 17, None, None],
        segments=[1, 3, 0, 2],
        segments_dropped=[0, 2, 0, 1],
        dropped_model_tokens=[0, 40, 0, 9],
        resumed_turns=[0, 1, 0, 0],
        min_global_steps=[4, 3, None, 5],
        max_global_steps=[4, 5, None, 5],
    )
    nt["resolved"] = np.array([1.0, 0.0, 0.0, 1.0])  # reward_extra_info: a float column
    assert step_metrics(nt) == {
        "uniagent/episodes": 4.0,
        "uniagent/exit/finished": 2.0,
        "uniagent/exit/max_turns": 1.0,
        "uniagent/exit/sandbox_dead": 1.0,
        "uniagent/trainable_frac": 0.75,
        "uniagent/untrainable": 1.0,
        "uniagent/resolved_rate": pytest.approx(2 / 3),
        "uniagent/no_gradient": 1.0,
        "uniagent/drift": 1.0,
        "uniagent/segments/mean": 1.5,
        "uniagent/segments/max": 3.0,
        "uniagent/segments_dropped": 3.0,
        "uniagent/dropped_model_tokens": 49.0,
        "uniagent/resumed_turns": 1.0,
        "uniagent/policy_version/min": 3.0,
        "uniagent/policy_version/max": 5.0,
    }
    # versions unknown (a rollout that reports none): no version keys, not a zero
    unknown = step_metrics(batch(exit_reason=["finished"], min_global_steps=[None], max_global_steps=[None]))
    assert unknown == {"uniagent/episodes": 1.0, "uniagent/exit/finished": 1.0}
    # a batch from another agent loop: nothing of ours
    assert step_metrics(batch(__num_turns__=[2, 3])) == {}


_PLUGIN_CHECK = r"""
import json
import numpy as np
import torch
import verl
from verl import DataProto
import verl.trainer.ppo.ray_trainer as legacy
import verl.experimental.separation.ray_trainer as separated

n, p, r = 2, 3, 4
tensors = {
    "prompts": torch.ones(n, p, dtype=torch.long), "responses": torch.ones(n, r, dtype=torch.long),
    "attention_mask": torch.ones(n, p + r, dtype=torch.long), "response_mask": torch.ones(n, r),
    "token_level_scores": torch.zeros(n, r), "token_level_rewards": torch.zeros(n, r),
    "advantages": torch.zeros(n, r), "returns": torch.zeros(n, r),
}
def col(values):
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
data = DataProto.from_dict(tensors, non_tensors={"exit_reason": col(["finished", "max_turns"]),
                                                 "trainable": col([True, True])})
print(json.dumps({
    "same": legacy.compute_data_metrics is separated.compute_data_metrics,
    "metrics": {k: float(v) for k, v in legacy.compute_data_metrics(batch=data, use_critic=False).items()},
}))
"""


def test_the_plugin_adds_them_to_both_trainers_step_metrics() -> None:
    """In a fresh process, as verl loads plugins (inside `import verl`): the legacy and the
    fully-async trainer's `compute_data_metrics` return verl's metrics and ours."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "VERL_USE_EXTERNAL_MODULES": "uniagent.integrations.verl.plugin",
    }
    out = subprocess.run(
        [sys.executable, "-c", _PLUGIN_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["same"]
    metrics = seen["metrics"]
    assert metrics["critic/score/mean"] == 0.0 and metrics["response_length/mean"] == 4.0  # verl's own
    assert metrics["uniagent/exit/finished"] == 1 and metrics["uniagent/exit/max_turns"] == 1
    assert metrics["uniagent/trainable_frac"] == 1.0


def test_metrics_file_sits_beside_the_checkpoints(tmp_path: Path) -> None:
    """verl's file logger writes where the dashboard looks: `trainer.output/metrics.jsonl`."""
    ckpt = f"trainer.default_local_dir={tmp_path}/out/checkpoints"
    assert metrics_file(["trainer.logger=[console,file]", ckpt]) == tmp_path / "out/metrics.jsonl"
    assert metrics_file(["trainer.logger=['console','file']", f"trainer.default_local_dir={tmp_path}/x"]) == (
        tmp_path / "x/metrics.jsonl"
    )
    assert metrics_file(["trainer.logger=[console]", ckpt]) is None  # no file logger
    interpolated = "trainer.default_local_dir=checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    assert metrics_file(["trainer.logger=[console,file]", interpolated]) is None


# -- the progress line -----------------------------------------------------------------------------------
def verl_step(step: int, reward: float) -> dict[str, Any]:
    """The metrics verl's legacy trainer logs for a step (a few of them), with ours."""
    return {
        "training/global_step": step,
        "critic/score/mean": reward,
        "timing_s/step": 118.25,
        "timing_s/gen": 20.0,
        "perf/throughput": 412.4,
        "response_length/mean": 90.0,
        "uniagent/episodes": 4.0,
        "uniagent/resolved_rate": 0.25,
        "uniagent/exit/finished": 3.0,
        "uniagent/exit/max_turns": 1.0,
    }


def test_progress_line_is_one_short_plain_line() -> None:
    line = progress_line(3, verl_step(3, 0.3125), 20)
    assert line == (
        "[uniagent] step 3/20 | reward 0.312 | resolved 0.250 | 118.2 s/step | 412 tok/s"
        " | exits finished=3 max_turns=1"
    )
    assert "\r" not in line and "\n" not in line
    assert progress_line(1, {"training/global_step": 1}, None) == "[uniagent] step 1/?"


def test_follower_prints_each_trained_step_once_from_a_growing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's FileLogger writes the rows (as in a run: a fully-async step logs its timings first,
    then the step); the follower, polled as the file grows, prints each trained step once."""
    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = FileLogger("uniagent", "run")
    follower = MetricsFollower(path, total_steps=2)
    assert follower.poll() == []  # the file is there, empty
    logger.log({"timing_s/param_sync": 1.5}, step=1)  # no training/global_step: no line
    assert follower.poll() == []
    logger.log(verl_step(1, 0.5), step=1)
    logger.fp.write(b'{"step": 2, "data": {"training/gl')  # a row caught half-written: left for later
    lines = follower.poll()
    assert len(lines) == 1 and lines[0].startswith("[uniagent] step 1/2 | reward 0.500")
    logger.fp.write(b'obal_step": 2, "critic/score/mean": 0.75}}\n')
    logger.log({"val-core/uniagent/reward/mean@1": 0.5}, step=2)  # validation after: no second line
    assert follower.poll() == ["[uniagent] step 2/2 | reward 0.750"]
    assert follower.poll() == []
    logger.finish()

    # `follow`, as the launch runs it: a thread until verl ends, then a last read
    path.unlink()
    seen: list[str] = []
    done = threading.Event()
    thread = threading.Thread(target=follow, args=(path, 2, done, seen.append, 0.01))
    thread.start()
    logger = FileLogger("uniagent", "run")
    logger.log(verl_step(1, 0.5), step=1)
    logger.log(verl_step(2, 0.25), step=2)
    logger.finish()
    done.set()
    thread.join(timeout=10)
    assert [line.split(" | ")[0:2] for line in seen] == [
        ["[uniagent] step 1/2", "reward 0.500"],
        ["[uniagent] step 2/2", "reward 0.250"],
    ]


def test_a_resumed_run_keeps_the_rows_of_the_steps_it_had_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's FileLogger truncates the file it opens: before a resumed launch the rows up to the
    checkpointed step go aside (the dashboard reads them first), after it they are one file again;
    a run with no checkpoint starts afresh."""
    from uniagent.dashboard.training import read_metrics_live
    from uniagent.integrations.verl.progress import CHECKPOINT_MARK, join_rows, keep_trained_rows
    from uniagent.train.verl_rows import EARLIER

    path, ckpt = tmp_path / "metrics.jsonl", tmp_path / "checkpoints"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    first = FileLogger("uniagent", "run")  # run A: step 1 trained and saved, step 2 logged, then lost
    first.log(verl_step(1, 0.25), step=1)
    first.log(verl_step(2, 0.5), step=2)
    first.finish()
    ckpt.mkdir()
    (ckpt / CHECKPOINT_MARK).write_text("1")
    keep_trained_rows(path, ckpt)
    assert not path.exists() and [r["step"] for r in read_metrics_live(path)[0]] == [1]
    resumed = FileLogger("uniagent", "run")  # run B resumes at step 2
    resumed.log(verl_step(2, 0.75), step=2)
    rows = read_metrics_live(path)[0]  # while it runs: both files
    assert [(r["step"], r["reward_mean"]) for r in rows] == [(1, 0.25), (2, 0.75)]
    resumed.finish()
    join_rows(path)
    assert not (tmp_path / EARLIER).exists()
    assert [(r["step"], r["reward_mean"]) for r in read_metrics_live(path)[0]] == [(1, 0.25), (2, 0.75)]

    (ckpt / CHECKPOINT_MARK).unlink()  # no checkpoint: a fresh run, the old rows go
    keep_trained_rows(path, ckpt)
    assert not path.exists() and not (tmp_path / EARLIER).exists()
