"""Helpers for episode tests: scripted model turns through the real ReplayEngine, and a tiny
SWE task built with real git in a temp dir."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

from uniagent.models.base import Generation, SamplingParams
from uniagent.models.replay import ReplayEngine, ReplayRecord
from uniagent.models.token_chat import TokenChatModel
from uniagent.parsers import get_parser
from uniagent.tasks import load_tasks
from uniagent.tasks.swe import SweTask
from uniagent.tokens import ChatCodec


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def scripted_model(
    codec: ChatCodec, texts: list[str], max_tokens: int = 512, made: list[Any] | None = None
) -> TokenChatModel:
    """A TokenChatModel whose engine replays `texts` as the model's turns, in order.

    The recordings carry no prompts (strict=False replays them whatever the prompt is): these
    tests script what the model says, the rest of the stack is real. With `made`, every token gets
    a logprob of its own and each generation's (ids, logprobs) is appended to `made` (for the
    every-generated-token-once check).
    """
    rid = uuid.uuid4().hex
    records = []
    for turn, text in enumerate(texts):
        ids = codec.encode(text) + codec.eot_ids
        lps = [-0.5] * len(ids)
        if made is not None:
            lps = [-(len(made) * 1000 + k + 1) / 1e4 for k in range(len(ids))]
            made.append((ids, lps))
        records.append(ReplayRecord(rid, Generation(ids, lps, "stop"), turn=turn, prompt_hash="0" * 64))
    engine = ReplayEngine(records, match="request", strict=False)
    return TokenChatModel(
        engine, codec, get_parser("hermes"), SamplingParams(max_tokens=max_tokens), request_id=rid
    )


def git(cwd: Path, *args: str) -> str:
    env_args = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    return subprocess.run(
        ["git", *env_args, *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def make_patch(tmp_path: Path, repo: Path, files: dict[str, str], skip: tuple[str, ...] = ()) -> str:
    """A git diff of `files` (path -> new content) against a copy of `repo` as the agent sees it
    (without the `skip` patterns: files the task keeps from the agent)."""
    work = tmp_path / "patch-work"
    shutil.copytree(repo, work, ignore=shutil.ignore_patterns(*skip))
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "base")
    for path, text in files.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    git(work, "add", "-A")
    return git(work, "diff", "--cached")


# A conftest.py that reports every test passed: what a cheating patch adds to fake the grade.
FORCE_PASS_CONFTEST = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)


BUGGY = "def add(a, b):\n    return a - b\n\n\ndef neg(a):\n    return -a\n"
FIXED = BUGGY.replace("a - b", "a + b")
OLD_TEST = "from calc import neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n"
NEW_TEST = OLD_TEST + "\n\ndef test_add():\n    from calc import add\n\n    assert add(2, 3) == 5\n"


def make_swe_task_file(root: Path) -> Path:
    """A one-task SWE dataset: repo dir + gold patch + test patch made with real git."""
    work = root / "work"
    (work / "tests").mkdir(parents=True)
    (work / "calc.py").write_text(BUGGY)
    (work / "tests" / "test_calc.py").write_text(OLD_TEST)
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "base")
    (work / "tests" / "test_calc.py").write_text(NEW_TEST)
    test_patch = git(work, "diff")
    git(work, "checkout", "-q", ".")
    (work / "calc.py").write_text(FIXED)
    gold = git(work, "diff")
    git(work, "checkout", "-q", ".")
    repo = root / "repos" / "calc-001"
    repo.mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc.py").write_text(BUGGY)
    (repo / "tests" / "test_calc.py").write_text(OLD_TEST)
    row = {
        "instance_id": "calc-001",
        "repo_dir": "repos/calc-001",
        "problem_statement": "add(2, 3) returns -1 instead of 5.",
        "patch": gold,
        "test_patch": test_patch,
        "FAIL_TO_PASS": ["tests/test_calc.py::test_add"],
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_neg"]),
        "test_cmd": "python -m pytest -rA -p no:cacheprovider tests",
        "log_parser": "pytest",
    }
    path = root / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


def swe_task(root: Path) -> SweTask:
    """The one task of `make_swe_task_file(root)`, loaded."""
    [task] = load_tasks(str(make_swe_task_file(root)))
    assert isinstance(task, SweTask)
    return task
