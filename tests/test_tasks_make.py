"""`uniagent tasks make` on a real library (inflection's sdist, tests included, fetched pinned by
`scripts/fetch-pylibs.sh`): rows made in bwrap sandboxes, then graded by `uniagent verify` (gold
100 %, empty 0 %), a rerun that resumes, and the difficulty filter with a scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import needs_bwrap, require
from run_helpers import write_replay
from uniagent.tasks import load_tasks

pytestmark = needs_bwrap
ROOT = Path(__file__).resolve().parents[1]
PYLIBS = Path(os.environ.get("UNIAGENT_PYLIBS", ROOT / ".cache" / "pylibs"))
LIBRARY = PYLIBS / "inflection-0.5.1"
TEST_CMD = "python -m pytest -rA -p no:cacheprovider test_inflection.py"
CLI = [sys.executable, "-m", "uniagent.cli"]


def uniagent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("inflection's sdist", LIBRARY.is_dir(), "run scripts/fetch-pylibs.sh (make setup does)")
    base = tmp_path_factory.mktemp("made")
    source = base / "inflection"
    shutil.copytree(LIBRARY, source)
    out = base / "out"
    args = ["tasks", "make", str(source), "--test-cmd", TEST_CMD, "--out", str(out)]
    proc = uniagent(*args, "--max-candidates", "3", "--workers", "2", "--prefix", "inflection")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_rows_are_validated_swe_rows(made: Path) -> None:
    summary = json.loads((made / "summary.json").read_text())
    assert summary["candidates"] == 3 and summary["baseline_tests"] > 400
    rows = rows_of(made / "tasks.jsonl")
    assert 1 <= len(rows) == summary["kept"] <= summary["valid"] <= 3
    assert len({frozenset(r["FAIL_TO_PASS"]) for r in rows}) == len(rows)  # deduplicated
    tasks = load_tasks(str(made / "tasks.jsonl"))
    assert [t.family for t in tasks] == ["swe"] * len(rows)
    for row in rows:
        assert row["instance_id"].startswith("inflection-")
        assert row["FAIL_TO_PASS"] and row["PASS_TO_PASS"]
        assert not set(row["FAIL_TO_PASS"]) & set(row["PASS_TO_PASS"])
        assert row["patch"].startswith("diff --git a/inflection/__init__.py")
        removed = [
            ln[1:].strip() for ln in row["patch"].splitlines() if ln.startswith("-") and ln[1:].strip()
        ]
        assert not any(r in row["problem_statement"] for r in removed if not r.startswith("--"))
        assert row["FAIL_TO_PASS"][0] in row["problem_statement"]
    # the repository's clean commit and other bugs are not reachable from a bug's commit
    log = subprocess.run(
        ["git", "-C", str(made / "repo"), "rev-list", rows[0]["base_commit"]], capture_output=True, text=True
    )
    assert log.stdout.split() == [rows[0]["base_commit"]]


def test_verify_grades_gold_100_and_empty_0(made: Path, tmp_path: Path) -> None:
    tasks = str(made / "tasks.jsonl")
    rows = rows_of(made / "tasks.jsonl")
    proc = uniagent("verify", "--tasks", tasks, "--gold", "--output", str(tmp_path / "gold"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gold = json.loads((tmp_path / "gold" / "report.json").read_text())
    assert gold["resolved_instances"] == len(rows), gold["instances"]
    empty = tmp_path / "empty.jsonl"
    empty.write_text(
        "".join(json.dumps({"instance_id": r["instance_id"], "model_patch": ""}) + "\n" for r in rows)
    )
    proc = uniagent("verify", "--tasks", tasks, "--predictions", str(empty), "--output", str(tmp_path / "e"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "e" / "report.json").read_text())
    assert report["resolved_instances"] == 0 and report["unresolved_instances"] == len(rows)


def test_a_rerun_resumes_from_the_work_dir(made: Path) -> None:
    results = sorted((made / "work" / "results").glob("*.json"))
    stamps = {p.name: p.stat().st_mtime_ns for p in results}
    before = rows_of(made / "tasks.jsonl")
    source = made.parent / "inflection"
    proc = uniagent(
        "tasks", "make", str(source), "--test-cmd", TEST_CMD, "--out", str(made),
        "--max-candidates", "3", "--prefix", "inflection",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (made / "work" / "results").glob("*.json")} == stamps
    assert rows_of(made / "tasks.jsonl") == before


def test_filter_k_keeps_rows_neither_always_nor_never_solved(made: Path, tmp_path: Path, codec) -> None:
    from uniagent.runner.difficulty import filter_rows

    out = tmp_path / "filtered"
    shutil.copytree(made, out, ignore=shutil.ignore_patterns("work"))
    tasks = load_tasks(str(out / "tasks.jsonl"))
    first = tasks[0].instance_id
    # sample 1 of the first row submits nothing (1/2 solved); every other episode applies the fix
    replay = write_replay(tmp_path / "replay.jsonl", codec, tasks, samples=2, wrong={(first, 1)})
    res = asyncio.run(filter_rows(out, f"replay:{replay}", 2, sets=["runner.concurrency=2"]))
    # The filter's verdicts are checked against the run's own store: an episode that applies the
    # fix may still end unresolved (the agent's side, not the filter's).
    from uniagent.runner.store import RunStore, store_path

    store = RunStore(store_path(out / "filter-run"), readonly=True)
    episodes = {(r["instance_id"], r["sample"]): r["resolved"] for r in store.rows(full=False)}
    store.close()
    assert len(episodes) == 2 * len(tasks) and episodes[(first, 1)] is False
    solved = {t.instance_id: episodes[(t.instance_id, 0)] + episodes[(t.instance_id, 1)] for t in tasks}
    assert sum(solved.values()) >= 2 * len(tasks) - 2  # the scripted fixes resolve (one may not)
    expected = [t.instance_id for t in tasks if solved[t.instance_id] == 1]
    assert res == {
        "k": 2,
        "rows": len(tasks),
        "kept": len(expected),
        "always_solved": sum(n == 2 for n in solved.values()),
        "never_solved": sum(n == 0 for n in solved.values()),
    }
    kept = rows_of(out / "tasks.jsonl")
    assert [r["instance_id"] for r in kept] == expected and all(r["pass_rate"] == 0.5 for r in kept)
    assert len(rows_of(out / "tasks.all.jsonl")) == len(tasks)


def test_a_model_writes_the_statement_from_the_failures(tmp_path: Path, codec) -> None:
    from run_helpers import write_turns
    from uniagent.tasks.made_rows import MODEL_PROMPT, model_statements

    kept = [{"id": "abc", "failures": {"t.py::test_a": "AssertionError: assert 1 == 2"}}]
    replay = write_turns(tmp_path / "r.jsonl", codec, {"abc#0": ["`f` returns 1 where 2 is expected."]})
    texts = asyncio.run(model_statements(f"replay:{replay}", "lib", kept))
    assert texts == {"abc": "`f` returns 1 where 2 is expected."}
    assert "do not" in MODEL_PROMPT and "{listing}" in MODEL_PROMPT


def test_the_tree_is_a_git_repositorys_head_or_a_source_tree_without_caches(tmp_path: Path) -> None:
    from uniagent.tasks.make import MakeConfig, candidates, snapshot

    src = tmp_path / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "pkg" / "core.py").write_text("def f(a, b):\n    return a + b\n")
    (src / "pkg" / "__pycache__" / "core.pyc").write_bytes(b"x")
    (src / "tests").mkdir()
    (src / "tests" / "test_core.py").write_text("def test_f():\n    assert 1 + 1 == 2\n")
    snapshot(src, tmp_path / "plain")
    assert sorted(
        p.relative_to(tmp_path / "plain").as_posix() for p in (tmp_path / "plain").rglob("*.py")
    ) == [
        "pkg/core.py",
        "tests/test_core.py",
    ]
    assert not (tmp_path / "plain" / "pkg" / "__pycache__").exists()
    cfg = MakeConfig(source=src, test_cmd="true", out=tmp_path / "o", max_candidates=None)
    assert {m.path for m in candidates(tmp_path / "plain", cfg)} == {"pkg/core.py"}  # never the tests
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    subprocess.run(["git", "-C", str(src), "add", "pkg/core.py"], check=True)
    subprocess.run(["git", "-C", str(src), "commit", "-qm", "c"], check=True, env=env)
    snapshot(src, tmp_path / "git")
    assert [p.name for p in (tmp_path / "git").rglob("*") if p.is_file()] == ["core.py"]  # HEAD only


def test_the_tasks_repository_keeps_ignored_files(tmp_path: Path) -> None:
    from uniagent.tasks.made_rows import build_repo

    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / ".gitignore").write_text("pkg/version.py\n")
    (tree / "pkg" / "version.py").write_text("version = '1.0'\n")  # generated at build time
    build_repo(tree, tmp_path / "repo", [])
    files = subprocess.run(["git", "-C", str(tmp_path / "repo"), "ls-files"], capture_output=True, text=True)
    assert files.stdout.split() == [".gitignore", "pkg/version.py"]
