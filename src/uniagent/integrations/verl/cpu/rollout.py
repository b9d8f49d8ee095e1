"""A verl rollout backend over uniagent's `LocalEngine` (torch on CPU): replica, server actor, adapter.

verl 0.9 splits a rollout backend in three, and this module fills each slot the way vLLM's does
(`workers/rollout/vllm_rollout/`), so verl's own machinery (LLMServerManager, the router, the
agent-loop workers, the checkpoint-engine manager) drives it unchanged:

- `LocalRolloutReplica` (a `RolloutReplica`, registered in `RolloutReplicaRegistry`): in hybrid mode
  verl hands it the trainer worker group; it starts one `LocalRolloutServer` Ray actor per replica,
  named `uniagent_local_server_{replica}_0` so the adapter can find it, as vLLM's replica does.
- `LocalRolloutServer` (the Ray actor verl's `LLMServerClient` calls): owns a `LocalEngine` loaded
  from the HF directory verl trains (`actor_rollout_ref.model.path`) and answers
  `generate(prompt_ids, sampling_params, request_id) -> TokenOutput` with ids and logprobs.
  `abort_all_requests` (partial rollout) returns the tokens sampled so far with
  `stop_reason="aborted"`, which `VerlEngine` resumes; requests that arrive until
  `resume_generation` wait. Sleep/wake/KV calls are no-ops: CPU memory is not handed back and forth.
- `LocalServerAdapter` (a `BaseRollout`, registered in `_ROLLOUT_REGISTRY`): lives in the trainer
  worker (hybrid) or in the replica's `CheckpointEngineWorker` (standalone, fully async, weights from
  the `uniagent_ray` checkpoint engine). verl's naive (in-process, sync) weight sync passes it the
  trainer's full tensors under HF names; rollout rank 0 ships them to the server in one Ray call
  and the engine swaps them in between two decode steps (`LocalEngine.update_weights`, which
  accepts tied weights such as SmolLM2's `lm_head`/`embed_tokens` under either name). Every rank
  drains the generator, because with more than one FSDP rank each `full_tensor()` is a collective.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterable, Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

log = logging.getLogger(__name__)

ROLLOUT_NAME = "uniagent_local"
SERVER_PREFIX = f"{ROLLOUT_NAME}_"


def server_name(replica_rank: int, node_rank: int = 0) -> str:
    """The Ray actor name of a replica's server (what the adapter looks up)."""
    return f"{SERVER_PREFIX}server_{replica_rank}_{node_rank}"


def _get(config: Any, key: str, default: Any = None) -> Any:
    """Read `key` from a dataclass, a DictConfig or a dict alike."""
    if isinstance(config, dict):
        return config.get(key, default)
    getter = getattr(config, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:
            pass  # a dataclass' .get may not take a default
    return getattr(config, key, default)


class LocalRolloutServer:
    """The rollout server verl's `LLMServerClient` talks to (as a Ray actor), over a `LocalEngine`."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0, **engine_options: Any) -> None:
        from uniagent.models.loading import ModelSource
        from uniagent.models.local import LocalEngine

        self.config = config
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        self.updates: list[dict[str, Any]] = []
        self.requests = 0
        self.aborted = 0
        path = _get(model_config, "local_path") or _get(model_config, "path")
        self.prompt_length = int(_get(config, "prompt_length", 1024))
        self.response_length = int(_get(config, "response_length", 1024))
        self.max_model_len = int(_get(config, "max_model_len") or self.prompt_length + self.response_length)
        # verl recomputes old logprobs from logits / rollout.temperature, and its vLLM servers report
        # that distribution's logprobs (logprobs_mode="processed_logprobs"): the engine must too.
        mode = str(_get(config, "logprobs_mode", "processed_logprobs") or "processed_logprobs")
        options: dict[str, Any] = {
            "max_batch_size": max(int(_get(config, "max_num_seqs", 16) or 16), 1),
            "memory_budget_bytes": 2 << 30,
            "logprobs_mode": "raw" if mode.startswith("raw") else "scaled",
            **dict(_get(_get(config, "engine_kwargs", {}) or {}, ROLLOUT_NAME, {}) or {}),
            **engine_options,
        }
        self.engine = LocalEngine(ModelSource(str(path)), max_model_len=self.max_model_len, **options)
        custom = _get(config, "custom", None) or {}
        self.events_path = _get(custom, "uniagent_local_events", None)
        self._event("start", pid=os.getpid(), logprobs_mode=options["logprobs_mode"], **self._fingerprint())
        self._inflight: dict[str, asyncio.Task] = {}
        self._aborting: set[str] = set()
        self._open = asyncio.Event()
        self._open.set()

    # -- generation ------------------------------------------------------------------------------
    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> TokenOutput:
        """Token in, token out, as `vLLMHttpServer.generate`: the sampled ids, their logprobs, and
        `stop_reason` "completed" (stop or length, as vLLM reports both) or "aborted"."""
        from uniagent.models.base import SamplingParams

        if image_data is not None or video_data is not None:
            raise ValueError("the uniagent_local rollout serves text only")
        await self._open.wait()
        self.requests += 1
        prompt_ids = [int(t) for t in prompt_ids]
        # a request under way (a reader can act while the rollout certainly runs, whatever it samples)
        self._event(
            "generating", request_id=request_id, prompt_tokens=len(prompt_ids), global_steps=self.global_steps
        )
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room within {self.max_model_len}")
        budget = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        if budget is None:
            budget = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        rp = sampling_params.get("repetition_penalty")
        if rp not in (None, 1, 1.0):
            log.warning("uniagent_local ignores repetition_penalty=%s", rp)
        sampling = SamplingParams(
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=int(sampling_params.get("top_k", -1) or -1),
            max_tokens=max(1, min(int(budget), room)),
            stop_token_ids=[int(t) for t in sampling_params.get("stop_token_ids") or []],
            seed=sampling_params.get("seed"),
        )
        ids: list[int] = []
        logprobs: list[float] = []

        def on_token(token_id: int, logprob: float) -> None:
            ids.append(int(token_id))
            logprobs.append(float(logprob))

        coro = self.engine.generate(prompt_ids, sampling, request_id, on_token=on_token)
        task = asyncio.ensure_future(coro)
        self._inflight[request_id] = task
        try:
            generation = await task
        except asyncio.CancelledError:
            if request_id not in self._aborting:
                raise
            self.aborted += 1
            # verl's client resumes it as a new request (its own fresh id) whose prompt is this one's
            # plus these tokens: what a reader matches the resumed "generated" event by
            self._event(
                "aborted",
                request_id=request_id,
                prompt_tokens=len(prompt_ids),
                tokens=len(ids),
                version=self.engine.version,
                global_steps=self.global_steps,
            )
            return TokenOutput(
                token_ids=ids, log_probs=logprobs, stop_reason="aborted", extra_fields=self._extra(None)
            )
        finally:
            self._inflight.pop(request_id, None)
            self._aborting.discard(request_id)
        if self.events_path:  # what a test reads to see an aborted request resume under new weights
            versions = list(generation.versions or [self.engine.version])
            self._event(
                "generated",
                request_id=request_id,
                prompt_tokens=len(prompt_ids),
                tokens=len(generation.token_ids),
                min_version=min(versions),
                max_version=max(versions),
                global_steps=self.global_steps,
            )
        return TokenOutput(
            token_ids=list(generation.token_ids),
            log_probs=list(generation.logprobs),
            stop_reason="completed",
            extra_fields=self._extra(generation.versions),
        )

    def _extra(self, versions: list[int] | None) -> dict[str, Any]:
        extra: dict[str, Any] = {"global_steps": self.global_steps}
        if versions:
            extra["min_global_steps"], extra["max_global_steps"] = min(versions), max(versions)
        return extra

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Partial rollout: stop every running request (each returns its tokens so far, "aborted")
        and hold new ones until `resume_generation`."""
        self._open.clear()
        ids = list(self._inflight)
        self._aborting.update(ids)
        for task in list(self._inflight.values()):
            task.cancel()
        self._event("abort", request_ids=ids, version=self.engine.version, global_steps=self.global_steps)
        return {"aborted_count": len(ids), "request_ids": ids}

    async def resume_generation(self) -> None:
        self._open.set()

    # -- weights ---------------------------------------------------------------------------------
    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> dict:
        """Serve `state` (HF names, full tensors) from now on; tag later tokens with `global_steps`."""
        version = global_steps if global_steps is not None else self.engine.version + 1
        start = time.perf_counter()
        info = await asyncio.wrap_future(self.engine.update_weights(state, int(version), interrupt=True))
        self.global_steps = global_steps
        record = {**info, "tensors": len(state), "seconds": time.perf_counter() - start}
        self.updates.append(record)
        self._event("update", **{**record, "global_steps": global_steps, **self._fingerprint()})
        log.info("uniagent_local: weights updated to version %s (%d tensors)", version, len(state))
        return record

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def _fingerprint(self) -> dict[str, Any]:
        """The served version and a checksum of every weight: a cheap 'did the weights change' probe."""
        with torch.no_grad():
            total = sum(float(p.double().sum()) for p in self.engine.model.parameters())
        return {"version": self.engine.version, "weight_sum": total}

    def _event(self, kind: str, **fields: Any) -> None:
        """Append one JSON line to `rollout.custom.uniagent_local_events` (when set): what a test or an
        operator reads after the run, when the actor is gone."""
        if not self.events_path:
            return
        record = {"event": kind, "time": time.time(), "requests": self.requests, **fields}
        line = json.dumps(record, default=str)
        with open(self.events_path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def stats(self) -> dict[str, Any]:
        """What a test checks: requests served, aborts, weight updates applied, the served version."""
        return {
            "requests": self.requests,
            "aborted": self.aborted,
            "updates": list(self.updates),
            "version": self.engine.version,
            "global_steps": self.global_steps,
        }

    def weight_checksum(self, name: str) -> float:
        """Sum of one served parameter (a cheap 'did the weights change' probe)."""
        return float(dict(self.engine.model.named_parameters())[name].detach().double().sum())

    def served_state(self, names: list[str]) -> dict[str, torch.Tensor]:
        params = dict(self.engine.model.named_parameters())
        return {name: params[name].detach().clone() for name in names}

    # -- lifecycle calls verl makes on every backend (nothing to free or restore on CPU) ----------
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        while self._inflight:
            await asyncio.sleep(0.05)

    async def start_profile(self, **_: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    def ready(self) -> bool:
        return True


class LocalRolloutReplica(RolloutReplica):
    """One `LocalRolloutServer` per replica, beside the trainer workers verl hands over (hybrid)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(LocalRolloutServer)

    async def launch_servers(self) -> None:
        node_id = None
        if self.workers:
            node_id = await self.workers[0].__ray_call__.remote(
                lambda _self: ray.get_runtime_context().get_node_id()
            )
        options: dict[str, Any] = {
            "name": server_name(self.replica_rank) + self.name_suffix,
            "max_concurrency": self.max_concurrency,
            "num_cpus": 0,  # the engine thread is the only work; Ray's logical CPUs are the trainer's
        }
        if node_id is not None:
            options["scheduling_strategy"] = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False
            )
        server = self.server_class.options(**options).remote(
            config=self.config, model_config=self.model_config, replica_rank=self.replica_rank
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"local://{options['name']}"

    def rollout_worker_use_gpu(self) -> bool:
        return False


class LocalServerAdapter(BaseRollout):
    """The trainer worker's handle on its replica's server: weight sync, nothing else.

    Generation goes through verl's agent-loop workers straight to the server actor; verl's sync
    generate_sequences path is retired (as for vLLM's ServerAdapter)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self.server_handle: Any = None
        self.sent = 0

    def _server(self) -> Any:
        if self.server_handle is None:
            self.server_handle = ray.get_actor(server_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]] | AsyncIterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        peft_config: Any = None,
        **_: Any,
    ) -> dict[str, Any] | None:
        if wire_format != "named_tensors" or peft_config is not None:
            raise NotImplementedError(
                "uniagent_local takes full named tensors (no delta flushes, no LoRA adapters)"
            )
        from verl.workers.rollout.utils import ensure_async_iterator

        state: dict[str, torch.Tensor] = {}
        # naive sync hands a generator, checkpoint engines (uniagent_ray) an async one; every rank
        # drains it, because full_tensor() is a collective
        async for name, tensor in ensure_async_iterator(weights):
            if self.rollout_rank == 0:
                state[name] = tensor.detach().to("cpu")
        if self.rollout_rank != 0:
            return None
        record = await self._server().update_weights.remote(state, global_steps)
        self.sent += 1
        return record

    def generate_sequences(self, prompts: Any) -> Any:
        raise NotImplementedError("uniagent_local serves verl's async agent loop; there is no sync generate")
