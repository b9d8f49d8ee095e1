"""A verl checkpoint engine for CPU-only runs: the trainer's weights travel through Ray's object store.

verl's disaggregated trainers (the fully-async trainer among them) sync weights through a
`CheckpointEngine` that both sides hold: the trainer worker (`send_weights`) and each rollout
replica's `CheckpointEngineWorker` (`receive_weights`, whose tensors it hands to the backend's
`BaseRollout.update_weights`). verl's own engines move tensors over NCCL/HCCL/NIXL/Mooncake, all
device transports; none runs on a CPU-only machine. This one, registered as
`checkpoint_engine.backend=uniagent_ray` (loaded by `checkpoint_engine.custom_backend_module=
uniagent.integrations.verl.cpu.checkpoint`, which verl imports in every process that builds or
manages an engine), uses what a Ray cluster always has:

- `prepare()` returns the calling worker's own Ray actor handle;
- `build_topology` (run by verl's `CheckpointEngineManager`) gives trainer rank 0 the handles of every
  rollout worker; other trainer ranks only drain their generator (`full_tensor()` is a collective);
- `send_weights` gathers the full tensors, `ray.put`s the state once and passes the reference to each
  receiver's `execute_checkpoint_engine("deliver", [ref], ...)` (a list, so Ray hands over the
  reference rather than the value); `receive_weights` waits for the delivery and yields the tensors.

Partial rollout needs nothing here: verl's manager aborts the replicas before the sync and resumes
them after (`CheckpointEngineManager.update_weights`), and the uniagent_local server turns the abort
into `stop_reason="aborted"` outputs that verl's `FullyAsyncLLMServerClient` resumes.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import ray
import torch
from verl.checkpoint_engine import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

BACKEND = "uniagent_ray"


@CheckpointEngineRegistry.register(BACKEND)
class RayObjectStoreCheckpointEngine(CheckpointEngine):
    """Weights from trainer rank 0 to every rollout worker through one object-store put per sync."""

    def __init__(
        self, bucket_size: int = 0, poll_s: float = 0.02, timeout_s: float = 600.0, **_: Any
    ) -> None:
        self.bucket_size = bucket_size  # verl always passes it; one put of the whole state needs none
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.rank: int | None = None
        self.receivers: list[Any] = []
        # deliver() may run on a Ray executor thread while receive_weights polls on the event loop
        self._inbox: queue.SimpleQueue[tuple[Any, int | None]] = queue.SimpleQueue()

    def prepare(self) -> dict[str, Any]:
        try:
            handle = ray.get_runtime_context().current_actor
        except Exception:  # not inside an actor (a unit test driving the engine directly)
            handle = None
        return {"handle": handle}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        receivers = [meta["handle"] for meta in metadata[actor_wg_world_size:]]
        actor = {
            "rank": list(range(actor_wg_world_size)),
            "receivers": [receivers if rank == 0 else [] for rank in range(actor_wg_world_size)],
        }
        rollout = {
            "rank": [actor_wg_world_size + i for i in range(rollout_world_size)],
            "receivers": [[] for _ in range(rollout_world_size)],
        }
        return actor, rollout

    def init_process_group(self, rank: int, receivers: list[Any]) -> None:
        self.rank = rank
        self.receivers = list(receivers)

    def finalize(self) -> None:
        self.receivers = []

    async def send_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None
    ) -> dict[str, float]:
        start = time.perf_counter()
        state: dict[str, torch.Tensor] = {}
        async for name, tensor in ensure_async_iterator(weights):
            if self.receivers:
                state[name] = tensor.detach().to("cpu").contiguous()
        if not self.receivers:
            return {}
        ref = ray.put(state)
        await asyncio.gather(
            *[
                handle.execute_checkpoint_engine.remote("deliver", [ref], global_steps)
                for handle in self.receivers
            ]
        )
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        return {"uniagent_ray/send_s": time.perf_counter() - start, "uniagent_ray/bytes": float(nbytes)}

    def deliver(self, refs: list[Any], global_steps: int | None = None) -> None:
        """Called by the sender on this (receiving) worker's actor: queue the state's reference."""
        self._inbox.put((refs[0], global_steps))

    async def receive_weights(
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                ref, _sent_steps = self._inbox.get_nowait()
                break
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no weights delivered within {self.timeout_s}s") from None
                await asyncio.sleep(self.poll_s)
        state: dict[str, torch.Tensor] = await ref
        for name, tensor in state.items():
            yield name, tensor
