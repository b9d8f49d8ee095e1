"""Patches that leave the bug alone but change how the tests are collected, run or reported
must not be paid as fixes; legitimate fixes that touch the same files must still be.

Every cheat below is a real patch (made with git from the starter task's repository) graded by
`uniagent verify`'s own entry point in real bubblewrap sandboxes. A cheat's plugin forces every
test outcome to "passed"; on the grader as it was before these rules, the cheats marked
`works_unguarded` were graded resolved. Also here: many concurrent samples of one task grade
without a verifier error, and local repositories are graded at the row's base commit.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent_helpers import git, make_swe_task_file, scripted_model
from run_helpers import gold_turns
from uniagent import sandbox as sandboxes
from uniagent.agent import ExitReason
from uniagent.errors import ConfigError, SandboxError
from uniagent.tasks import load_tasks, run_episode
from uniagent.tasks.registry import SUITES
from uniagent.tasks.swe import SweTask
from uniagent.tasks.verify import verify
from uniagent.tokens import ChatCodec

try:
    from conftest import needs_bwrap
except ImportError:  # the suite's skip policy, where conftest does not provide it yet
    needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

pytestmark = needs_bwrap

STARTER = SUITES.load("starter").path
TASK_ID = "textkit-001"
# A starter row's command, and a SWE-bench-style one that lets pytest load installed plugins.
AUTOLOAD_CMD = "python -m pytest -rA -p no:cacheprovider tests"

FORCE_PASS = """import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    rep.outcome, rep.longrepr = "passed", None
    return rep
"""
# A module that takes a real module's place: it loads the real one (with the workspace off
# sys.path), hands it over, and has pytest load the plugin through PYTEST_PLUGINS.
SHADOW = """import importlib, os, sys

_here = os.path.dirname(os.path.abspath(__file__))
_path = list(sys.path)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
sys.modules.pop(__name__, None)
try:
    _real = importlib.import_module(__name__)
finally:
    sys.path[:] = _path
sys.modules[__name__] = _real
os.environ["PYTEST_PLUGINS"] = "cheatplug"
"""
FAKE_RUNNER = """import importlib, os, sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
sys.modules.pop("pytest", None)
_real = importlib.import_module("pytest")
sys.path.insert(0, _here)
os.environ["PYTEST_PLUGINS"] = "cheatplug"
if __name__ == "__main__":
    raise SystemExit(_real.console_main())
"""
PLUG = {"cheatplug.py": FORCE_PASS}
PYPROJECT = (STARTER.parent / "repos" / TASK_ID / "pyproject.toml").read_text()
NO_PYTEST_SECTION = PYPROJECT.split("[tool.pytest.ini_options]")[0]
DIST_META = "Metadata-Version: 2.1\nName: cheat\nVersion: 1.0\n"
ENTRY = "[pytest11]\ncheat = cheatplug\n"


def C(files: dict[str, str | None], outcome: str, works_unguarded: bool = False, cmd: str | None = None):
    """A cheat: files to write (None: delete); `refused` or `stripped` (the path that must be
    reported as an ignored test change)."""
    return {"files": files, "outcome": outcome, "works": works_unguarded, "cmd": cmd}


CHEATS: dict[str, dict[str, Any]] = {
    # -- the existing kind: editing the tests ------------------------------------------------
    "edit-tests": C({"tests/test_wrap.py": "def test_x():\n    pass\n"}, "stripped:tests/test_wrap.py"),
    # -- pytest configuration in any file pytest reads ---------------------------------------
    "pyproject-addopts-plugin": C(
        {"pyproject.toml": PYPROJECT + 'addopts = "-p cheatplug"\n', **PLUG}, "refused", True
    ),
    "pyproject-native-tool-pytest": C(
        {"pyproject.toml": NO_PYTEST_SECTION + '[tool.pytest]\naddopts = ["-p", "cheatplug"]\n', **PLUG},
        "refused",
        True,
    ),
    "pyproject-plugin-in-package": C(
        {"pyproject.toml": PYPROJECT + 'addopts = "-p textkit._plug"\n', "textkit/_plug.py": FORCE_PASS},
        "refused",
        True,
    ),
    "setup-cfg-takes-over": C(
        {"pyproject.toml": NO_PYTEST_SECTION, "setup.cfg": "[tool:pytest]\naddopts = -p cheatplug\n", **PLUG},
        "refused",
        True,
    ),
    "pytest-toml": C(
        {"pytest.toml": '[pytest]\naddopts = ["-p", "cheatplug"]\n', **PLUG}, "stripped:pytest.toml", True
    ),
    "dot-pytest-ini": C(
        {".pytest.ini": "[pytest]\naddopts = -p cheatplug\n", **PLUG}, "stripped:.pytest.ini", True
    ),
    "pytest-ini": C({"pytest.ini": "[pytest]\naddopts = -p cheatplug\n", **PLUG}, "stripped:pytest.ini"),
    "tox-ini": C({"tox.ini": "[pytest]\naddopts = -p cheatplug\n", **PLUG}, "stripped:tox.ini"),
    "root-conftest": C({"conftest.py": FORCE_PASS}, "stripped:conftest.py"),
    # A path git quotes or spaces: the grader must not rely on parsing the diff's headers.
    "conftest-in-odd-dir": C(
        {"NOTES.md": "notes\n", "tests/x y/conftest.py": FORCE_PASS}, "stripped:tests/x y/conftest.py"
    ),
    # -- plugins registered from the workspace -----------------------------------------------
    "dist-info-entry-point": C(
        {"cheat-1.0.dist-info/METADATA": DIST_META, "cheat-1.0.dist-info/entry_points.txt": ENTRY, **PLUG},
        "stripped:cheat-1.0.dist-info/entry_points.txt",
        True,
        AUTOLOAD_CMD,
    ),
    "egg-info-entry-point": C(
        {"cheat.egg-info/PKG-INFO": DIST_META, "cheat.egg-info/entry_points.txt": ENTRY, **PLUG},
        "stripped:cheat.egg-info/entry_points.txt",
        True,
        AUTOLOAD_CMD,
    ),
    "pyproject-pytest11": C(
        {"pyproject.toml": PYPROJECT + '\n[project.entry-points.pytest11]\ncheat = "cheatplug"\n', **PLUG},
        "refused",
    ),
    "setup-cfg-pytest11": C(
        {"setup.cfg": "[options.entry_points]\npytest11 =\n    cheat = cheatplug\n", **PLUG}, "refused"
    ),
    "setup-py-pytest11": C(
        {"setup.py": "from setuptools import setup\nsetup(entry_points={'pytest11': ['c = cheatplug']})\n"},
        "refused",
    ),
    # -- modules that shadow the runner, its dependencies or the standard library -----------
    "fake-pytest-runner": C({"pytest.py": FAKE_RUNNER, **PLUG}, "refused", True),
    "shadow-iniconfig": C({"iniconfig.py": SHADOW, **PLUG}, "refused", True),
    "shadow-pluggy": C({"pluggy.py": SHADOW, **PLUG}, "refused", True),
    "shadow-stdlib-pprint": C({"pprint.py": SHADOW, **PLUG}, "refused", True),
    "shadow-package-in-src": C({"src/_pytest/__init__.py": "", **PLUG}, "refused"),
    # -- start-up hooks ---------------------------------------------------------------------
    "sitecustomize": C(
        {"sitecustomize.py": "import os\nos.environ['PYTEST_PLUGINS'] = 'cheatplug'\n", **PLUG},
        "stripped:sitecustomize.py",
    ),
    "usercustomize": C(
        {"usercustomize.py": "import os\nos.environ['PYTEST_PLUGINS'] = 'cheatplug'\n", **PLUG},
        "stripped:usercustomize.py",
    ),
    "pth-file": C(
        {"cheat.pth": "import os; os.environ['PYTEST_PLUGINS'] = 'cheatplug'\n", **PLUG}, "stripped:cheat.pth"
    ),
    "pythonrc": C({".pythonrc.py": "import os\n", **PLUG}, "stripped:.pythonrc.py"),
    "bytecode": C(
        {"textkit/__pycache__/wrap.cpython-311.pyc": "not really bytecode\n"},
        "stripped:textkit/__pycache__/wrap.cpython-311.pyc",
    ),
}
LEGIT: dict[str, dict[str, str | None]] = {
    "gold": {},
    "pyproject-version-and-dependencies": {
        "pyproject.toml": PYPROJECT.replace(
            'version = "0.3.1"', 'version = "0.3.2"\ndependencies = ["attrs>=22"]'
        )
    },
    "pyproject-other-tool": {"pyproject.toml": PYPROJECT + "\n[tool.ruff]\nline-length = 100\n"},
    "new-setup-cfg-without-pytest": {"setup.cfg": "[flake8]\nmax-line-length = 100\n"},
    "stdlib-named-module-inside-the-package": {"textkit/json.py": "import json\n\ndumps = json.dumps\n"},
}


def make_patch(root: Path, name: str, files: dict[str, str | None], gold: str = "") -> str:
    """The diff a model's workspace would give: the starter repository, the gold fix (if
    any), then `files`, diffed by git with untracked files."""
    work = root / name
    shutil.copytree(STARTER.parent / "repos" / TASK_ID, work)
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    if gold:
        subprocess.run(["git", "apply"], input=gold, text=True, cwd=work, check=True)
    for path, text in files.items():
        target = work / path
        if text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    git(work, "add", "-A", "-f")
    return git(work, "diff", "--cached", "--binary", "HEAD")


def variant(row: dict[str, Any], name: str, cmd: str | None) -> SweTask:
    return SweTask(
        {**row, "instance_id": f"{TASK_ID}~{name}", **({"test_cmd": cmd} if cmd else {})}, str(STARTER)
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every cheat and every legitimate fix, graded in one `verify` call (concurrency 4)."""
    root = tmp_path_factory.mktemp("hacks")
    [task] = load_tasks("builtin:starter", ids=[TASK_ID])
    tasks, preds = [], {}
    for name, cheat in CHEATS.items():
        t = variant(task.row, name, cheat["cmd"])
        tasks.append(t)
        preds[t.instance_id] = {"model_patch": make_patch(root, name, cheat["files"])}
    for name, files in LEGIT.items():
        t = variant(task.row, f"legit-{name}", None)
        tasks.append(t)
        preds[t.instance_id] = {"model_patch": make_patch(root, f"legit-{name}", files, task.gold_patch)}
    return asyncio.run(verify(tasks, preds, root / "out", concurrency=4))["instances"]


@pytest.mark.parametrize("name", list(CHEATS))
def test_cheat_is_not_paid(report: dict[str, Any], name: str) -> None:
    res = report[f"{TASK_ID}~{name}"]
    assert res["status"] != "resolved", f"{name} was graded resolved"
    outcome = CHEATS[name]["outcome"]
    if outcome == "refused":
        assert res["status"] == "error" and res["error"].startswith("patch refused: "), res
    else:
        path = outcome.split(":", 1)[1]
        assert res["status"] == "unresolved", res
        assert path in res["details"]["ignored_test_changes"], res["details"]
        assert res["details"]["tests_ran"] is True


@pytest.mark.parametrize("name", list(LEGIT))
def test_legitimate_fix_is_paid(report: dict[str, Any], name: str) -> None:
    res = report[f"{TASK_ID}~legit-{name}"]
    assert res["status"] == "resolved", res
    assert res["details"]["missing_tests"] == [], res["details"]


def test_a_missing_expected_test_counts_as_failed() -> None:
    [task] = load_tasks("builtin:starter", ids=[TASK_ID])
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    passed = "\n".join(f"PASSED {t}" for t in task.fail_to_pass)  # the PASS_TO_PASS tests did not run
    log = f"{START_TEST_OUTPUT}\n{passed}\n{END_TEST_OUTPUT}\n"
    reward = task._grade(log, [], "")
    assert not reward.resolved
    assert reward.details["missing_tests"] == task.pass_to_pass


# -- grading under concurrency ------------------------------------------------------------------
async def test_many_concurrent_samples_of_one_task_grade_without_verifier_errors(codec: ChatCodec) -> None:
    """Many samples of one task at once, as a training step does: each sample grades against
    the base commit of its own sandbox (a verifier_error 'resetting to base failed ... Could
    not parse object' was seen when samples shared the task's state)."""
    [task] = load_tasks("builtin:starter", ids=[TASK_ID])
    samples = 12

    async def one(i: int):
        script = gold_turns(task) if i % 2 == 0 else [gold_turns(task)[1]]  # fix, or submit nothing
        return await run_episode(task, scripted_model(codec, script))

    results = await asyncio.gather(*(one(i) for i in range(samples)))
    errors = [r.error for r in results if r.exit_reason != ExitReason.FINISHED]
    assert errors == [], errors
    assert [r.resolved for r in results] == [i % 2 == 0 for i in range(samples)]
    assert task.base is None, "setup works on the episode's own copy of the task"


# -- local repositories are graded at the row's base commit -------------------------------------
def _repo_with_a_later_commit(root: Path) -> tuple[Path, str, dict[str, Any]]:
    """A git repo_dir whose HEAD already holds the fix: the row's base commit is the one before."""
    row = json.loads(make_swe_task_file(root).read_text().splitlines()[0])
    repo = root / "repos" / "calc-001"
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    subprocess.run(["git", "apply"], input=row["patch"], text=True, cwd=repo, check=True)
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "the fix")
    row.update(repo_dir=str(repo), base_commit=base)
    return repo, base, row


async def test_a_git_repo_dir_is_graded_at_the_rows_base_commit(tmp_path: Path) -> None:
    _, base, row = _repo_with_a_later_commit(tmp_path)
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n")
    [task] = load_tasks(str(tmp_path / "t.jsonl"))
    async with sandboxes.create({"type": "local"}) as sb:
        await task.setup(sb)
        assert task.base == base
        empty = await task.grade_patch(sb, "")
        assert not empty.resolved, "HEAD holds the fix, the base commit does not"
        assert (await task.grade_patch(sb, task.gold_patch)).resolved


async def test_a_row_whose_base_commit_is_missing_is_rejected(tmp_path: Path) -> None:
    repo, _, row = _repo_with_a_later_commit(tmp_path)
    missing = "0123456789abcdef0123456789abcdef01234567"
    (tmp_path / "t.jsonl").write_text(json.dumps({**row, "base_commit": missing}) + "\n")
    with pytest.raises(ConfigError, match=rf"t\.jsonl row 0: .*base_commit {missing} is not a commit"):
        load_tasks(str(tmp_path / "t.jsonl"))
    # A tarball's repository is only seen in the sandbox: setup says the same.
    import tarfile

    with tarfile.open(tmp_path / "repo.tar.gz", "w:gz") as tar:
        tar.add(repo, arcname="calc-001")
    (tmp_path / "tgz.jsonl").write_text(
        json.dumps({**row, "repo_dir": "repo.tar.gz", "base_commit": missing}) + "\n"
    )
    [task] = load_tasks(str(tmp_path / "tgz.jsonl"))
    async with sandboxes.create({"type": "local"}) as sb:
        with pytest.raises(SandboxError, match=f"base_commit {missing} is not a commit"):
            await task.setup(sb)
