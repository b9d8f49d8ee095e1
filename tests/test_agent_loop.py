"""AgentInteraction end to end: scripted model turns (ReplayEngine), real tools, real
bubblewrap sandboxes, the real swebench grader. One test per way an episode can end."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_helpers import call, scripted_model, swe_task
from conftest import needs_bwrap
from test_openai_chat import SECRET, endpoint, server  # noqa: F401 - fixtures: a stand-in endpoint
from test_openai_chat import model as oa_model
from uniagent.agent import AgentConfig, ExitReason, Reward
from uniagent.tasks import run_episode
from uniagent.tasks.swe import SweTask
from uniagent.tokens import ChatCodec

pytestmark = needs_bwrap

FIX = [
    call("bash", command="cat calc.py"),
    call("str_replace_editor", command="str_replace", path="calc.py", old_str="a - b", new_str="a + b"),
    call("submit"),
]


@pytest.fixture
def task(tmp_path: Path) -> SweTask:
    return swe_task(tmp_path)


async def test_correct_fix_resolves_with_an_exact_trajectory(task: SweTask, codec: ChatCodec) -> None:
    res = await run_episode(task, scripted_model(codec, FIX))
    assert res.exit_reason == ExitReason.FINISHED and res.trainable, res.error
    assert res.reward and res.reward.value == 1.0 and res.resolved
    assert res.reward.details["resolution"] == "RESOLVED_FULL"
    assert "+    return a + b" in (res.patch or "")
    traj = res.trajectory
    assert traj is not None and traj.drift is None
    traj.validate()
    assert res.metrics["turns"] == 3 and res.metrics["tool_calls"] == 3
    assert [m["role"] for m in res.messages][-1] == "tool"


async def test_empty_submission_scores_zero_but_is_trainable(task: SweTask, codec: ChatCodec) -> None:
    res = await run_episode(task, scripted_model(codec, [call("submit")]))
    assert res.exit_reason == ExitReason.FINISHED and res.trainable
    assert res.reward and res.reward.value == 0.0 and not res.resolved


async def test_editing_the_tests_cannot_fake_a_pass(task: SweTask, codec: ChatCodec) -> None:
    cheat = [
        call("bash", command="printf 'def test_add():\\n    pass\\n' > tests/test_calc.py"),
        call(
            "bash",
            command=(
                "printf 'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\n"
                "def pytest_runtest_makereport(item, call):\\n    o = yield\\n    r = o.get_result()\\n"
                '    r.outcome = "passed"\\n\' > conftest.py'
            ),
        ),
        call("submit"),
    ]
    res = await run_episode(task, scripted_model(codec, cheat))
    assert res.exit_reason == ExitReason.FINISHED
    assert res.reward and res.reward.value == 0.0, res.reward.details.get("log_tail")
    assert set(res.reward.details["ignored_test_changes"]) == {"tests/test_calc.py", "conftest.py"}


async def test_garbage_output_ends_in_format_errors(task: SweTask, codec: ChatCodec) -> None:
    garbage = ["I think the answer is 42.", "<tool_call>{not json</tool_call>", "\x00\x01 ??? <tool_call>"]
    res = await run_episode(task, scripted_model(codec, garbage), AgentConfig(max_format_errors=3))
    assert res.exit_reason == ExitReason.FORMAT_ERRORS and res.trainable
    assert res.reward is not None and res.reward.value == 0.0
    assert res.metrics["format_errors"] == 3


async def test_hung_commands_spend_the_timeout_budget(task: SweTask, codec: ChatCodec) -> None:
    script = [call("bash", command="sleep 100", timeout=0.3)] * 3 + [call("submit")]
    res = await run_episode(task, scripted_model(codec, script), AgentConfig(timeout_budget=2))
    assert res.exit_reason == ExitReason.TIMEOUT_BUDGET and res.trainable
    assert res.metrics["tool_timeouts"] == 2 and res.metrics["budget_hit"] == "tool_timeouts"


async def test_max_turns_and_submit_on_the_last_turn(task: SweTask, codec: ChatCodec) -> None:
    res = await run_episode(task, scripted_model(codec, FIX), AgentConfig(max_turns=3))
    assert res.exit_reason == ExitReason.FINISHED and res.resolved
    res = await run_episode(task, scripted_model(codec, FIX), AgentConfig(max_turns=2))
    assert res.exit_reason == ExitReason.MAX_TURNS and res.trainable
    assert res.reward is not None and res.reward.value == 1.0, "the verifier grades the state reached"


async def test_context_limit(task: SweTask, codec: ChatCodec) -> None:
    res = await run_episode(task, scripted_model(codec, FIX), AgentConfig(max_context_tokens=300))
    assert res.exit_reason == ExitReason.CONTEXT_LIMIT and res.trainable


async def test_crashing_verifier_is_verifier_error_never_zero(task: SweTask, codec: ChatCodec) -> None:
    async def crash(sandbox, result) -> Reward:
        raise RuntimeError("grader bug")

    task.score = crash  # type: ignore[method-assign]
    res = await run_episode(task, scripted_model(codec, FIX))
    assert res.exit_reason == ExitReason.VERIFIER_ERROR
    assert res.reward is None and not res.trainable and "grader bug" in (res.error or "")


async def test_unknown_tool_and_bad_arguments_become_observations(task: SweTask, codec: ChatCodec) -> None:
    script = [call("rm_rf", path="/"), call("bash"), call("bash", command=5), call("submit")]
    res = await run_episode(task, scripted_model(codec, script))
    assert res.exit_reason == ExitReason.FINISHED
    replies = [m["content"] for m in res.messages[2:] if m["role"] != "assistant"]
    assert "rm_rf" in replies[0] and "bash" in replies[0], "the reply names the real tools"
    assert "command" in replies[1] and "command" in replies[2]
    assert res.metrics["format_errors"] + res.metrics["tool_errors"] >= 3


async def test_endpoint_errors_end_in_model_error_after_retries(task: SweTask, endpoint) -> None:  # noqa: F811
    base_url, script = endpoint
    script.failures = [500] * 10
    model = oa_model(base_url, max_retries=2)
    res = await run_episode(task, model)
    assert res.exit_reason == ExitReason.MODEL_ERROR
    assert not res.trainable and res.reward is None
    assert len(script.seen) == 3, "one try and two retries"
    assert SECRET not in (res.error or "")


async def test_concurrent_samples_of_one_task_do_not_share_state(task: SweTask, codec: ChatCodec) -> None:
    import asyncio

    results = await asyncio.gather(
        run_episode(task, scripted_model(codec, FIX)),
        run_episode(task, scripted_model(codec, [call("submit")])),
    )
    assert [r.resolved for r in results] == [True, False]
    assert all(r.exit_reason == ExitReason.FINISHED for r in results), [r.error for r in results]
    assert task.base is None, "setup state lives on the episode's copy, not the shared task"
