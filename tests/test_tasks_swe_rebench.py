"""SWE-rebench rows: field mapping from the published format, and grading for real (swebench's
parser and report) in bubblewrap sandboxes on the local fixture rows."""

from __future__ import annotations

import subprocess
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
from uniagent.tasks.swe_rebench import (
    CONDA_ACTIVATE,
    SweRebenchTask,
    _chain,
    conventional_image,
    patch_test_files,
)
from uniagent.tokens import ChatCodec

FIXTURES = Path(__file__).parent / "fixtures"
ROWS = FIXTURES / "swe_rebench_rows.jsonl"


@pytest.fixture(scope="module")
def tasks() -> dict[str, SweRebenchTask]:
    loaded = load_tasks(str(ROWS))
    assert all(isinstance(t, SweRebenchTask) for t in loaded)
    return {t.instance_id: t for t in loaded}  # type: ignore[misc]


def v2_row(**over) -> dict:
    """A SWE-rebench-V2 row as its sample files spell it (Python-literal strings included)."""
    row = {
        "instance_id": "octo__widgets-7",
        "repo": "octo/widgets",
        "base_commit": "0" * 40,
        "language": "python",
        "problem_statement": "Widget.resize drops the border.",
        "patch": "",
        "test_patch": (
            "diff --git a/tests/test_w.py b/tests/test_w.py\n--- a/tests/test_w.py\n+++ b/tests/test_w.py\n"
        ),
        "install_config": (
            "{'base_image_name': 'python_3.11:latest', 'docker_specs': None, "
            "'install': ['pip install -e .'], 'log_parser': 'parse_log_pytest', "
            "'test_cmd': ['export WIDGETS_TEST=1', 'pytest -rA tests/test_w.py']}"
        ),
        "FAIL_TO_PASS": ["tests/test_w.py::test_resize_keeps_border"],
        "PASS_TO_PASS": "['tests/test_w.py::test_resize']",
        "image_name": "docker.io/swerebenchv2/octo-widgets:7-0000000",
    }
    row.update(over)
    return row


# -- field mapping ---------------------------------------------------------------------------
def test_every_fixture_row_is_detected_as_swe_rebench() -> None:
    assert [detect_family(r) for r in load_rows(ROWS)] == ["swe_rebench"] * 3


def test_local_rows_map_onto_swe_task(tasks: dict[str, SweRebenchTask]) -> None:
    t = tasks["textkit-dev__textkit-101"]
    assert t.fail_to_pass == ["tests/test_slug.py::test_collapses_whitespace"], "from a JSON string"
    assert t.pass_to_pass == ["tests/test_slug.py::test_basic"]
    second = tasks["textkit-dev__textkit-102"]
    assert second.fail_to_pass == ["tests/test_wrap.py::test_short_text_is_untouched"], "from a list"
    assert t.log_parser == "parse_log_pytest"
    # V1: the test patch's files are appended to test_cmd, under the fork's UTF-8 locale.
    cmd = "LANG=C.UTF-8 LC_ALL=C.UTF-8 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 pytest -rA -p no:cacheprovider"
    assert t.test_cmd.endswith(f"{cmd} tests/test_slug.py")
    assert t.test_cmd.startswith(CONDA_ACTIVATE)
    assert t.prelude.endswith("LANG=C.UTF-8 LC_ALL=C.UTF-8 python -m compileall -q textkit")
    assert "image" not in t.row and t.repo_path() == FIXTURES / "swe_rebench" / "textkit"
    assert as_written(t.sandbox_config(None)) == {"type": "local"}
    assert t.describe()["rebench_version"] == 1


def test_published_row_runs_in_its_image(tasks: dict[str, SweRebenchTask]) -> None:
    t = tasks["textkit-dev__textkit-117"]
    image = "swerebench/sweb.eval.x86_64.textkit-dev_1776_textkit-117:latest"
    assert as_written(t.sandbox_config(None)) == {"type": "container", "image": image, "workdir": "/testbed"}
    assert as_written(t.sandbox_config({"type": "local", "limits": {"memory_mb": 2048}})) == {
        "type": "container",
        "limits": {"memory_mb": 2048},
        "image": image,
        "workdir": "/testbed",
    }, "a local base becomes the row's container, with the user's settings"
    podman = t.sandbox_config({"type": "container", "runtime": "podman", "image": "mine:1"})
    assert as_written(podman) == {
        "type": "container",
        "runtime": "podman",
        "image": image,
        "workdir": "/testbed",
    }
    assert t.test_cmd.endswith("pytest --continue-on-collection-errors -n0 -rA tests/test_slug.py")
    assert t.prelude.endswith("LANG=C.UTF-8 LC_ALL=C.UTF-8 pip install -e .")
    assert t.install_config["python"] == "3.11" and "pre_install" not in t.install_config, "nulls dropped"
    assert t.row["base_commit"] and t.describe()["image"] == image


def test_image_name_and_the_naming_convention() -> None:
    row = dict(load_rows(ROWS)[2])
    del row["docker_image"]
    assert SweRebenchTask(dict(row)).row["image"] == conventional_image("textkit-dev__textkit-117")
    assert conventional_image("Org__Repo-9") == "swerebench/sweb.eval.x86_64.org_1776_repo-9:latest"
    row["image_name"] = "swerebench/sweb.eval.x86_64.textkit-dev_1776_textkit-117:sha-1"
    assert SweRebenchTask(row).row["image"] == row["image_name"]


def test_v2_rows_run_their_commands_as_given() -> None:
    t = SweRebenchTask(v2_row())
    assert t.is_v2 and t.prelude == "", "V2 does not re-run its (image build) install"
    assert t.row["workdir"] == "/widgets", "V2 images check out at /<repository name>"
    assert t.pass_to_pass == ["tests/test_w.py::test_resize"], "a Python-literal string"
    assert t.test_cmd == "{ export WIDGETS_TEST=1\n} && { pytest -rA tests/test_w.py\n}"
    assert as_written(t.sandbox_config(None)) == {
        "type": "container",
        "image": "docker.io/swerebenchv2/octo-widgets:7-0000000",
        "workdir": "/widgets",
    }
    script = _chain(["cd /", "test $(pwd) = /", "false", "echo unreachable"])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert out.returncode == 1 and "unreachable" not in out.stdout, "in order, stopping at a failure"


def test_parser_names_map_onto_the_swebench_registry() -> None:
    ic = {"test_cmd": "pytest -rA", "log_parser": "parse_log_pytest_v2"}
    assert SweRebenchTask(v2_row(install_config=ic)).log_parser == "parse_log_pytest_v2"
    short = SweRebenchTask(v2_row(install_config={**ic, "log_parser": "pytest"}))
    assert short.log_parser == "parse_log_pytest"
    with pytest.raises(ConfigError, match="parse_log_elixir"):
        SweRebenchTask(v2_row(install_config={**ic, "log_parser": "parse_log_elixir"}))
    with pytest.raises(ConfigError, match="no test_cmd"):
        SweRebenchTask(v2_row(install_config={"log_parser": "parse_log_pytest"}))
    with pytest.raises(ConfigError, match="install_config"):
        SweRebenchTask(v2_row(install_config="{not: valid"))


def test_directives_skip_deleted_and_data_files() -> None:
    patch = (
        "diff --git a/tests/test_a.py b/tests/test_a.py\n--- a/tests/test_a.py\n+++ b/tests/test_a.py\n"
        "diff --git a/tests/data.json b/tests/data.json\n--- a/tests/data.json\n+++ b/tests/data.json\n"
        "diff --git a/tests/test_old.py b/tests/test_old.py\ndeleted file mode 100644\n"
        "--- a/tests/test_old.py\n+++ /dev/null\n"
    )
    assert patch_test_files(patch) == ["tests/test_a.py"]
    assert patch_test_files(patch, "nebius/nebo") == []


# -- grading for real ----------------------------------------------------------------------
@needs_bwrap
async def test_gold_passes_empty_and_test_edits_fail(
    tasks: dict[str, SweRebenchTask], tmp_path: Path
) -> None:
    task = tasks["textkit-dev__textkit-101"]
    repo = task.repo_path()
    assert repo is not None
    cheat = make_patch(
        tmp_path,
        repo,
        {
            "tests/test_slug.py": "".join(
                f"def {name}():\n    pass\n\n\n" for name in ("test_basic", "test_collapses_whitespace")
            ),
            "conftest.py": FORCE_PASS_CONFTEST,
        },
    )
    async with sandboxes.create(task.sandbox_config(None)) as sb:
        await task.setup(sb)
        gold = await task.grade_patch(sb, task.gold_patch)
        assert gold.value == 1.0 and gold.resolved, gold.details["log_tail"]
        assert gold.details["status_map"]["tests/test_slug.py::test_collapses_whitespace"] == "PASSED"
        empty = await task.grade_patch(sb, "")
        assert empty.value == 0.0 and empty.details["resolution"] == "RESOLVED_NO"
        assert empty.details["status_map"]["tests/test_slug.py::test_collapses_whitespace"] == "FAILED"
        faked = await task.grade_patch(sb, cheat)
        assert faked.value == 0.0, faked.details["log_tail"]
        assert set(faked.details["ignored_test_changes"]) == {"tests/test_slug.py", "conftest.py"}


@needs_bwrap
async def test_second_row_grades_its_own_tests(tasks: dict[str, SweRebenchTask]) -> None:
    task = tasks["textkit-dev__textkit-102"]
    async with sandboxes.create(task.sandbox_config(None)) as sb:
        await task.setup(sb)
        gold = await task.grade_patch(sb, task.gold_patch)
    assert gold.value == 1.0, gold.details["log_tail"]
    assert set(gold.details["status_map"]) == {
        "tests/test_wrap.py::test_long_text_gets_suffix",
        "tests/test_wrap.py::test_short_text_is_untouched",
    }, "only the test patch's files run (the fork's test directives)"


@needs_bwrap
async def test_scripted_episode_resolves(tasks: dict[str, SweRebenchTask], smol_tokenizer) -> None:
    script = [
        call("bash", command="cat textkit/slug.py"),
        call(
            "str_replace_editor",
            command="str_replace",
            path="textkit/slug.py",
            old_str='title.lower().split(" ")',
            new_str="title.lower().split()",
        ),
        call("submit"),
    ]
    model = scripted_model(ChatCodec(smol_tokenizer), script)
    res = await run_episode(tasks["textkit-dev__textkit-101"], model)
    assert res.exit_reason == ExitReason.FINISHED and res.trainable, res.error
    assert res.reward is not None and res.reward.value == 1.0 and res.resolved
    assert "+    words = title.lower().split()" in (res.patch or "")
    assert res.trajectory is not None and res.trajectory.drift is None
