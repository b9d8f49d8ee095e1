"""A verl launch this host cannot run stops before it starts: one line, exit 2 (`integrations/verl/host.py`).

The host's facts (CUDA, installed rollout backends) are injected, so each rule is checked the same on a
CPU machine and on a GPU one; the CLI test replaces the module's `HOST`, which `launch` consults
before it writes data or starts verl, and goes through `uniagent.cli.main` (what the `uniagent`
command runs) for the exit status and the line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from uniagent.errors import ConfigError
from uniagent.integrations.verl import host
from uniagent.integrations.verl.host import Host, check_host
from uniagent.integrations.verl.launch import build_command, recipe_env

ROOT = Path(__file__).resolve().parents[1]
LOCAL = str(ROOT / "configs" / "train_multiturn.yaml")
NO_GPU = Host(cuda=lambda: False, importable=lambda name: False)
GPU_VLLM = Host(cuda=lambda: True, importable=lambda name: name == "vllm")


def planned(recipe: str, overrides: list[str]) -> tuple[str, list[str], dict[str, str]]:
    from uniagent.integrations.verl.launch import load_recipe

    command = build_command(recipe, overrides)
    env = recipe_env(load_recipe(recipe)) if not recipe.endswith(".yaml") else {}
    return command[2], command[3:], env


def test_the_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    gpu = planned("multiturn_grpo", [])
    with pytest.raises(ConfigError, match=r"no CUDA device .*model\.device=cpu"):
        check_host(*gpu, host=NO_GPU)
    check_host(*gpu, host=GPU_VLLM)  # a GPU host with vLLM runs it
    with pytest.raises(ConfigError, match=r"rollout\.name=sglang: sglang is not installed here"):
        check_host(*planned("multiturn_grpo", ["actor_rollout_ref.rollout.name=sglang"]), host=GPU_VLLM)
    cpu = planned("multiturn_grpo_cpu", [])
    check_host(*cpu, host=NO_GPU)  # the CPU recipe needs neither
    with pytest.raises(ConfigError, match=r"trainer\.device=cpu with VERL_PLATFORM=\(unset\)"):
        check_host(cpu[0], cpu[1], {}, host=NO_GPU)
    fully_async = planned("multiturn_gspo_fully_async_cpu", [])
    check_host(*fully_async, host=NO_GPU)
    nccl = planned(
        "multiturn_gspo_fully_async_cpu", ["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]
    )
    with pytest.raises(ConfigError, match=r"backend=nccl: fully-async on CPU .* uniagent_ray"):
        check_host(*nccl, host=NO_GPU)


def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str]:
    from uniagent.cli import main

    monkeypatch.setattr(sys, "argv", ["uniagent", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    return int(exited.value.code or 0), capsys.readouterr().err


def test_a_launch_this_host_cannot_run_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may be written: the check comes first
    monkeypatch.setattr(host, "HOST", NO_GPU)
    code, err = run_cli(
        monkeypatch, capsys, "train", "--engine", "verl", "--config", LOCAL, "--set", "model.device=cuda"
    )
    assert code == 2 and err.startswith("error: trainer.device=cuda") and err.count("\n") == 1, err
    assert "no CUDA device" in err and not list(tmp_path.iterdir())
    # --print shows the GPU command on any host
    code, err = run_cli(
        monkeypatch,
        capsys,
        "train",
        "--engine",
        "verl",
        "--config",
        LOCAL,
        "--set",
        "model.device=cuda",
        "--print",
    )
    assert code == 0 and not err
    # a local config in async mode on CPU: verl's fully-async trainer on the CPU twin of its recipe
    code, err = run_cli(
        monkeypatch,
        capsys,
        "train",
        "--engine",
        "verl",
        "--config",
        LOCAL,
        "--set",
        "trainer.mode=async",
        "--print",
    )
    assert code == 0 and not err, err
