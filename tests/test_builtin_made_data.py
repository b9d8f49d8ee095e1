"""The bundled `builtin:made` suite (made by `uniagent tasks make` from inflection): self-contained
rows whose repository ships beside them, each bug an orphan commit whose revert is the gold patch.
(`tests/test_tasks_make.py` grades freshly made rows gold 100 % / empty 0 % through `uniagent verify`.)"""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from uniagent.tasks import load_tasks
from uniagent.tasks.registry import SUITES


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tarball = SUITES.load("made").path.parent / "repo.tar.gz"
    dest = tmp_path_factory.mktemp("made")
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    return dest / "repo"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def test_rows_load_as_swe_tasks_and_are_distinct() -> None:
    tasks = load_tasks("builtin:made")
    assert len(tasks) >= 24
    rows = [t.row for t in tasks]
    assert {r["repo_dir"] for r in rows} == {"repo.tar.gz"}
    assert len({frozenset(r["FAIL_TO_PASS"]) for r in rows}) == len(rows)
    assert len({r["made"]["kind"] for r in rows}) >= 4
    for r in rows:
        assert r["FAIL_TO_PASS"] and r["PASS_TO_PASS"] and not r["test_patch"]
        assert r["FAIL_TO_PASS"][0] in r["problem_statement"]


def test_each_bug_is_an_orphan_commit_and_its_gold_patch_is_the_revert(repo: Path) -> None:
    for task in load_tasks("builtin:made"):
        base = task.row["base_commit"]
        assert git(repo, "rev-list", base).split() == [base]  # nothing newer, nothing older
        git(repo, "checkout", "-q", "--detach", base)
        apply = subprocess.run(
            ["git", "-C", str(repo), "apply", "--check", "-"], input=task.row["patch"], text=True
        )
        assert apply.returncode == 0, task.instance_id
    git(repo, "checkout", "-q", "--detach", "main")
