"""The one verl function the CPU platform has to override: the default process-group backend.

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
    dist_utils.initialize_global_process_group_ray = initialize_global_process_group_ray
    for name in _IMPORTERS:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "initialize_global_process_group_ray"):
            module.initialize_global_process_group_ray = initialize_global_process_group_ray
