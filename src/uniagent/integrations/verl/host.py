"""What this host can run, checked before a launch: one clear line instead of a Ray traceback.

verl finds out late that a command cannot run where it was started: a GPU command on a host without
CUDA fails minutes in, inside a Ray worker (`RuntimeError: No CUDA GPUs are available`, or a
resource pool that never fills), and a rollout backend that is not installed fails as an
`ImportError` deep in a replica. `check_host` reads the resolved command (and the environment it
runs with) and raises `ConfigError` naming the setting and what to change; `uniagent` prints it as
one line and exits 2. It runs for a launch only: `--print` and `uniagent verl command` show the
command for any host (a GPU cluster's is printed on a laptop). The facts of the host are passed in
(`Host`), so the rules are tested without a GPU or vLLM.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from uniagent.errors import ConfigError
from uniagent.integrations.verl.overrides import override_value

ROLLOUT_MODULES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm"}
"""verl's rollout backends and the package each imports."""
CPU_CHECKPOINT_ENGINE = "uniagent_ray"
FULLY_ASYNC = "verl.experimental.fully_async_policy.fully_async_main"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@dataclass
class Host:
    """What the checks need to know of this host."""

    cuda: Callable[[], bool] = _cuda_available
    importable: Callable[[str], bool] = field(default=lambda name: importlib.util.find_spec(name) is not None)


HOST = Host()
"""This host, as `launch` sees it (a test replaces it)."""


def check_host(entrypoint: str, overrides: list[str], env: dict[str, str], host: Host | None = None) -> None:
    """Raise `ConfigError` for the first thing in the command this host cannot run (module docstring).
    `env`: the variables the command runs with (the recipe's over the caller's); `host`: `HOST`."""
    host = host or HOST
    platform = (env.get("VERL_PLATFORM") or os.environ.get("VERL_PLATFORM") or "").strip().lower()
    device = (override_value(overrides, "trainer.device") or "cuda").lower()
    rollout = override_value(overrides, "actor_rollout_ref.rollout.name")
    if (device == "cpu") != (platform == "cpu"):
        raise ConfigError(
            f"trainer.device={device} with VERL_PLATFORM={platform or '(unset)'}: verl trains on CPU "
            "only with both set to cpu (the *_cpu recipes set both; so does model.device=cpu)"
        )
    if device == "cuda" and not host.cuda():
        raise ConfigError(
            "trainer.device=cuda (a local config's model.device=cuda): this host has no CUDA device "
            "(torch.cuda.is_available() is False); train here with model.device=cpu (the *_cpu recipes), "
            "or run the command on a GPU host (--print shows it)"
        )
    module = ROLLOUT_MODULES.get(rollout or "")
    if module is not None and not host.importable(module):
        raise ConfigError(
            f"actor_rollout_ref.rollout.name={rollout}: {module} is not installed here "
            f"(pip install {module.replace('_', '-')}, or verl's {rollout} extra); "
            "without it, model.device=cpu serves the rollout with uniagent_local"
        )
    if entrypoint == FULLY_ASYNC and device == "cpu":
        backend = override_value(overrides, "actor_rollout_ref.rollout.checkpoint_engine.backend")
        if backend != CPU_CHECKPOINT_ENGINE:
            raise ConfigError(
                f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend or '(verl default)'}: "
                f"fully-async on CPU syncs weights to its standalone rollout only through "
                f"{CPU_CHECKPOINT_ENGINE} (verl's own engines need GPUs or colocation); "
                "see recipe multiturn_gspo_fully_async_cpu"
            )
