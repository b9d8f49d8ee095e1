"""`uniagent doctor` on this machine: every check uses the real part (a bubblewrap sandbox that
runs a command, a model that loads, a daemon or endpoint that answers), and the exit status
says whether the default path works."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from conftest import needs_bwrap
from dashboard_helpers import free_port as closed_port  # free, so nothing listens
from uniagent import cli
from uniagent.doctor import Check, sandbox_types

CLI = [sys.executable, "-m", "uniagent.cli"]


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    """The real command in a fresh process."""
    return subprocess.run([*CLI, "doctor", *args], capture_output=True, text=True, timeout=300, check=False)


def doctor_here(*args: str) -> Result:
    """The same command in this process (the imports that doctor checks are paid once)."""
    cli.console.width = 250  # one table row per line
    return CliRunner().invoke(cli.app, ["doctor", *args])


def row(out: str, name: str) -> str:
    lines = [line for line in out.splitlines() if name in line]
    assert lines, f"no row {name!r} in:\n{out}"
    return lines[0]


@needs_bwrap
def test_doctor_passes_here_and_really_ran_a_command() -> None:
    proc = doctor_here("--quick")
    assert proc.exit_code == 0, proc.output
    local = row(proc.output, "sandbox local (bubblewrap)")
    assert " ok " in local and "ran a command as" in local, local
    assert " ok " in row(proc.output, "engine local")
    assert "the default path works" in proc.output


def test_without_bubblewrap_the_default_path_is_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A PATH with everything doctor's checks use except bwrap.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sh", "podman", "docker", "git", "id"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    proc = doctor_here("--quick")
    assert proc.exit_code == 1, proc.output
    local = row(proc.output, "sandbox local (bubblewrap)")
    assert "FAIL" in local and "bwrap not found" in local
    assert "broken: sandbox local (bubblewrap)" in proc.output


def test_a_missing_local_model_fails(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "model.gguf"
    proc = doctor_here("--quick", "--model", f"local:{missing}")
    assert proc.exit_code == 1, proc.output
    assert "FAIL" in row(proc.output, f"engine local ({missing})")


def test_openai_check_against_a_closed_port_fails() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    proc = doctor_here("--quick", "--model", f"openai:{url}")
    assert proc.exit_code == 1, proc.output
    line = row(proc.output, f"engine openai:{url}")
    assert "FAIL" in line and "cannot connect" in line


def test_a_bad_model_spec_is_a_user_error() -> None:
    proc = doctor("--model", "nosuch:x")
    assert proc.returncode == 2, proc.stderr
    assert "unknown engine 'nosuch'" in proc.stderr and "local | local:PATH" in proc.stderr, proc.stderr
    assert "replay:FILE" in proc.stderr and "openai:URL" in proc.stderr, proc.stderr


def test_any_registered_kind_runs_its_own_check(tmp_path: Path) -> None:
    # replay was refused before the registry; now every kind's check runs (a missing file fails)
    proc = doctor_here("--quick", "--model", f"replay:{tmp_path / 'none.jsonl'}")
    assert proc.exit_code == 1, proc.output
    assert "FAIL" in row(proc.output, "engine replay:")
    assert "check one with --model openai:URL" in row(proc.output, "engine openai:URL")


async def test_the_local_model_check_generates_a_token() -> None:
    from uniagent.models.local import doctor_check

    [(_, ok, detail)] = await doctor_check(None)
    assert ok, detail
    assert "generated 1 token" in detail


async def test_container_checks_reach_the_daemon_not_just_the_binary() -> None:
    from uniagent.sandbox.container import doctor_check

    rows = {name: (ok, detail) for name, ok, detail in await doctor_check()}
    for runtime in ("docker", "podman"):
        ok, detail = rows[f"sandbox container ({runtime})"]
        if shutil.which(runtime) is None:
            assert ok is None
            continue
        answers = subprocess.run([runtime, "info"], capture_output=True, timeout=60, check=False)
        assert ok == (answers.returncode == 0), detail


async def test_every_sandbox_backend_has_its_own_check() -> None:
    import importlib

    from uniagent.sandbox.registry import BACKENDS

    assert sandbox_types() == list(BACKENDS)
    for kind, backend in BACKENDS.items():
        assert backend.doctor == f"{backend.module}:doctor_check", kind
        assert callable(importlib.import_module(backend.module).doctor_check), kind


async def test_verl_and_ray_are_version_checked() -> None:
    from uniagent.integrations.verl import doctor_check as verl_check
    from uniagent.runner.ray_backend import doctor_check as ray_check

    [(_, ok, detail)] = await verl_check()
    assert ok and detail.startswith("verl 0.9") and "UniAgentLoop loads" in detail, detail
    [(_, ok, detail)] = await ray_check()
    assert ok and detail.startswith("ray "), detail


def test_optional_parts_warn_and_required_parts_fail() -> None:
    assert Check("x", False, "", required=True).status == "FAIL"
    assert Check("x", False, "").status == "warn"
    assert Check("x", None, "").status == "n/a"


@pytest.mark.parametrize("module", ["uniagent.integrations.verl", "uniagent.runner.ray_backend"])
async def test_an_unsupported_version_fails(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    target = importlib.import_module("verl" if "verl" in module else "ray")
    monkeypatch.setattr(target, "__version__", "0.1.0")
    [(_, ok, detail)] = await importlib.import_module(module).doctor_check()
    assert ok is False and "0.1.0" in detail
