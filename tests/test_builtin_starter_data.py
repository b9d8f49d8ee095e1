"""The bundled starter suite, checked the way a verifier uses it.

For every row of `builtin/starter/tasks.jsonl`: the repo is copied and committed with real git, the
test patch is applied with `git apply`, the row's `test_cmd` runs, and swebench's pytest log parser
reads the result; then the gold patch is applied and the tests run again. FAIL_TO_PASS must fail
before and pass after, PASS_TO_PASS must pass both times. Each task's pytest runs once per state,
two tasks at a time.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from swebench.harness.log_parsers.python import parse_log_pytest

import uniagent

STARTER = Path(uniagent.__file__).resolve().parent / "tasks" / "builtin" / "starter"
ROWS: list[dict] = [
    json.loads(line) for line in (STARTER / "tasks.jsonl").read_text().splitlines() if line.strip()
]
IDS = [row["instance_id"] for row in ROWS]
BY_ID = {row["instance_id"]: row for row in ROWS}

FIELDS = {
    "instance_id",
    "repo_dir",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "test_cmd",
    "log_parser",
    "difficulty",
    "tags",
}
GIT_CONFIG = {
    "user.name": "starter-check",
    "user.email": "starter-check@example.invalid",
    "commit.gpgsign": "false",
    "core.autocrlf": "false",
}
GIT = ["git"] + [arg for key, value in GIT_CONFIG.items() for arg in ("-c", f"{key}={value}")]
DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def changed_files(patch: str) -> list[str]:
    return sorted({path for pair in DIFF_HEADER.findall(patch) for path in pair})


def is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.startswith("tests/") or name.startswith("test_") or name == "conftest.py"


@dataclass
class Outcome:
    error: str | None = None
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)


def _run(cmd: list[str], cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # The repos are stdlib-only; skipping this venv's third-party pytest plugins (asyncio, hypothesis,
    # timeout, ...) makes each run ~6x faster and changes no outcome.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _git(repo: Path, *args: str) -> None:
    proc = _run([*GIT, *args], repo)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")


def _apply(repo: Path, patch: str, name: str) -> None:
    patch_file = repo.parent / f"{name}.diff"
    patch_file.write_text(patch)
    _git(repo, "apply", "--check", str(patch_file))
    _git(repo, "apply", str(patch_file))


def _pytest(repo: Path, test_cmd: str) -> tuple[dict[str, str], str]:
    argv = shlex.split(test_cmd)
    while argv and "=" in argv[0] and not argv[0].startswith("-"):
        argv.pop(0)  # leading VAR=value assignments (the same ones _run sets)
    if argv[0] == "python":
        argv[0] = sys.executable
    proc = _run(argv, repo)
    log = proc.stdout + proc.stderr
    return parse_log_pytest(log, None), log


def _check_task(row: dict, workdir: Path) -> Outcome:
    out = Outcome()
    try:
        repo = workdir / "repo"
        shutil.copytree(STARTER / row["repo_dir"], repo)
        _git(repo, "init", "-q")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", "base")
        _apply(repo, row["test_patch"], "test_patch")
        out.before, out.logs["before"] = _pytest(repo, row["test_cmd"])
        _apply(repo, row["patch"], "gold_patch")
        out.after, out.logs["after"] = _pytest(repo, row["test_cmd"])
    except Exception as exc:  # reported per task by the test that reads it
        out.error = f"{type(exc).__name__}: {exc}"
    return out


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("starter")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            row["instance_id"]: pool.submit(_check_task, row, root / row["instance_id"]) for row in ROWS
        }
        return {task_id: fut.result() for task_id, fut in futures.items()}


def test_suite_shape():
    assert len(ROWS) >= 14
    assert len(set(IDS)) == len(IDS), "instance ids must be unique"
    listed = sorted(p.name for p in (STARTER / "repos").iterdir())
    assert listed == sorted(IDS), "every repo dir belongs to exactly one row"
    assert {row["difficulty"] for row in ROWS} == {"easy", "medium", "hard"}


def test_repos_hold_no_build_or_vcs_leftovers():
    bad = [
        str(p.relative_to(STARTER))
        for p in (STARTER / "repos").rglob("*")
        if p.name in {".git", "__pycache__", ".pytest_cache"} or p.suffix in {".pyc", ".orig", ".rej"}
    ]
    assert bad == []


@pytest.mark.parametrize("task_id", IDS)
def test_row_fields(task_id):
    row = BY_ID[task_id]
    assert set(row) == FIELDS
    assert re.fullmatch(r"[a-z][a-z0-9]*-\d{3}", task_id)
    assert row["repo_dir"] == f"repos/{task_id}"
    assert (STARTER / row["repo_dir"] / "tests").is_dir()
    assert row["log_parser"] == "pytest"
    assert row["test_cmd"].startswith("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest ")
    assert " -rA" in row["test_cmd"]
    assert row["difficulty"] in {"easy", "medium", "hard"}
    assert row["tags"] and all(isinstance(t, str) and t for t in row["tags"])
    f2p, p2p = row["FAIL_TO_PASS"], row["PASS_TO_PASS"]
    assert f2p and len(p2p) >= 2
    assert not set(f2p) & set(p2p)
    assert len(set(f2p)) == len(f2p) and len(set(p2p)) == len(p2p)
    for node in f2p + p2p:
        # swebench's parser splits log lines on whitespace, so ids must not contain any
        assert node.startswith("tests/") and "::" in node and not any(ch.isspace() for ch in node)


@pytest.mark.parametrize("task_id", IDS)
def test_patches_touch_the_right_files(task_id):
    row = BY_ID[task_id]
    gold, tests = changed_files(row["patch"]), changed_files(row["test_patch"])
    assert gold and tests
    assert not [p for p in gold if is_test_file(p)], "the gold patch must not touch tests"
    assert all(p.startswith("tests/") for p in tests), "the test patch must only touch tests/"


@pytest.mark.parametrize("task_id", IDS)
def test_statement_does_not_reveal_the_fix(task_id):
    row = BY_ID[task_id]
    statement = row["problem_statement"]
    assert len(statement) > 200 and "diff --git" not in statement
    added = [
        line[1:].strip()
        for line in row["patch"].splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    leaked = [line for line in added if len(line) >= 10 and line in statement]
    assert leaked == []


@pytest.mark.parametrize("task_id", IDS)
def test_tests_flip_as_declared(task_id, outcomes):
    row, out = BY_ID[task_id], outcomes[task_id]
    assert out.error is None, out.error
    before, after = out.before, out.after
    tail = "\n--- before ---\n" + out.logs["before"][-3000:] + "\n--- after ---\n" + out.logs["after"][-3000:]
    assert before and after, "no test results parsed" + tail
    bad = {t: before.get(t) for t in row["FAIL_TO_PASS"] if before.get(t) not in {"FAILED", "ERROR"}}
    assert not bad, f"FAIL_TO_PASS not failing on base + test patch: {bad}" + tail
    bad = {t: before.get(t) for t in row["PASS_TO_PASS"] if before.get(t) != "PASSED"}
    assert not bad, f"PASS_TO_PASS not passing on base + test patch: {bad}" + tail
    bad = {t: after.get(t) for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"] if after.get(t) != "PASSED"}
    assert not bad, f"listed tests not passing with the gold patch: {bad}" + tail
    assert set(after) == set(row["FAIL_TO_PASS"]) | set(row["PASS_TO_PASS"]), "unlisted tests in the suite"
