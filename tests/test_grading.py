"""Where an episode is graded (`uniagent.tasks.grading`) and what a failed grading gives.

Part 3: an agent's patch is graded in a fresh sandbox of its task by default, so what the agent
leaves behind (a background process rewriting the tests, a module outside the workspace that the
tests import) cannot reach the tests; under `agent.grade_in: same` the same cheats work, which is
what shows the tests bite. Part 4: a verifier past `verifier_timeout_s`, a sandbox killed while
grading, a run cancelled while grading: their exit reason and trainability, through the real flow
(`run_episode`). Scripted model turns (real ReplayEngine), real tools, real bubblewrap sandboxes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from agent_helpers import call, make_swe_task_file, scripted_model
from conftest import needs_bwrap
from uniagent.agent import AgentConfig, ExitReason, Reward
from uniagent.sandbox.base import Sandbox
from uniagent.tasks import load_tasks, run_episode
from uniagent.tasks.swe import SweTask
from uniagent.tokens import ChatCodec

pytestmark = needs_bwrap

# Waits until the graded run has put the hidden test (test_add) in place, then replaces the test
# file with tests that pass, again and again: a process the agent leaves running.
REWRITER = (
    "setsid nohup bash -c 'while true; do "
    "if grep -q test_add tests/test_calc.py 2>/dev/null; then "
    'printf "def test_add():\\n    pass\\n\\n\\ndef test_neg():\\n    pass\\n" > tests/test_calc.py; fi; '
    "sleep 0.002; done' >/dev/null 2>&1 &"
)
# A module outside the workspace that the tests import: the task's test command puts a directory
# under /tmp on the path (as a container image's writable site-packages would be), and the agent
# puts a sitecustomize there that fixes `calc.add` on import, while the repository keeps the bug.
SITE = "/tmp/site"
CUSTOMIZE = (
    "import builtins\n"
    "_real = builtins.__import__\n"
    "def _imp(name, *a, **k):\n"
    "    m = _real(name, *a, **k)\n"
    "    if name == 'calc':\n"
    "        m.add = lambda a, b: a + b\n"
    "    return m\n"
    "builtins.__import__ = _imp\n"
)
OUTSIDE = f"mkdir -p {SITE} && cat > {SITE}/sitecustomize.py <<'EOF'\n{CUSTOMIZE}EOF"


@pytest.fixture
def task(tmp_path: Path) -> SweTask:
    [t] = load_tasks(str(make_swe_task_file(tmp_path)))
    assert isinstance(t, SweTask)
    return t


@pytest.fixture
def site_task(tmp_path: Path) -> SweTask:
    """The task with `SITE` on its tests' path."""
    path = make_swe_task_file(tmp_path)
    row = json.loads(path.read_text())
    row["test_cmd"] = f"PYTHONPATH={SITE} {row['test_cmd']}"
    path.write_text(json.dumps(row) + "\n")
    [t] = load_tasks(str(path))
    assert isinstance(t, SweTask)
    return t


async def _episode(task: SweTask, codec: ChatCodec, command: str, **cfg: Any) -> Any:
    script = [call("bash", command=command), call("submit")]
    return await run_episode(task, scripted_model(codec, script), AgentConfig(**cfg))


async def test_a_background_process_rewriting_the_tests_cannot_reach_fresh_grading(
    task: SweTask, codec: ChatCodec
) -> None:
    res = await _episode(task, codec, REWRITER)
    assert res.exit_reason == ExitReason.FINISHED and res.trainable
    assert res.metrics["graded_in"] == "fresh" and "grade_sandbox_s" in res.metrics
    assert res.reward is not None and not res.resolved, res.reward.details.get("log_tail")
    # The same agent graded where it acted: its process rewrites the hidden tests and passes. The
    # rewrite races the grader's pytest (it must land between the hidden test's copy and pytest
    # reading the file), which a loaded machine can lose; the cheat reaching `same` once in a few
    # tries is what shows the test bites, while `fresh` above must hold every time.
    outcomes = []
    for _ in range(5):
        same = await _episode(task, codec, REWRITER, grade_in="same")
        assert same.metrics["graded_in"] == "same"
        outcomes.append(same.exit_reason)
        if same.resolved or same.exit_reason == ExitReason.VERIFIER_ERROR:
            break
    else:
        pytest.fail(f"the cheat never reached `same` in 5 tries: {outcomes}")


async def test_a_module_outside_the_workspace_that_the_tests_import_cannot_reach_fresh_grading(
    site_task: SweTask, codec: ChatCodec
) -> None:
    task = site_task
    res = await _episode(task, codec, OUTSIDE)
    assert res.exit_reason == ExitReason.FINISHED and res.trainable
    assert res.patch == "", "the cheat lives outside the workspace: no patch"
    assert res.reward is not None and not res.resolved
    same = await _episode(task, codec, OUTSIDE, grade_in="same")
    assert same.resolved, "the cheat reaches `same` (the test bites)"


async def test_a_real_fix_still_resolves_in_a_fresh_sandbox(task: SweTask, codec: ChatCodec) -> None:
    fix = call("str_replace_editor", command="str_replace", path="calc.py", old_str="a - b", new_str="a + b")
    res = await run_episode(task, scripted_model(codec, [fix, call("submit")]))
    assert res.exit_reason == ExitReason.FINISHED and res.resolved and res.trainable
    assert "a + b" in (res.patch or "")


# -- part 4: the failure paths of grading ------------------------------------------------------


async def test_a_verifier_past_its_timeout_is_verifier_error_untrainable(
    task: SweTask, codec: ChatCodec
) -> None:
    async def slow(sandbox: Sandbox | None, result: Any) -> Reward:
        await asyncio.sleep(30)
        return Reward(1.0, True)

    task.score = slow  # type: ignore[method-assign]
    for where in ("fresh", "same"):
        res = await _episode(task, codec, "echo hi", verifier_timeout_s=0.5, grade_in=where)
        assert res.exit_reason == ExitReason.VERIFIER_ERROR, (where, res.error)
        assert "verifier_timeout_s" in (res.error or "")
        assert not res.trainable and res.reward is None


def _kill_bwrap(sandbox: Sandbox) -> None:
    """The backend killed from outside, as a host OOM killer or an operator would: bwrap itself."""
    proc = sandbox._proc  # type: ignore[attr-defined]
    os.kill(proc.pid, signal.SIGKILL)


async def test_a_sandbox_killed_while_grading_is_sandbox_dead_untrainable(
    task: SweTask, codec: ChatCodec
) -> None:
    async def killed(sandbox: Sandbox | None, result: Any) -> Reward:
        assert sandbox is not None
        _kill_bwrap(sandbox)
        await asyncio.sleep(0.3)
        await sandbox.exec("python -m pytest tests", timeout=60, session="_verify")  # as the grader would
        return Reward(1.0, True)

    task.score = killed  # type: ignore[method-assign]
    for where in ("fresh", "same"):
        res = await _episode(task, codec, "echo hi", grade_in=where)
        assert res.exit_reason == ExitReason.SANDBOX_DEAD, (where, res.exit_reason, res.error)
        assert "verification" in (res.error or "")
        assert not res.trainable and res.reward is None


async def test_a_run_cancelled_while_grading_is_cancelled_untrainable(
    task: SweTask, codec: ChatCodec
) -> None:
    grading = asyncio.Event()

    async def hangs(sandbox: Sandbox | None, result: Any) -> Reward:
        grading.set()
        await asyncio.Event().wait()
        raise AssertionError("not reached")

    task.score = hangs  # type: ignore[method-assign]
    for where in ("fresh", "same"):
        grading.clear()
        running = asyncio.ensure_future(_episode(task, codec, "echo hi", grade_in=where))
        await asyncio.wait_for(grading.wait(), 120)
        running.cancel()
        res = await asyncio.wait_for(running, 60)
        assert res.exit_reason == ExitReason.CANCELLED and "verification" in (res.error or ""), where
        assert not res.trainable and res.reward is None


async def test_answer_graded_tasks_get_no_sandbox(codec: ChatCodec) -> None:
    [t] = load_tasks("builtin:lookup-easy")[:1]
    seen: list[Any] = []
    original = t.score

    async def score(sandbox: Sandbox | None, result: Any) -> Reward:
        seen.append(sandbox)
        return await original(sandbox, result)

    t.score = score  # type: ignore[method-assign]
    res = await run_episode(t, scripted_model(codec, [call("finish", answer=t.answer)]))  # type: ignore[attr-defined]
    assert res.resolved and res.trainable and seen == [None] and res.metrics["graded_in"] == "none"
