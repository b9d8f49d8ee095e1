"""A SWE row with an `image:` graded inside a container, end to end, on docker and on podman.

The image is built here, nothing pulled: the container tests' rootfs of host binaries plus git,
this interpreter with its standard library and pytest, and the textkit fixture repository at
/testbed as a git repository (its commit is the row's base). One row is run through `uniagent
run --sandbox container` with a replayed model that applies the gold fix, and through `uniagent
verify` (gold resolves, an empty patch does not). Under CI=true a runtime that cannot run here
fails these tests (the other container tests need only one of the two).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import require
from container_helpers import (
    TOOLS,
    Runtime,
    add_binary,
    add_python,
    build_rootfs_tar,
    import_image,
    open_runtime,
)
from run_helpers import write_replay
from uniagent.tasks import load_tasks
from uniagent.tokens import ChatCodec

CLI = [sys.executable, "-m", "uniagent.cli"]
SWE_IMAGE = "localhost/uniagent-swe:latest"
FIXTURES = Path(__file__).parent / "fixtures"
REPO = FIXTURES / "swe_rebench" / "textkit"
ROW_ID = "textkit-dev__textkit-101"  # its gold patch and test patch, taken from the fixture rows


# -- the image ------------------------------------------------------------------------------
def _base_commit(repo: Path) -> str:
    """The repository as a git repo with one commit at a fixed date (its sha depends on the
    content alone)."""
    when = "2000-01-01T00:00:00Z"
    env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True, env=env, capture_output=True)
    out = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def build_swe_tar(repo: Path) -> bytes:
    """The rootfs plus git, Python with pytest (`container_helpers.add_python`) and `repo` at
    /testbed."""

    def more(tar: tarfile.TarFile, seen: set[str]) -> None:
        for binary in ("git", "patch"):
            if shutil.which(binary):
                add_binary(tar, shutil.which(binary) or "", seen)
        git_core = subprocess.run(["git", "--exec-path"], capture_output=True, text=True).stdout.strip()
        add_binary(tar, f"{git_core}/git", seen)  # what `git gc` runs its steps with
        add_python(tar, seen)
        tar.add(str(repo), arcname="testbed")

    return build_rootfs_tar([*TOOLS, "git"], more)


@pytest.fixture(scope="session")
def swe_image() -> Iterator[tuple[bytes, str]]:
    """(the image's tar, the base commit of its /testbed), built once per session."""
    require("ldd and git", bool(shutil.which("ldd") and shutil.which("git")), "they assemble the image")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "testbed"
        shutil.copytree(REPO, repo)
        base = _base_commit(repo)
        yield build_swe_tar(repo), base


def _fail_or_skip(runtime: str, why: str) -> None:
    require(runtime, False, why)


@pytest.fixture(scope="module", params=["docker", "podman"])
def swe_runtime(request: pytest.FixtureRequest, swe_image: tuple[bytes, str]) -> Iterator[Runtime]:
    with open_runtime(request.param, _fail_or_skip) as rt:
        import_image(rt, swe_image[0], SWE_IMAGE, _fail_or_skip)
        yield rt
        rt.run("rmi", "-f", SWE_IMAGE)


@pytest.fixture
def rows(tmp_path: Path, swe_image: tuple[bytes, str]) -> Path:
    """The fixture row as a plain SWE row that names the image (and no repo_dir)."""
    [src] = [
        r for r in map(json.loads, (FIXTURES / "swe_rebench_rows.jsonl").open()) if r["instance_id"] == ROW_ID
    ]
    row = {
        "instance_id": ROW_ID,
        "image": SWE_IMAGE,
        "workdir": "/testbed",
        "base_commit": swe_image[1],
        "problem_statement": src["problem_statement"],
        "patch": src["patch"],
        "test_patch": src["test_patch"],
        "FAIL_TO_PASS": src["FAIL_TO_PASS"],
        "PASS_TO_PASS": src["PASS_TO_PASS"],
        "test_cmd": "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider "
        "tests/test_slug.py",
    }
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


def uniagent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, env=os.environ)


# -- the tests -------------------------------------------------------------------------------
def test_run_grades_the_row_inside_the_container(
    swe_runtime: Runtime, rows: Path, tmp_path: Path, codec: ChatCodec
) -> None:
    [task] = load_tasks(str(rows))
    replay = write_replay(tmp_path / "replay.jsonl", codec, [task])
    out = tmp_path / "run"
    proc = uniagent(
        "run", "--tasks", str(rows), "--model", f"replay:{replay}", "--sandbox", "container",
        "--set", f"sandbox.runtime={swe_runtime.name}", "--set", "sandbox.pull=never",
        "--output", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    [result] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert summary["episodes"] == 1 and summary["resolved"] == 1, (summary, result.get("error"))
    assert "textkit/slug.py" in result["patch"]
    log = json.dumps(result)
    assert "rootdir: /testbed" in log, "pytest ran in the image's /testbed"
    assert "PASSED tests/test_slug.py::test_collapses_whitespace" in log
    leftover = swe_runtime.run("ps", "-a", "-q", "--filter", f"ancestor={SWE_IMAGE}").stdout.strip()
    assert leftover == "", "every container of the run is gone"


def test_verify_grades_gold_and_empty_inside_the_container(
    swe_runtime: Runtime, rows: Path, tmp_path: Path
) -> None:
    settings = ["--sandbox", "container", "--set", f"sandbox.runtime={swe_runtime.name}"]
    proc = uniagent("verify", "--tasks", str(rows), "--gold", "--output", str(tmp_path / "gold"), *settings)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gold" / "report.json").read_text())
    assert report["resolved_ids"] == [ROW_ID], report["instances"]
    assert "rootdir: /testbed" in report["instances"][ROW_ID]["details"]["log_tail"]

    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        json.dumps({"instance_id": ROW_ID, "model_name_or_path": "empty", "model_patch": ""}) + "\n"
    )
    proc = uniagent(
        "verify",
        "--tasks",
        str(rows),
        "--predictions",
        str(preds),
        "--output",
        str(tmp_path / "e"),
        *settings,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "e" / "report.json").read_text())
    assert report["unresolved_ids"] == [ROW_ID] and report["error_ids"] == [], report["instances"]
    details = report["instances"][ROW_ID]["details"]
    assert details["tests_ran"] and details["report"]["FAIL_TO_PASS"]["failure"] == [
        "tests/test_slug.py::test_collapses_whitespace"
    ], details
