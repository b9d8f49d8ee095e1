"""`LocalEngine`: the embedded transformers engine, token in / token out, batching concurrent requests.

Why it is built this way:

- One worker thread owns the model and the KV cache. Coroutines only enqueue a request and await a
  future, so the event loop stays responsive while forward passes run (torch releases the GIL), and
  results come back through `loop.call_soon_threadsafe`.
- Between two decode steps the worker admits waiting requests (`_take`: arrival order, within the
  memory caps); a `BatchRunner` (`models/local_batch.py`, which says why batching, the slot cache and
  prefix reuse work as they do) prefills them, merges them into the running batch and decodes.
- Engines never assume the tokenizer's eos (SmolLM2 reports `<|im_start|>`); callers pass stop ids.
- Weight sync (`update_weights`, models/local_update.py says why it works as it does) is applied by the
  same worker between two decode steps; every token is tagged with the policy `version` that sampled it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import torch

from uniagent.cpu import release_openmp_team
from uniagent.errors import EngineError
from uniagent.models.base import Generation, SamplingParams
from uniagent.models.kv import use_gqa_attention
from uniagent.models.kv_prefix import PrefixStore
from uniagent.models.linear import pack_linears, packed_bytes
from uniagent.models.loading import ModelSource, load_causal_lm, resolve_model
from uniagent.models.local_batch import BatchRunner
from uniagent.models.local_memory import (
    Incoming,
    gib,
    resolve_budget,
    resolve_prefix_cap,
    tune_malloc,
)
from uniagent.models.local_rows import Batch, EngineStats, Request, settle
from uniagent.models.local_update import WeightUpdate, copy_state, match_state, resolve
from uniagent.models.precision import Precision
from uniagent.models.precision import resolve as resolve_precision
from uniagent.models.registry import EngineKind

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from uniagent.models.config import ModelConfig

log = logging.getLogger(__name__)


class LocalEngine:
    """A `TokenEngine` over a transformers causal LM on CPU or CUDA.

    `model` is a spec for `resolve_model` (default: the packaged SmolLM2), a `ModelSource`, or an
    already-loaded model whose weights are shared (see `from_model`). `eos_token_ids` are stop ids added
    to every request, for callers that want them without passing them each time.

    Memory is a budget (`memory_budget_bytes`; None: half of what the machine has at start, see
    models/local_memory.py): the running batch's keys/values at their worst (padded to the widest row,
    grown by the most tokens a row may still sample), an admission's prefill cache and activations, and
    the kept prefixes stay within it. Admission caps: at most `max_batch_size` rows decode together,
    their worst-case tokens (prompt + max_tokens each) stay under `max_batch_tokens`, and their estimated
    peak under the budget (kept prefixes are evicted first). One prefill forward pads at most
    `max_prefill_tokens` (longer prefills run in column chunks). Requests are admitted in arrival order;
    a queued request that does not fit waits for rows to finish; one over a cap even alone runs alone.

    `prefix_cache_bytes` caps the keys/values kept between the turns of episodes, within the budget
    (per request id, least recently used dropped first; SmolLM2-135M in fp32 needs 45 KiB per token;
    None: a quarter of the budget; 0 turns prefix reuse off). Models with sliding-window layers keep the
    plain transformers cache: no reuse, and a running batch does not take in new requests.

    `version` is the policy version the weights are (a trainer's step count); `update_weights` replaces
    the weights and the version, and every `Generation` says per token which version sampled it.

    `logprobs_mode` "raw" (default) reports each token's temperature-1 log-softmax; "scaled" the
    log-softmax of logits / temperature, what verl's trainer recomputes (models/local_batch.py).

    `step_delay_s` (default 0) sleeps the worker thread after every batch step: a slow rollout on a fast
    machine, so a test can land a weight update in the middle of a generation (verl's partial rollout)
    whatever the hardware. The event loop is never blocked by it.
    """

    _weight_bytes = 0  # the model's parameters; they and a packed copy live outside the budget
    _packed_bytes = 0  # the second, laid-out copy of packed bf16 weights (models/linear.py)

    def __init__(
        self,
        model: str | ModelSource | torch.nn.Module | None = None,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 16,
        max_batch_tokens: int = 65536,
        max_prefill_tokens: int = 16384,
        batch_wait_s: float = 0.002,
        eos_token_ids: Iterable[int] = (),
        max_model_len: int | None = None,
        prefix_cache_bytes: int | None = None,
        memory_budget_bytes: int | None = None,
        version: int = 0,
        threads: int | None = None,
        logprobs_mode: str = "raw",
        step_delay_s: float = 0.0,
    ) -> None:
        if max_batch_size < 1:
            raise EngineError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if logprobs_mode not in ("raw", "scaled"):
            raise EngineError(f"logprobs_mode must be 'raw' or 'scaled', got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        self.step_delay_s = max(float(step_delay_s), 0.0)
        loader: Callable[[], torch.nn.Module] | None = None
        if isinstance(model, torch.nn.Module):
            self.name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
            served = str(next(model.parameters()).dtype).removeprefix("torch.")
            self.precision = Precision(served, "the given model's")
        else:
            source = model if isinstance(model, ModelSource) else resolve_model(model)
            if device.startswith("cuda") and not torch.cuda.is_available():
                raise EngineError(f"device {device!r} requested but CUDA is not available; use device='cpu'")
            self.name = source.name
            self.precision = resolve_precision(dtype, device)
            loader = functools.partial(load_causal_lm, source, device=device, dtype=self.precision.dtype)
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_prefill_tokens = max_prefill_tokens
        self.batch_wait_s = batch_wait_s
        self._max_model_len = max_model_len
        self._eos_ids = frozenset(int(i) for i in eos_token_ids)
        self._stats = EngineStats()
        self.memory_budget_bytes, self.memory_source = resolve_budget(memory_budget_bytes)
        self._prefixes = PrefixStore(resolve_prefix_cap(prefix_cache_bytes, self.memory_budget_bytes))
        self.releases_memory = tune_malloc()
        self._oversized: set[str] = set()  # request ids already warned about (over the budget alone)
        self._pending: collections.deque[Request] = collections.deque()
        self._updates: collections.deque[WeightUpdate] = collections.deque()
        self._version = int(version)
        self._threads = threads  # torch threads of the worker (None: torch's default)
        self._cond = threading.Condition()
        self._closing = False
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        if loader is None:
            self._adopt(model, owned=False)  # type: ignore[arg-type]
        self._thread = threading.Thread(
            target=self._main, args=(loader,), name=f"LocalEngine[{self.name}]", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            self._thread.join()
            raise self._load_error

    def _adopt(self, model: torch.nn.Module, owned: bool) -> None:
        """Take the model; one the engine loaded itself also switches to the copy-free GQA attention
        (a shared model is left as its owner configured it)."""
        self._model = model
        # `_forward` is looked up at each call, so a replaced `_forward` (tests) is what runs.
        self._batches = BatchRunner(
            model,
            forward=lambda **inputs: self._forward(**inputs),
            stats=self._stats,
            prefixes=self._prefixes,
            max_model_len=self._max_model_len or getattr(model.config, "max_position_embeddings", None),
            version=self._version,
            prefill_tokens=self.max_prefill_tokens,
            budget_bytes=self.memory_budget_bytes,
            scaled_logprobs=self.logprobs_mode == "scaled",
        )
        if not self._batches.slots:
            self._prefixes.budget_bytes = 0
        if owned and self._batches.slots:
            use_gqa_attention(model)
        if owned:
            pack_linears(model)
        self._weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self._packed_bytes = packed_bytes(model)
        self.device = self._batches.device
        self._vocab_size = int(model.get_input_embeddings().num_embeddings)
        log.info("%s", self.memory_line)

    @property
    def memory_line(self) -> str:
        """One line saying the memory budget, where it comes from and the prefix cap (start log, doctor)."""
        packed = f" + {gib(self._packed_bytes)} laid out for oneDNN" if self._packed_bytes else ""
        return (
            f"local engine {self.precision.dtype} ({self.precision.why}); weights "
            f"{gib(self._weight_bytes)}{packed} outside the budget; memory budget "
            f"{gib(self.memory_budget_bytes)} ({self.memory_source}); kept "
            f"prefixes up to {gib(self._prefixes.budget_bytes)}; keys/values mapped apart, activations "
            f"reused from the heap: {'yes' if self.releases_memory else 'no (not glibc)'}"
        )

    # ----------------------------------------------------------------------------------- public API

    @classmethod
    def from_model(cls, model: torch.nn.Module, **options: Any) -> LocalEngine:
        """Serve an already-loaded model without copying it, so a trainer's weight updates are seen.

        The caller keeps ownership: the engine does not change the model's device or train/eval mode,
        and the caller must not update weights while a generation is running; `update_weights(None,
        version)` then tags what follows with the new version.
        """
        return cls(model, **options)

    @classmethod
    async def create(cls, model: str | ModelSource | None = None, **options: Any) -> LocalEngine:
        """Build off the event loop: loading takes seconds and would otherwise freeze it."""
        return await asyncio.to_thread(cls, model, **options)

    @property
    def model(self) -> torch.nn.Module:
        """The transformers model being served (shared, not copied)."""
        return self._model

    @property
    def max_model_len(self) -> int | None:
        """The model's context in tokens (prompt + generated); `None` when the model does not say."""
        return self._batches.max_model_len

    @max_model_len.setter
    def max_model_len(self, value: int | None) -> None:
        self._batches.max_model_len = value

    @property
    def version(self) -> int:
        """The policy version being served: the tag of the tokens sampled now."""
        return self._batches.version

    @property
    def stats(self) -> EngineStats:
        """A snapshot of the counters."""
        return dataclasses.replace(self._stats)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        on_token: Callable[[int, float], None] | None = None,
    ) -> Generation:
        """Queue one request and wait for it; it is batched with whatever else is running.

        `on_token(token_id, logprob)` (optional) is called on this event loop for every token as soon as
        it is sampled, before the returned `Generation` resolves: what a streaming server needs.
        """
        self._validate(prompt_ids, request_id)
        loop = asyncio.get_running_loop()
        request = Request(
            prompt_ids=[int(t) for t in prompt_ids],
            sampling=sampling,
            request_id=request_id,
            stop_ids=frozenset(sampling.stop_token_ids) | self._eos_ids,
            loop=loop,
            future=loop.create_future(),
            on_token=on_token,
        )
        with self._cond:
            if self._closing or not self._thread.is_alive():
                raise EngineError(f"LocalEngine is closed; request {request_id!r} was not run")
            self._pending.append(request)
            self._stats.requests += 1
            self._cond.notify()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True
            raise

    def update_weights(
        self,
        state: Mapping[str, torch.Tensor] | None,
        version: int,
        *,
        interrupt: bool = True,
        keep_kv: bool = False,
    ) -> concurrent.futures.Future[dict[str, Any]]:
        """Serve `state` (a name -> tensor mapping such as the policy's `state_dict()`) as `version`.

        Callable from any thread; it only queues. The worker applies the update between two decode steps
        (at once when idle). `interrupt=True` (partial rollout): running generations are taken out and
        resumed under the new weights, so one `Generation` holds tokens of both versions, each with the
        logprob and version it was sampled with. `interrupt=False`: no request is admitted until the
        running ones finish under the old weights, then the update is applied. `keep_kv=True` (overrides
        `interrupt`): applied between two decode steps, the running rows go on with the keys/values the
        old weights computed and kept prefixes stay (models/local_update.py says what that means for
        logprobs). `state=None` changes only
        the version (a model shared with the trainer, already updated in place).

        The future resolves with `{"interrupted": rows resumed, "waited_s": queued until applied,
        "apply_s": the copy, "version": version}`; it fails with `EngineError` when `state` does not fit
        the model (the old weights and version keep serving) or the engine closes first. `state` must not
        change until it resolves. From a coroutine: `await asyncio.wrap_future(future)`; cancelling a
        future not yet running drops the update.
        """
        update = WeightUpdate(
            state=state,
            version=int(version),
            interrupt=interrupt and not keep_kv,
            queued=time.perf_counter(),
            keep_kv=keep_kv,
        )
        with self._cond:
            if self._closing or not self._thread.is_alive():
                resolve(
                    update.future,
                    EngineError(f"LocalEngine is closed; weight update to version {version} was not applied"),
                )
                return update.future
            self._updates.append(update)
            self._cond.notify()
        return update.future

    def close(self, timeout: float = 60.0) -> None:
        """Stop the worker; requests and weight updates still queued or running fail with `EngineError`."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> LocalEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalEngine(name={self.name!r}, device={str(self.device)!r}, rows={self.max_batch_size})"

    def _validate(self, prompt_ids: Sequence[int], request_id: str) -> None:
        if not prompt_ids:
            raise EngineError(f"request {request_id!r}: empty prompt; a generation needs at least one token")
        bad = [t for t in prompt_ids if not 0 <= int(t) < self._vocab_size]
        if bad:
            raise EngineError(
                f"request {request_id!r}: token ids {bad[:5]} are outside the vocabulary "
                f"(0..{self._vocab_size - 1})"
            )
        if self.max_model_len is not None and len(prompt_ids) >= self.max_model_len:
            raise EngineError(
                f"request {request_id!r}: prompt has {len(prompt_ids)} tokens but the model's context is "
                f"{self.max_model_len}; shorten the conversation"
            )

    # ------------------------------------------------------------------------------- worker thread

    def _main(self, loader: Callable[[], torch.nn.Module] | None) -> None:
        """Load (when asked) in the thread that will run the model, then serve.

        libgomp throttles its spin-waits once more than one thread owns an OpenMP team on a machine
        with few cores; a model loaded in one thread and run in another then decodes ~1.5x slower on
        CPU. Keeping load and decode in this thread avoids creating that second team, and the worker
        hands its team back whenever it goes idle, so a trainer's update thread runs unthrottled
        (`uniagent.cpu.release_openmp_team`). `threads` caps this thread's torch threads (a trainer
        updating on the other cores sets it).
        """
        if self._threads:
            torch.set_num_threads(self._threads)
        if loader is not None:
            try:
                self._adopt(loader(), owned=True)
            except BaseException as exc:
                self._load_error = exc
                self._ready.set()
                return
        self._ready.set()
        self._worker()

    def _worker(self) -> None:
        batch: Batch | None = None
        try:
            with torch.inference_mode():
                while True:
                    update = self._due_update(batch)
                    if update is not None:
                        batch = self._apply(batch, update)
                        continue
                    admitted = self._take(batch)
                    if admitted is None:
                        break
                    batch = self._batches.step(batch, admitted)
                    if self.step_delay_s and batch is not None:
                        time.sleep(self.step_delay_s)
        except BaseException as exc:  # a bug here must not leave awaiting coroutines hanging
            log.exception("LocalEngine worker crashed")
            with self._cond:
                self._closing = True
            self._fail_all(batch, EngineError(f"LocalEngine worker crashed: {exc!r}"))
            return
        self._fail_all(batch, EngineError("LocalEngine was closed before the request finished"))

    def _take(self, batch: Batch | None) -> list[Request] | None:
        """Pop the requests that fit next to `batch`; block while idle. `None` means: shut down."""
        with self._cond:
            if batch is None:
                if not self._pending and not self._closing and not self._updates:
                    release_openmp_team()  # idle: its threads would slow another team (uniagent.cpu)
                while not self._pending and not self._closing and not self._updates:
                    self._cond.wait()
                if not self._closing and not self._updates and self.batch_wait_s > 0:
                    # Requests submitted together (asyncio.gather) arrive a few microseconds apart;
                    # a short window lets them share the first prefill.
                    self._cond.wait_for(
                        lambda: self._closing or len(self._pending) >= self.max_batch_size, self.batch_wait_s
                    )
            if self._closing:
                return None
            if self._updates:  # a weight update waits: admit nothing before it is applied
                return []
            if batch is not None and not self._batches.slots:
                return []
            rows = len(batch.rows) if batch is not None else 0
            budget = batch.budget if batch is not None else 0
            running = self._batches.running(batch)
            taken: list[Request] = []
            incoming: list[Incoming] = []
            while self._pending and rows + len(taken) < self.max_batch_size:
                request = self._pending[0]
                if request.cancelled:
                    self._pending.popleft()
                    self._stats.cancelled += 1
                    continue
                reused = self._prefixes.match(request.request_id, request.prompt_ids)
                arriving = Incoming(len(request.prompt_ids), reused, request.sampling.max_tokens)
                peak = self._peak(running, [*incoming, arriving])
                fits = budget + request.budget <= self.max_batch_tokens and peak <= self.memory_budget_bytes
                if not fits and (taken or rows):  # waits for rows to finish
                    break
                if not fits and request.request_id not in self._oversized:
                    self._oversized.add(request.request_id)
                    log.warning(
                        "LocalEngine: request %r needs ~%s, over the memory budget %s: it runs alone",
                        request.request_id,
                        gib(peak),
                        gib(self.memory_budget_bytes),
                    )
                taken.append(self._pending.popleft())
                incoming.append(arriving)
                # The request owns its episode's prefix from here: a failure or cancellation drops it.
                request.prefix = self._prefixes.take(request.request_id, request.prompt_ids)
                request.reused = reused
                budget += request.budget
                # Running work first: kept prefixes get what the admitted work leaves of the budget.
                self._prefixes.fit(self.memory_budget_bytes - peak)
            return taken

    def _peak(self, running: Any, incoming: list[Incoming]) -> int:
        """Estimated peak bytes of admitting `incoming` next to `running` (0 without a slot cache)."""
        plan = self._batches.plan
        return plan.admission_peak(running, incoming, self.max_prefill_tokens) if plan is not None else 0

    def _due_update(self, batch: Batch | None) -> WeightUpdate | None:
        """The next weight update to apply now: any when idle, only an interrupting one mid-batch."""
        with self._cond:
            while self._updates and self._updates[0].future.cancelled():  # dropped by its caller
                self._updates.popleft()
            while self._updates and not self._closing and (batch is None or self._updates[0].mid_batch):
                update = self._updates.popleft()
                if update.future.set_running_or_notify_cancel():  # False: cancelled just now
                    return update
            return None

    def _apply(self, batch: Batch | None, update: WeightUpdate) -> Batch | None:
        """Check, interrupt the running rows, drop every key/value computed under the old weights, copy,
        and queue the interrupted rows first (with `keep_kv`: check, copy, and the batch runs on). A
        state that does not fit changes nothing."""
        began = time.perf_counter()
        try:
            pairs = match_state(self._model, update.state, update.version) if update.state is not None else []
        except EngineError as exc:
            resolve(update.future, exc)
            return batch
        try:
            copy_state(pairs)  # a failure here leaves weights half-copied: the worker stops (see _worker)
        except BaseException as exc:
            resolve(update.future, EngineError(f"weight update to version {update.version} failed: {exc!r}"))
            raise
        resumed = [] if update.keep_kv else self._batches.interrupt(batch)
        if not update.keep_kv:
            self._prefixes.clear()
        self._batches.version = update.version
        self._stats.weight_updates += 1
        self._stats.interrupted += len(resumed)
        with self._cond:
            self._pending.extendleft(reversed(resumed))
        done = time.perf_counter()
        result = {"interrupted": len(resumed), "waited_s": began - update.queued, "apply_s": done - began}
        resolve(update.future, {**result, "version": update.version})
        return batch if update.keep_kv else None

    def _forward(self, **inputs: Any) -> Any:
        """The one place the model is called (tests replace it to inject failures)."""
        return self._model(**inputs)

    def _fail_all(self, batch: Batch | None, error: EngineError) -> None:
        with self._cond:
            pending = list(self._pending)
            self._pending.clear()
            updates = list(self._updates)
            self._updates.clear()
        for update in updates:
            resolve(
                update.future, EngineError(f"weight update to version {update.version} not applied: {error}")
            )
        rows = [row.request for row in batch.rows if row.finish is None] if batch is not None else []
        for request in rows + pending:
            self._stats.failed += 1
            settle(request, EngineError(f"request {request.request_id!r}: {error}"))


async def doctor_check(spec: str | None = None, generate: bool = True) -> list[tuple[str, bool | None, str]]:
    """`uniagent doctor`: the model loads (tokenizer with a usable chat template, weights) and
    generates one token; `generate=False` stops after the tokenizer and its template (seconds
    instead of a weight load). `spec` is what follows `local:` (None: the packaged SmolLM2)."""
    import time

    from uniagent.models.loading import load_tokenizer
    from uniagent.tokens import ChatCodec

    name = f"engine local ({spec or 'SmolLM2, packaged'})"
    try:
        began = time.perf_counter()
        source = resolve_model(spec)
        codec = ChatCodec(await asyncio.to_thread(load_tokenizer, source))
        prompt = codec.prompt_ids([{"role": "user", "content": "Say hi."}])
        if not generate:
            return [(name, True, f"{source.name}: tokenizer and chat template load (weights not loaded)")]
        engine = await LocalEngine.create(source)
        try:
            gen = await engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1), "doctor")
        finally:
            await engine.aclose()
        if len(gen.token_ids) != 1:
            return [(name, False, f"asked for 1 token, got {len(gen.token_ids)}")]
        took = time.perf_counter() - began
        return [(name, True, f"{source.name}: loaded and generated 1 token in {took:.1f}s")]
    except Exception as exc:
        return [(name, False, (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200])]


async def _build(arg: str, config: ModelConfig) -> LocalEngine:
    engine = await LocalEngine.create(
        arg or None,
        max_batch_size=config.max_batch_size,
        device=config.device,
        dtype=config.dtype,
        prefix_cache_bytes=config.prefix_cache_bytes,
        memory_budget_bytes=config.memory_budget_bytes,
    )
    print(engine.memory_line, file=sys.stderr, flush=True)  # a run's start says what it may use
    return engine


def memory_check(config: ModelConfig) -> tuple[str, bool | None, str]:
    """`uniagent doctor`'s row for the budget a local engine built from `config` would get here."""
    budget, source = resolve_budget(config.memory_budget_bytes)
    cap = resolve_prefix_cap(config.prefix_cache_bytes, budget)
    detail = f"{gib(budget)} ({source}); kept prefixes up to {gib(cap)} (model.memory_budget_bytes)"
    return ("engine local memory budget", budget > 0, detail)


async def _doctor(arg: str, config: ModelConfig, quick: bool) -> list[tuple[str, bool | None, str]]:
    return [*(await doctor_check(arg or None, generate=not quick)), memory_check(config)]


# `local` (the packaged SmolLM2) or `local:PATH` (a model directory or .gguf file), loaded here.
KIND = EngineKind(
    name="local",
    usage="local | local:PATH",
    token_level=True,
    build=_build,
    needs_arg=False,
    tokenizer=lambda arg, config: arg or None,
    doctor=_doctor,
)
