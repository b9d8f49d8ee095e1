"""`PlatformCPU`: a verl platform for machines with no accelerator (device "cpu", gloo).

verl 0.9 routes every device call through `verl.plugin.platform.get_platform()` (`utils/device.py`
delegates to it); upstream ships CUDA, NPU and ROCm platforms and removed its CPU one, so on a
CPU-only machine verl falls back to "nvidia" and the first `torch.cuda` call fails. This platform is
registered under the name "cpu" (`PlatformRegistry.register`) and chosen with `VERL_PLATFORM=cpu`.

Why each answer is what it is:

- `current_device()` is the string "cpu", not an index: verl passes it straight to `tensor.to(...)`
  and `torch.device(...)` (`workers/engine/fsdp/transformer_impl.py`), where an int would mean CUDA.
- `device_module` is `CPUDeviceModule`, `torch.cpu` plus no-op stand-ins for the `torch.cuda`
  helpers verl calls through `get_torch_device()` (`empty_cache`, `mem_get_info`, `memory_allocated`,
  `ipc_collect`, RNG state, ...): on CPU there is no caching allocator to empty and no device memory.
- The collective backend is gloo. verl builds the default process-group backend as
  `"cpu:gloo,{device}:{backend}"`, which torch refuses for device "cpu"; `compat.py` is the one
  override that handles that.
- Ray: the resource name stays "GPU". verl's resource pools ask for one "GPU" per worker bundle and
  `ResourcePoolManager._check_resource_available` counts only GPU/NPU, so the local Ray cluster is
  started with logical GPUs (`ray_kwargs.ray_init.num_gpus`); nothing ever runs on them.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from typing import Any

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM_NAME = "cpu"


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _mem_get_info(*_args: Any, **_kwargs: Any) -> tuple[int, int]:
    """(free, total) host memory: what verl's memory logs and vLLM-style budgets read."""
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


class CPUDeviceModule(types.ModuleType):
    """`torch.cpu` with the `torch.cuda`-style helpers verl calls on `get_torch_device()`.

    Attribute lookups fall through to `torch.cpu` (`synchronize`, `current_stream`, `Stream`,
    `Event`, `device_count`, `is_available`, ...); what `torch.cpu` lacks is defined here.
    """

    def __init__(self) -> None:
        super().__init__("uniagent_cpu_device")
        self.empty_cache = _noop
        self.ipc_collect = _noop
        self.set_per_process_memory_fraction = _noop
        self.reset_peak_memory_stats = _noop
        self.memory_allocated = _zero
        self.memory_reserved = _zero
        self.max_memory_allocated = _zero
        self.max_memory_reserved = _zero
        self.mem_get_info = _mem_get_info
        self.get_rng_state = lambda *a, **k: torch.get_rng_state()
        self.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
        self.manual_seed = torch.manual_seed
        self.manual_seed_all = torch.manual_seed
        self.get_device_name = lambda *a, **k: "cpu"
        self.set_device = _noop
        self.current_device = lambda: "cpu"

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)


_DEVICE_MODULE = CPUDeviceModule()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform for CPU-only hosts: device "cpu", gloo collectives, logical Ray GPUs."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu selects it, so a GPU host is unaffected.
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME

    def current_device(self) -> str:  # type: ignore[override]
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None  # no caching allocator on CPU (verl toggles expandable_segments around syncs)

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for the logical GPUs; verl only reads and forwards it.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
