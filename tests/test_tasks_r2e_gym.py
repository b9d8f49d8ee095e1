"""R2E-Gym rows: field mapping from the published format, R2E-Gym's log parser and comparison,
and grading for real (hidden tests put back, run_tests.sh run) in bubblewrap sandboxes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent_helpers import FORCE_PASS_CONFTEST, call, make_patch, scripted_model
from conftest import needs_bwrap
from uniagent import sandbox as sandboxes
from uniagent.agent import ExitReason
from uniagent.errors import ConfigError
from uniagent.sandbox.config import as_written
from uniagent.tasks import detect_family, load_tasks, run_episode
from uniagent.tasks.loading import load_rows
from uniagent.tasks.r2e_gym import R2EGymTask, compare_r2e, parse_r2e_log
from uniagent.tokens import ChatCodec

FIXTURES = Path(__file__).parent / "fixtures"
ROWS = FIXTURES / "r2e_gym_rows.jsonl"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return load_rows(ROWS)


@pytest.fixture(scope="module")
def tasks() -> list[R2EGymTask]:
    loaded = load_tasks(str(ROWS))
    assert all(isinstance(t, R2EGymTask) for t in loaded)
    return loaded  # type: ignore[return-value]


def swebench_row(**over) -> dict:
    """A row of R2E-Gym/SWE-Bench-Verified: SWE-bench fields, a SWE-bench image, `parsed_commit`."""
    row = {
        "instance_id": "django__django-11099",
        "repo": "django/django",
        "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c",
        "version": "3.0",
        "problem_statement": "UsernameValidator allows trailing newline in usernames",
        "patch": "diff --git a/django/contrib/auth/validators.py b/django/contrib/auth/validators.py\n",
        "test_patch": (
            "diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py\n"
        ),
        "FAIL_TO_PASS": '["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]',
        "PASS_TO_PASS": "[]",
        "parsed_commit": json.dumps({"file_diffs": [], "old_commit_hash": "a", "new_commit_hash": "b"}),
        "docker_image": "slimshetty/swebench-verified:sweb.eval.x86_64.django__django-11099",
    }
    row.update(over)
    return row


def swebench_repo_row(tmp_path: Path, instance_id: str | None = None) -> dict:
    """An R2E-Gym SWE-bench row on a local repository (textkit): its run_tests.sh is SWE-bench's
    eval script shape (applies the test patch, marks the test output, runs pytest)."""
    rebench = load_rows(FIXTURES / "swe_rebench_rows.jsonl")[0]
    repo = tmp_path / "textkit"
    if not repo.exists():
        shutil.copytree(FIXTURES / "swe_rebench" / "textkit", repo)
        (repo / "run_tests.sh").write_text(
            "set -uxo pipefail\n"
            f"git apply -v - <<'EOF_114329324912'\n{rebench['test_patch']}\nEOF_114329324912\n"
            ": '>>>>> Start Test Output'\n"
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 pytest -rA -p no:cacheprovider tests/test_slug.py\n"
            ": '>>>>> End Test Output'\n"
        )
    return {
        **{k: rebench[k] for k in ("instance_id", "repo", "problem_statement", "patch", "test_patch")},
        **{k: rebench[k] for k in ("FAIL_TO_PASS", "PASS_TO_PASS")},
        "repo_dir": str(repo),
        **({"instance_id": instance_id} if instance_id else {}),
    }


# -- field mapping -------------------------------------------------------------------------
def test_every_fixture_row_is_detected_as_r2e_gym(rows: list[dict]) -> None:
    assert [detect_family(r) for r in rows] == ["r2e_gym"] * 3
    assert all("instance_id" not in r for r in rows), "published R2E-Gym rows have no instance_id"


def test_rows_map_onto_the_task(tasks: list[R2EGymTask], rows: list[dict]) -> None:
    vec, word, published = tasks
    assert vec.instance_id == f"vecmath__{rows[0]['commit_hash']}"
    assert vec.mode == "r2e" and vec.hidden_tests_dir == "r2e_tests"
    assert word.hidden_tests_dir == "hidden_tests"
    text = vec.messages()[1]["content"]
    assert "`Vec(3, 4).norm()` returns" in text and "[ISSUE]" not in text, "the [ISSUE] markers are dropped"
    assert vec.expected["test_repr_roundtrip"] == "FAILED", "expected statuses include failures"
    assert vec.expected == json.loads(rows[0]["expected_output_json"])
    # The gold patch is the commit's non-test Python diff; its test-file diff protects those files.
    assert "vecmath/vector.py" in vec.gold_patch and "tests/test_vector.py" not in vec.gold_patch
    assert vec.test_patch.startswith("diff --git a/tests/test_vector.py")
    assert as_written(vec.sandbox_config(None)) == {"type": "local"}
    assert vec.repo_path() == FIXTURES / "r2e_gym" / "vecmath"
    image = f"namanjain12/vecmath_final:{rows[2]['commit_hash']}"
    assert as_written(published.sandbox_config(None)) == {
        "type": "container",
        "image": image,
        "workdir": "/testbed",
    }
    assert published.describe() == {
        "instance_id": f"vecmath__{rows[2]['commit_hash']}",
        "family": "r2e_gym",
        "image": image,
        "grading": "r2e",
    }


def test_image_name_swebench_rows_and_bad_rows(rows: list[dict]) -> None:
    row = {k: v for k, v in rows[2].items() if k != "docker_image"}
    assert R2EGymTask({**row, "image_name": "img:1"}).row["image"] == "img:1"
    with pytest.raises(ConfigError, match="`image` or `repo_dir`"):
        R2EGymTask(row)
    with pytest.raises(ConfigError, match="expected_output_json"):
        R2EGymTask({**rows[2], "expected_output_json": ""})
    with pytest.raises(ConfigError, match="repo_name"):
        R2EGymTask({k: v for k, v in rows[2].items() if k != "commit_hash"})
    with pytest.raises(ConfigError, match="SWE-smith"):
        R2EGymTask({**rows[2], "docker_image": "jyangballin/swesmith.x86_64.foo:latest"})

    t = R2EGymTask(swebench_row())
    assert t.mode == "swebench" and t.log_parser == "parse_log_django", "SWE-bench parser for the repo"
    assert t.fail_to_pass == ["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]
    assert t.sandbox_config(None).workdir == "/testbed" and t.row["base_commit"].startswith("d26b")
    assert t.gold_patch.startswith("diff --git a/django/contrib/auth/validators.py"), "the row's own patch"


# -- R2E-Gym's parser and comparison -------------------------------------------------------
def test_parser_reads_the_recorded_runs(rows: list[dict]) -> None:
    run = json.loads(rows[0]["execution_result_content"])
    expected = json.loads(rows[0]["expected_output_json"])
    assert parse_r2e_log(run["new_commit_res_stdout"]) == expected
    match, diff = compare_r2e(parse_r2e_log(run["old_commit_res_stdout"]), expected)
    assert not match and diff["wrong_status"] == {"test_norm_3_4_5": {"expected": "PASSED", "got": "FAILED"}}
    hidden = sorted((FIXTURES / "r2e_gym" / "vecmath" / "r2e_tests").glob("*.py"))
    assert run["test_file_names"] == [p.name for p in hidden]
    assert run["test_file_codes"] == [p.read_text() for p in hidden], "fixture = recorded hidden tests"


def test_parser_and_comparison_follow_r2e_gym() -> None:
    log = (
        "r2e_tests/test_1.py ..F\n=========================== short test summary info ===\n"
        "PASSED r2e_tests/test_1.py::test_a\n"
        "PASSED r2e_tests/test_1.py::TestK::test_b[x - y]\n"
        "FAILED r2e_tests/test_1.py::test_c - AssertionError: boom\n"
        "ERROR r2e_tests/test_1.py::test_d - fixture 'z' not found\n"
        "XFAIL r2e_tests/test_1.py::test_e - reason\n"
        "========= 1 failed, 2 passed, 1 error in 0.1s =========\n"
    )
    parsed = parse_r2e_log(log)
    assert parsed == {
        "test_a": "PASSED",
        "TestK.test_b[x - y]": "PASSED",
        "test_c": "FAILED",
        "test_d": "ERROR",
    }
    assert parse_r2e_log(log.replace("short test summary info", "summary")) == {}
    colored = "\x1b[1mTestK.test_b[x\x1b[0m"
    expected = {"test_a": "PASSED", colored: "PASSED", "test_c": "FAILED", "test_d": "ERROR"}
    assert compare_r2e(parsed, expected)[0], "keys are compared decolored and without ' - ...'"
    assert not compare_r2e({**parsed, "test_f": "PASSED"}, expected)[0], "one test more"
    assert not compare_r2e({**parsed, "test_c": "PASSED"}, expected)[0], "differs, even for the better"
    assert not compare_r2e({k: v for k, v in parsed.items() if k != "test_d"}, expected)[0], "one test less"


# -- grading for real ----------------------------------------------------------------------
@needs_bwrap
async def test_hidden_tests_decide_and_cannot_be_faked(tasks: list[R2EGymTask], tmp_path: Path) -> None:
    task = tasks[0]
    repo = task.repo_path()
    assert repo is not None
    fake_tests = "".join(f"def {name}():\n    pass\n\n\n" for name in ("test_add", "test_norm_3_4_5"))
    summary = "short test summary info\n" + "".join(
        f"{status} r2e_tests/test_1.py::{name.replace('.', '::')}\n" for name, status in task.expected.items()
    )
    cheat = make_patch(
        tmp_path,
        repo,
        {
            "conftest.py": FORCE_PASS_CONFTEST,
            "r2e_tests/test_1.py": fake_tests,
            "run_tests.sh": f"cat <<'EOF'\n{summary}EOF\n",
            "tests/test_vector.py": "def test_add():\n    pass\n",
        },
        skip=("run_tests.sh", "r2e_tests"),
    )
    async with sandboxes.create(task.sandbox_config(None)) as sb:
        await task.setup(sb)
        # The agent sees neither the verifier's files nor anything of them in git.
        seen = await sb.exec("ls -a; git log --all --name-only --format=%H | sort -u", session="t")
        assert "run_tests.sh" not in seen.output and "r2e_tests" not in seen.output, seen.output
        assert "vecmath" in seen.output
        gold = await task.grade_patch(sb, task.gold_patch)
        assert gold.value == 1.0 and gold.resolved, gold.details["log_tail"]
        assert gold.details["status_map"]["test_repr_roundtrip"] == "FAILED", "matches the expected failure"
        empty = await task.grade_patch(sb, "")
        assert empty.value == 0.0 and empty.details["wrong_status"] == {
            "test_norm_3_4_5": {"expected": "PASSED", "got": "FAILED"}
        }
        faked = await task.grade_patch(sb, cheat)
        assert faked.value == 0.0, faked.details["log_tail"]
        assert set(faked.details["ignored_test_changes"]) == {
            "conftest.py",
            "r2e_tests/test_1.py",
            "run_tests.sh",
            "tests/test_vector.py",
        }
        assert faked.details["status_map"]["test_norm_3_4_5"] == "FAILED", "the real hidden tests ran"


@needs_bwrap
async def test_a_run_that_fails_silently_is_no_pass(tasks: list[R2EGymTask], tmp_path: Path) -> None:
    """Code that prints a summary of its own and makes the run fail is not a pass (here written
    past pytest's output capture, to the pipe the log is read from): the grader's plugin saw the
    session end early."""
    task = tasks[1]
    repo = task.repo_path()
    assert repo is not None
    summary = "short test summary info\\n" + "".join(f"PASSED t.py::{name}\\n" for name in task.expected)
    loud = make_patch(
        tmp_path,
        repo,
        {
            "wordfreq/__init__.py": (
                "import os, stat\nfor fd in range(3, 64):\n    try:\n"
                f"        if stat.S_ISFIFO(os.fstat(fd).st_mode): os.write(fd, b'{summary}')\n"
                "    except OSError:\n        pass\nos._exit(1)\n"
            ),
        },
        skip=("run_tests.sh", "hidden_tests"),
    )
    async with sandboxes.create(task.sandbox_config(None)) as sb:
        await task.setup(sb)
        gold = await task.grade_patch(sb, task.gold_patch)
        assert gold.value == 1.0, gold.details["log_tail"]
        faked = await task.grade_patch(sb, loud)
    assert gold.details["witness"] == "used" and "refused" not in gold.details
    assert faked.value == 0.0 and faked.details["exit_code"] == 1 and faked.details["witness"] == "used"
    assert "no session-finished record" in faked.details["refused"], faked.details


@needs_bwrap
async def test_swebench_style_rows_are_graded_with_the_swebench_report(tmp_path: Path) -> None:
    """R2E-Gym's SWE-bench rows: run_tests.sh is SWE-bench's eval script (it applies the test
    patch and marks the test output), graded against FAIL_TO_PASS / PASS_TO_PASS."""
    rebench = load_rows(FIXTURES / "swe_rebench_rows.jsonl")[0]
    row = swebench_repo_row(tmp_path)
    task = R2EGymTask(row)
    assert task.mode == "swebench" and task.log_parser == "parse_log_pytest"
    async with sandboxes.create(task.sandbox_config(None)) as sb:
        await task.setup(sb)
        assert (await sb.exec("test -e run_tests.sh", session="t")).exit_code == 1, "hidden"
        gold = await task.grade_patch(sb, task.gold_patch)
        assert gold.value == 1.0 and gold.details["resolution"] == "RESOLVED_FULL", gold.details["log_tail"]
        assert gold.details["witness"] == "used", "run_tests.sh runs pytest once: the plugin sees it"
        assert gold.details["graded_from"] == "the grader's pytest plugin"
        empty = await task.grade_patch(sb, "")
    assert empty.value == 0.0
    assert empty.details["report"]["FAIL_TO_PASS"]["failure"] == json.loads(rebench["FAIL_TO_PASS"])


@needs_bwrap
async def test_scripted_episode_resolves(tasks: list[R2EGymTask], smol_tokenizer) -> None:
    script = [
        call("bash", command="ls; cat vecmath/vector.py"),
        call(
            "str_replace_editor",
            command="str_replace",
            path="vecmath/vector.py",
            old_str="self.y + self.y",
            new_str="self.y * self.y",
        ),
        call("submit"),
    ]
    res = await run_episode(tasks[0], scripted_model(ChatCodec(smol_tokenizer), script))
    assert res.exit_reason == ExitReason.FINISHED and res.trainable, res.error
    assert res.reward is not None and res.reward.value == 1.0 and res.resolved, res.reward.details["log_tail"]
    assert "run_tests.sh" not in res.messages[3]["content"], "the agent's `ls` does not show the verifier"
    assert "+        return math.sqrt(self.x * self.x + self.y * self.y)" in (res.patch or "")
    assert res.trajectory is not None and res.trajectory.drift is None
