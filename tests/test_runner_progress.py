"""Without a terminal (CI, nohup, a cluster job), `uniagent run` prints plain progress lines while
it runs, not only the summary at the end. Real CLI process with its stdout piped, real
sandboxes, scripted ReplayEngine turns with a simulated latency."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import needs_bwrap
from run_helpers import write_replay
from uniagent.runner.live import plain_line
from uniagent.runner.run import Progress
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

LINE = re.compile(
    r"^\[\d\d:\d\d:\d\d\] (\d+)/(\d+) done \| (\d+) resolved \| [\d.]+ ep/min \| exits .* \| eta "
)


def test_plain_line_counts_only_this_invocation_for_rate_and_eta() -> None:
    p = Progress(total=100, done=60, skipped=50)  # a resumed run: 50 were stored already
    p.exits.update({"finished": 8, "model_error": 2})
    p.started -= 60  # ten episodes in a minute
    line = plain_line(p)
    assert LINE.match(line), line
    assert "60/100 done" in line and "exits finished=8 model_error=2" in line
    assert p.episodes_per_min == pytest.approx(10, rel=0.05)
    assert 230 <= (p.eta_s or 0) <= 250, "40 left at 10/min: 4 minutes, not 40 s"
    assert line.isascii()


@needs_bwrap
def test_piped_stdout_gets_progress_lines_before_the_end(tmp_path: Path, smol_tokenizer) -> None:
    tasks = load_tasks("builtin:starter")[:3]
    replay = write_replay(tmp_path / "replay.jsonl", ChatCodec(smol_tokenizer), tasks)
    ids = ",".join(t.instance_id for t in tasks)
    cmd = [sys.executable, "-m", "uniagent.cli", "run", "--tasks", "builtin:starter"]
    cmd += ["--model", f"replay:{replay}", "--concurrency", "1", "--output", str(tmp_path / "run")]
    cmd += ["--set", f"tasks.ids=[{ids}]", "--set", "model.replay_delay_s=0.5"]
    cmd += ["--set", "runner.progress_interval_s=0.5"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    assert proc.stdout is not None
    seen: list[tuple[str, bool]] = []  # (line, the run was still going when it arrived)
    deadline = time.monotonic() + 600
    for raw in proc.stdout:
        seen.append((raw.rstrip("\n"), proc.poll() is None))
        assert time.monotonic() < deadline
    proc.wait(60)
    assert proc.returncode == 0, proc.stderr.read()[-3000:] if proc.stderr else ""
    progress = [(line, live) for line, live in seen if LINE.match(line)]
    assert progress, [line for line, _ in seen]
    done_counts = [int(LINE.match(line).group(1)) for line, _ in progress]  # type: ignore[union-attr]
    assert done_counts[0] == 0 and done_counts[-1] == 3 and done_counts == sorted(done_counts)
    mid = [line for line, live in progress if live and int(LINE.match(line).group(1)) < 3]  # type: ignore[union-attr]
    assert mid, "lines arrived while the run was going, before its end"
    assert len(done_counts) > len(set(done_counts)), "the timer prints between episodes too"
    assert any(line.startswith("results:") for line, _ in seen)
