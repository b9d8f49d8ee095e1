"""Task rows in every file format, and repositories put into sandboxes without their future."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from agent_helpers import git, make_swe_task_file
from conftest import needs_bwrap, require_module
from uniagent import sandbox
from uniagent.errors import ConfigError
from uniagent.tasks import load_tasks
from uniagent.tasks.loading import load_rows

pytestmark = needs_bwrap


def test_rows_from_jsonl_json_parquet_and_a_datasets_folder(tmp_path: Path) -> None:
    rows = [
        {"instance_id": f"q{i}", "question": f"q {i}?", "answers": ["a"], "corpus": "c.jsonl"}
        for i in range(3)
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "t.json").write_text(json.dumps(rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    datasets = require_module("datasets", "Hugging Face datasets (a verl dependency)")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    for name in ("t.jsonl", "t.json", "t.parquet", "ds"):
        assert load_rows(tmp_path / name) == rows, name
        assert [t.family for t in load_tasks(str(tmp_path / name))] == ["search"] * 3
    (tmp_path / "bad.jsonl").write_text('{"instance_id": 1}\nnot json\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2"):
        load_rows(tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match="duplicate instance_id"):
        (tmp_path / "dup.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[0]) + "\n")
        load_tasks(str(tmp_path / "dup.jsonl"))


def _repo_with_a_future(root: Path) -> tuple[Path, str, str]:
    repo = root / "upstream"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # THE FIX\n")
    git(repo, "commit", "-qam", "fix add")
    future = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "tag", "v1.0-fixed")
    git(repo, "branch", "fix-branch")
    git(repo, "update-ref", "refs/remotes/origin/main", future)
    (repo / "calc.py").write_text("stash me\n")
    git(repo, "stash")
    git(repo, "checkout", "-q", base)
    return repo, base, future


async def test_git_history_newer_than_base_is_scrubbed(tmp_path: Path) -> None:
    task_file = make_swe_task_file(tmp_path)
    repo, base, future = _repo_with_a_future(tmp_path)
    row = json.loads(task_file.read_text())
    row.update(repo_dir=str(repo), base_commit=base)
    [task] = load_tasks(str(_write(tmp_path / "git.jsonl", row)))
    async with sandbox.create({"workspace": str(tmp_path / "ws")}) as sb:
        await task.setup(sb)
        assert task.base == base
        r = await sb.exec(
            "git log --all --format=%H; git tag; git branch -a; git stash list; git reflog | wc -l; "
            f"git cat-file -e {future} && echo FUTURE-REACHABLE; grep -r 'THE FIX' . --exclude-dir=.git; true"
        )
        assert future not in r.output and "FUTURE-REACHABLE" not in r.output and "THE FIX" not in r.output
        assert "v1.0-fixed" not in r.output and "fix-branch" not in r.output and "origin" not in r.output
        assert r.output.split()[0] == base


async def test_repo_dir_as_tarball(tmp_path: Path) -> None:
    task_file = make_swe_task_file(tmp_path)
    row = json.loads(task_file.read_text())
    with tarfile.open(tmp_path / "repo.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "repos" / "calc-001", arcname="calc-001")
    row["repo_dir"] = "repo.tar.gz"
    [task] = load_tasks(str(_write(tmp_path / "tgz.jsonl", row)))
    async with sandbox.create({"workspace": str(tmp_path / "ws")}) as sb:
        await task.setup(sb)
        r = await sb.exec("ls; git status --porcelain | wc -l")
        assert "calc.py" in r.output and r.output.split()[-1] == "0"
        reward = await task.grade_patch(sb, task.gold_patch)
        assert reward.resolved


def _write(path: Path, row: dict) -> Path:
    path.write_text(json.dumps(row) + "\n")
    return path


def test_git_is_available_for_repos() -> None:
    assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0
