"""verl on a CPU-only machine: a CPU platform and a rollout backend over uniagent's `LocalEngine`.

Importing this package registers both with verl (`register()`), so it is what verl's plugin hook
imports: set, in the environment of the driver (Ray workers inherit it, and every process that
imports verl runs the hook)

    VERL_USE_EXTERNAL_MODULES=uniagent.integrations.verl.cpu
    VERL_PLATFORM=cpu

and pick the rollout with `actor_rollout_ref.rollout.name=uniagent_local` (`recipes/verl/
multiturn_grpo_cpu.yaml` has the whole command). What is registered where:

- platform "cpu" in `verl.plugin.platform.PlatformRegistry` (`platform.py`);
- rollout replica "uniagent_local" in `verl.workers.rollout.replica.RolloutReplicaRegistry` and its
  trainer-side adapter under ("uniagent_local", "async") in `verl.workers.rollout.base._ROLLOUT_REGISTRY`
  (`rollout.py`); the registry holds a dotted path, so the adapter module loads only when used;
- verl's FSDP engines under device "cpu" in `verl.workers.engine.EngineRegistry`;
- the overrides of verl functions (`compat.py`): the default process-group backend, and uniagent's
  step metrics added to `compute_data_metrics` (the latter also by `..plugin`, for every run);
- for disaggregated (fully-async) trainers, the checkpoint engine "uniagent_ray" (`checkpoint.py`),
  registered by verl itself when it imports `checkpoint_engine.custom_backend_module` (that module
  imports `verl.checkpoint_engine`, which is not safe to import from inside `import verl`).

verl imports this module from inside `import verl` (after `verl.protocol` and `verl.utils.device`,
before anything asks for the platform), so everything here imports only verl modules that are safe
at that point.
"""

from __future__ import annotations

ROLLOUT_NAME = "uniagent_local"
_ADAPTER = "uniagent.integrations.verl.cpu.rollout.LocalServerAdapter"
_registered = False


def _load_replica() -> type:
    from uniagent.integrations.verl.cpu.rollout import LocalRolloutReplica

    return LocalRolloutReplica


def _register_fsdp_engines() -> None:
    """Make verl's FSDP engines selectable on device "cpu".

    `EngineRegistry.get_engine_cls` keys engines by (device, vendor) and verl registers its FSDP
    engines for "cuda" and "npu" only, though their code is device-agnostic (every device call goes
    through the platform). Registering the same classes for "cpu" through the registry's own
    decorator is what verl's `VERL_ENGINE_DEVICE=cuda` override would do, without lying about the
    device to the rest of the selection."""
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    engines = EngineRegistry._engines
    pairs = (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead))
    for model_type, engine_cls in pairs:
        backends = [b for b in ("fsdp", "fsdp2") if "cpu" not in engines.get(model_type, {}).get(b, {})]
        if backends:
            EngineRegistry.register(model_type=model_type, backend=backends, device="cpu")(engine_cls)


def register() -> None:
    """Register the CPU platform, the uniagent_local rollout and the overrides (idempotent)."""
    global _registered
    if _registered:
        return
    import uniagent.integrations.verl.cpu.platform  # noqa: F401  (registers PlatformCPU)
    from uniagent.integrations.verl.cpu.compat import log_uniagent_step_metrics, patch_process_group_backend

    patch_process_group_backend()
    log_uniagent_step_metrics()
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = _ADAPTER
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    _register_fsdp_engines()
    _registered = True


register()
