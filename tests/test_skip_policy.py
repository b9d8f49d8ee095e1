"""The suite's skip policy (tests/conftest.py), on real suites: a missing real part skips with
its reason locally and fails the run under CI=true, naming the part."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SHARED_TEMPLATES, needs_bwrap


def pytest_run(*args: str, ci: bool, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        base["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def path_without(tmp_path: Path, *hidden: str) -> str:
    """A PATH holding every program of this machine's PATH except `hidden`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            target = bin_dir / name
            if name in hidden or target.exists() or name.startswith(hidden):
                continue
            target.symlink_to(os.path.join(folder, name))
    return str(bin_dir)


@needs_bwrap
@pytest.mark.parametrize("ci", [False, True])
def test_missing_bubblewrap(tmp_path: Path, ci: bool) -> None:
    path = path_without(tmp_path, "bwrap")
    proc = pytest_run("tests/test_shell_session.py", "-k", "state_persists and local", ci=ci, PATH=path)
    out = proc.stdout + proc.stderr
    if ci:
        assert proc.returncode == 1 and "CI=true but bubblewrap is missing" in out, out
    else:
        assert proc.returncode == 0 and "1 skipped" in out, out
        assert "SKIPPED" in out and "bubblewrap is missing: apt-get install bubblewrap" in out, out


@pytest.mark.parametrize("ci", [False, True])
def test_missing_shared_templates(tmp_path: Path, ci: bool) -> None:
    proc = pytest_run(
        "tests/test_codec.py", "-k", "test_template_facts", ci=ci, UNIAGENT_SHARED_DIR=str(tmp_path)
    )
    out = proc.stdout + proc.stderr
    if ci:
        assert proc.returncode == 1 and "CI=true but the shared chat templates is missing" in out, out
    else:
        assert proc.returncode == 0 and "the shared chat templates is missing" in out, out


@pytest.mark.skipif(shutil.which("podman") is None and shutil.which("docker") is None, reason="no runtime")
def test_no_container_runtime_fails_ci_naming_both(tmp_path: Path) -> None:
    path = path_without(tmp_path, "docker", "podman")
    proc = pytest_run(
        "tests/test_sandbox_container.py", "-k", "start_exec_state_and_clean_stop", ci=True, PATH=path
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "CI=true but none of a container runtime (docker or podman)" in out, out
    assert "docker CLI not installed" in out and "podman not installed" in out, out


def test_shared_templates_are_found_here() -> None:
    """Beside the checkout (../shared), as in CI and on this machine."""
    assert SHARED_TEMPLATES.is_dir(), SHARED_TEMPLATES
