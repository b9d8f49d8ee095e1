"""The verl functions uniagent overrides, each a stand-in for a fix or hook upstream lacks.

`patch_process_group_backend`: the default process-group backend (the CPU platform needs it).
`log_uniagent_step_metrics`: uniagent's per-step figures in verl's training metrics (every run).

The default process-group backend:

`verl.utils.distributed.initialize_global_process_group_ray` builds, when no backend is given,
`f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"`. With the CPU platform that is
"cpu:gloo,cpu:gloo", which torch refuses (`ValueError: Duplicate device type cpu in backend
string`). Every training worker calls it that way (`workers/engine_workers.py`
`TrainingWorker.__init__`), and the platform interface has no hook for the backend string.

The stand-in passes "cpu:gloo" when the platform's device is "cpu" and otherwise calls verl's
function unchanged. It is what upstream's own fix would be (only add the device entry when the device
is not "cpu"); drop this module once verl builds the string that way. The wrapper is installed on
`verl.utils.distributed` before any module imports the name (the plugin runs inside `import verl`);
a module that already imported it gets it replaced too.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

_MARK = "__uniagent_cpu_backend__"
# Modules that `from verl.utils.distributed import initialize_global_process_group_ray`.
_IMPORTERS = ("verl.workers.engine_workers", "verl.checkpoint_engine.base")


def patch_process_group_backend() -> None:
    """Install the stand-in for `initialize_global_process_group_ray` (idempotent)."""
    import verl.utils.distributed as dist_utils

    original = dist_utils.initialize_global_process_group_ray
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second: Any = None, backend: str | None = None) -> Any:
        from verl.utils.device import get_device_name

        if backend is None and get_device_name() == "cpu":
            backend = "cpu:gloo"
        return original(timeout_second=timeout_second, backend=backend)

    setattr(initialize_global_process_group_ray, _MARK, True)
    _replace(dist_utils, initialize_global_process_group_ray, _IMPORTERS)


def _replace(owner: Any, function: Any, importers: tuple[str, ...]) -> None:
    """Put `function` in place of its namesake on `owner` and on every module of `importers` that is
    loaded already (they bound the name with `from owner import name`, so the owner alone is not enough)."""
    name = function.__name__
    setattr(owner, name, function)
    for module_name in importers:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, name):
            setattr(module, name, function)


_METRICS_MARK = "__uniagent_step_metrics__"
# Modules that `from verl.trainer.ppo.metric_utils import compute_data_metrics` at import time.
_METRIC_IMPORTERS = ("verl.trainer.ppo.ray_trainer", "verl.experimental.separation.ray_trainer")


def log_uniagent_step_metrics() -> None:
    """Make verl's `compute_data_metrics` also return `integrations/verl/metrics.py:step_metrics` of
    the batch (idempotent), so each logged training step carries uniagent's figures.

    verl 0.9 has no hook for per-step metrics of its own making: the agent loop's extra fields reach
    the trained batch as `non_tensor_batch` columns, but neither the legacy trainer nor the
    fully-async one reduces them (verl issue #4545; its open PR #5793 would log only numeric
    `reward_extra_info`). `compute_data_metrics(batch)` is the one call both trainers make with the
    trained batch whose result goes into the step's metrics, so the stand-in wraps it and adds keys
    under `uniagent/` (nothing of verl's changes; a batch without `exit_reason` adds nothing). Drop it
    when verl logs agent-loop fields itself. Installed on `metric_utils` from inside `import verl`
    (the plugin hook), before the trainers import the name; a trainer module already imported gets
    it replaced too.
    """
    import verl.trainer.ppo.metric_utils as metric_utils

    original = metric_utils.compute_data_metrics
    if getattr(original, _METRICS_MARK, False):
        return

    @functools.wraps(original)
    def compute_data_metrics(batch: Any, use_critic: bool = True) -> dict[str, Any]:
        from uniagent.integrations.verl.metrics import step_metrics

        return {**original(batch=batch, use_critic=use_critic), **step_metrics(batch.non_tensor_batch)}

    setattr(compute_data_metrics, _METRICS_MARK, True)
    _replace(metric_utils, compute_data_metrics, _METRIC_IMPORTERS)
