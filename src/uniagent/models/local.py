"""`LocalEngine`: the embedded transformers engine, token in / token out, batching concurrent requests.

Why it is built this way:

- One worker thread owns the model and the KV cache. Coroutines only enqueue a request and await a
  future, so the event loop stays responsive while forward passes run (torch releases the GIL), and
  results come back through `loop.call_soon_threadsafe`.
- Batching is iteration-level: between two decode steps the worker admits waiting requests. They are
  prefilled together (left-padded), then their cache is merged into the running batch by padding the
  shorter cache on the left with masked slots. Rotary positions are per row (the count of real tokens),
  and keys carry their rotation, so padding changes a row's numbers only by float noise.
- Keys and values live in a preallocated `SlotCache` written in place, and grouped kv heads are never
  repeated (`models/kv.py` says why: at long contexts both copies cost more than the attention itself).
- Prefix reuse: when a request finishes, its row's keys/values and the exact ids they cover are kept
  under its (sticky, per-episode) request id in a `PrefixStore` with a byte budget; the next request
  with that id prefills only the tokens after the longest common prefix. A turn of an agent episode
  then costs its new tokens, not its whole history.
- The logprob of a token is the raw model log-softmax (temperature 1, before top-k/top-p) in fp32:
  that is what a trainer recomputes with one teacher-forced pass.
- Engines never assume the tokenizer's eos (SmolLM2 reports `<|im_start|>`); callers pass stop ids.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import secrets
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from uniagent.errors import EngineError
from uniagent.models.base import FinishReason, Generation, SamplingParams
from uniagent.models.kv import Dims, Prefix, PrefixStore, SlotCache, supports_slots, use_gqa_attention
from uniagent.models.loading import ModelSource, load_causal_lm, resolve_model
from uniagent.models.registry import EngineKind

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from uniagent.models.config import ModelConfig

log = logging.getLogger(__name__)

_PAD_ID = 0  # any valid id: padded slots are masked out and never read back
DEFAULT_PREFIX_CACHE_BYTES = 2 * 1024**3
_SPARE = 256  # decode columns reserved past a prefill or merge; the cache grows by chunks after that


@dataclass
class EngineStats:
    """Counters a caller (or a test) can read to see how work was batched.

    `prefill_batches` counts groups of requests admitted together (one prefill forward each);
    with iteration-level joining a group joins the running batch instead of waiting for it.
    `prefill_tokens` counts prompt tokens actually run; `prefix_hits` requests that reused a kept
    prefix and `prefix_reused_tokens` the prompt tokens they did not run again.
    """

    requests: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    prefill_batches: int = 0
    decode_steps: int = 0
    generated_tokens: int = 0
    max_rows: int = 0
    prefill_tokens: int = 0
    prefix_hits: int = 0
    prefix_reused_tokens: int = 0


@dataclass(eq=False)
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    request_id: str
    stop_ids: frozenset[int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    # Set on the event-loop thread when the awaiting coroutine is cancelled; the worker only reads it.
    cancelled: bool = False
    # Called on the request's event loop with (token_id, logprob) as each token is sampled (streaming).
    on_token: Callable[[int, float], None] | None = None
    # Set by the worker at admission: the kept prefix this request took over and how much of it it reuses.
    prefix: Prefix | None = None
    reused: int = 0

    @property
    def budget(self) -> int:
        """Worst-case tokens this request holds in the cache; what admission control adds up."""
        return len(self.prompt_ids) + self.sampling.max_tokens


@dataclass(eq=False)
class _Row:
    request: _Request
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None


@dataclass(eq=False)
class _Batch:
    """Rows decoded together and their shared cache. `mask` ([rows, cache_len], real slots) is kept here
    only for a `DynamicCache` (models `SlotCache` cannot serve); a `SlotCache` holds its own."""

    rows: list[_Row]
    cache: Any
    mask: torch.Tensor | None = None

    @property
    def budget(self) -> int:
        return sum(row.request.budget for row in self.rows)


class LocalEngine:
    """A `TokenEngine` over a transformers causal LM on CPU or CUDA.

    `model` is a spec for `resolve_model` (default: the packaged SmolLM2), a `ModelSource`, or an
    already-loaded model whose weights are shared (see `from_model`). `eos_token_ids` are stop ids added
    to every request, for callers that want them without passing them each time.

    Admission caps bound memory, not fairness: at most `max_batch_size` rows decode together, their
    worst-case tokens (prompt + max_tokens each) stay under `max_batch_tokens`, and one prefill pads at
    most `max_prefill_tokens`. A request over a cap still runs, alone. Requests are admitted in arrival
    order; a queued request that does not fit waits for rows to finish.

    `prefix_cache_bytes` bounds the keys/values kept between the turns of episodes (per request id,
    least recently used dropped first; SmolLM2-135M in fp32 needs 46 KiB per token, so the 2 GiB default
    holds ~45,000 tokens); 0 turns prefix reuse off. Models with sliding-window layers keep the plain
    transformers cache: no reuse, and a running batch does not take in new requests.
    """

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
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    ) -> None:
        if max_batch_size < 1:
            raise EngineError(f"max_batch_size must be >= 1, got {max_batch_size}")
        loader: Callable[[], torch.nn.Module] | None = None
        if isinstance(model, torch.nn.Module):
            self.name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
        else:
            source = model if isinstance(model, ModelSource) else resolve_model(model)
            if device.startswith("cuda") and not torch.cuda.is_available():
                raise EngineError(f"device {device!r} requested but CUDA is not available; use device='cpu'")
            self.name = source.name
            loader = functools.partial(load_causal_lm, source, device=device, dtype=dtype)
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_prefill_tokens = max_prefill_tokens
        self.batch_wait_s = batch_wait_s
        self._max_model_len = max_model_len
        self._eos_ids = frozenset(int(i) for i in eos_token_ids)
        self._stats = EngineStats()
        self._prefixes = PrefixStore(prefix_cache_bytes)
        self._pending: collections.deque[_Request] = collections.deque()
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
        self._slots = supports_slots(model)
        self._dims = Dims.of(model) if self._slots else None
        if not self._slots:
            self._prefixes.budget_bytes = 0
        if owned and self._slots:
            use_gqa_attention(model)
        self.device = next(model.parameters()).device
        self._vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.max_model_len = self._max_model_len or getattr(model.config, "max_position_embeddings", None)

    # ----------------------------------------------------------------------------------- public API

    @classmethod
    def from_model(cls, model: torch.nn.Module, **options: Any) -> LocalEngine:
        """Serve an already-loaded model without copying it, so a trainer's weight updates are seen.

        The caller keeps ownership: the engine does not change the model's device or train/eval mode,
        and the caller must not update weights while a generation is running.
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
        request = _Request(
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

    def close(self, timeout: float = 60.0) -> None:
        """Stop the worker; requests still queued or running fail with `EngineError`."""
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
        CPU. Keeping load and decode in this thread avoids creating that second team.
        """
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
        batch: _Batch | None = None
        try:
            with torch.inference_mode():
                while True:
                    admitted = self._take(batch)
                    if admitted is None:
                        break
                    batch = self._step(batch, admitted)
        except BaseException as exc:  # a bug here must not leave awaiting coroutines hanging
            log.exception("LocalEngine worker crashed")
            with self._cond:
                self._closing = True
            self._fail_all(batch, EngineError(f"LocalEngine worker crashed: {exc!r}"))
            return
        self._fail_all(batch, EngineError("LocalEngine was closed before the request finished"))

    def _step(self, batch: _Batch | None, admitted: list[_Request]) -> _Batch | None:
        """Admit new requests, then run one decode step. An error fails the rows it touched only."""
        if admitted:
            try:
                joined = self._prefill(admitted)
            except Exception as exc:  # the running batch is untouched: only the newcomers fail
                self._fail_rows([], exc, extra=admitted)
            else:
                if batch is None:
                    batch = joined
                else:
                    try:
                        batch = self._merge(batch, joined)
                    except Exception as exc:  # the cache may be half-merged: nothing in it is trustworthy
                        self._fail_rows(batch.rows + joined.rows, exc)
                        return None
        if batch is None:
            return None
        batch = self._compact(batch)
        if batch is None:
            return None
        try:
            self._decode(batch)
        except Exception as exc:
            self._fail_rows(batch.rows, exc)
            return None
        return self._compact(batch)

    def _take(self, batch: _Batch | None) -> list[_Request] | None:
        """Pop the requests that fit next to `batch`; block while idle. `None` means: shut down."""
        with self._cond:
            if batch is None:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._closing and self.batch_wait_s > 0:
                    # Requests submitted together (asyncio.gather) arrive a few microseconds apart;
                    # a short window lets them share the first prefill.
                    self._cond.wait_for(
                        lambda: self._closing or len(self._pending) >= self.max_batch_size, self.batch_wait_s
                    )
            if self._closing:
                return None
            if batch is not None and not self._slots:
                return []
            rows = len(batch.rows) if batch is not None else 0
            budget = batch.budget if batch is not None else 0
            taken: list[_Request] = []
            longest = 0
            while self._pending and rows + len(taken) < self.max_batch_size:
                request = self._pending[0]
                if request.cancelled:
                    self._pending.popleft()
                    self._stats.cancelled += 1
                    continue
                reused = self._prefixes.match(request.request_id, request.prompt_ids)
                n = len(request.prompt_ids) - reused  # what this prefill runs
                fits = (
                    budget + request.budget <= self.max_batch_tokens
                    and (len(taken) + 1) * max(longest, n) <= self.max_prefill_tokens
                )
                if not fits and (taken or rows):  # an oversized request still runs, alone
                    break
                taken.append(self._pending.popleft())
                # The request owns its episode's prefix from here: a failure or cancellation drops it.
                request.prefix = self._prefixes.take(request.request_id)
                request.reused = reused
                budget += request.budget
                longest = max(longest, n)
            return taken

    def _forward(self, **inputs: Any) -> Any:
        """The one place the model is called (tests replace it to inject failures)."""
        return self._model(**inputs)

    def _prefill(self, requests: list[_Request]) -> _Batch:
        """Run the prompts' new tokens (after any reused prefix) together, in one forward pass.

        Layout of the cache: reused prefixes end at column `past` (right-aligned), new tokens fill the
        `width` columns after it (right-aligned, left-padded); columns a row does not use are masked.
        """
        past = max(r.reused for r in requests)
        width = max(len(r.prompt_ids) - r.reused for r in requests)
        ids, new, positions = [], [], []
        for r in requests:
            n, pad = len(r.prompt_ids) - r.reused, width - len(r.prompt_ids) + r.reused
            ids.append([_PAD_ID] * pad + r.prompt_ids[r.reused :])
            new.append([0] * pad + [1] * n)
            positions.append([0] * pad + list(range(r.reused, len(r.prompt_ids))))
        new_mask = torch.tensor(new, dtype=torch.bool, device=self.device)
        if self._slots:
            assert self._dims is not None
            spare = min(max(r.sampling.max_tokens for r in requests), _SPARE) + 1
            cache = SlotCache(self._dims, len(requests), past + width + spare)
            cache.advance(past)
            for i, r in enumerate(requests):
                if r.prefix is not None and r.reused:
                    keys = [k[:, : r.reused] for k in r.prefix.keys]
                    values = [v[:, : r.reused] for v in r.prefix.values]
                    cache.place(i, keys, values, end=past)
                r.prefix = None  # placed (or not reusable): the store's copy is no longer needed
            mask = cache.attention_mask(new_mask)
        else:
            from transformers import DynamicCache

            cache, mask = DynamicCache(config=self._model.config), new_mask
        out = self._forward(
            input_ids=torch.tensor(ids, device=self.device),
            attention_mask=mask,
            position_ids=torch.tensor(positions, device=self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self._stats.prefill_batches += 1
        self._stats.prefill_tokens += sum(new_row.count(1) for new_row in new)
        hits = [r for r in requests if r.reused]
        self._stats.prefix_hits += len(hits)
        self._stats.prefix_reused_tokens += sum(r.reused for r in hits)
        rows = [_Row(request=r, generator=self._generator(r.sampling)) for r in requests]
        self._accept(rows, out.logits[:, -1, :])
        if self._slots:
            cache.advance(width)
            return _Batch(rows=rows, cache=cache)
        return _Batch(rows=rows, cache=out.past_key_values, mask=new_mask.long())

    def _decode(self, batch: _Batch) -> None:
        n = len(batch.rows)
        ids = torch.tensor([[row.token_ids[-1]] for row in batch.rows], device=self.device)
        positions = torch.tensor(
            [[len(row.request.prompt_ids) + len(row.token_ids) - 1] for row in batch.rows], device=self.device
        )
        if self._slots:
            mask = batch.cache.attention_mask(torch.ones((n, 1), dtype=torch.bool, device=self.device))
        else:
            assert batch.mask is not None
            batch.mask = mask = torch.cat([batch.mask, batch.mask.new_ones((n, 1))], dim=1)
        out = self._forward(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=batch.cache,
            use_cache=True,
        )
        if self._slots:
            batch.cache.advance(1)
        else:
            batch.cache = out.past_key_values
        self._stats.decode_steps += 1
        self._stats.max_rows = max(self._stats.max_rows, n)
        self._accept(batch.rows, out.logits[:, -1, :])

    def _accept(self, rows: list[_Row], logits: torch.Tensor) -> None:
        """Pick each row's next token, record it with its raw logprob, and settle finished rows."""
        logits = logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logits.argmax(dim=-1).tolist()
        for i, row in enumerate(rows):
            if row.request.sampling.temperature > 0:
                chosen[i] = _sample(logits[i], row.request.sampling, row.generator)
        picked = logprobs.gather(1, torch.tensor(chosen, device=logits.device)[:, None]).squeeze(1).tolist()
        for row, token, logprob in zip(rows, chosen, picked, strict=True):
            row.token_ids.append(token)
            row.logprobs.append(logprob)
            self._stats.generated_tokens += 1
            if row.request.on_token is not None:
                _emit(row.request, token, logprob)
            row.finish = self._finish_reason(row, token)
            if row.finish is not None:
                self._stats.completed += 1
                _settle(row.request, Generation(row.token_ids, row.logprobs, row.finish))

    def _finish_reason(self, row: _Row, token: int) -> FinishReason | None:
        if token in row.request.stop_ids:
            return "stop"
        if len(row.token_ids) >= row.request.sampling.max_tokens:
            return "length"
        if (
            self.max_model_len is not None
            and len(row.request.prompt_ids) + len(row.token_ids) >= self.max_model_len
        ):
            return "length"
        return None

    def _generator(self, sampling: SamplingParams) -> torch.Generator | None:
        if sampling.temperature == 0:
            return None
        generator = torch.Generator(device=self.device)
        generator.manual_seed(sampling.seed if sampling.seed is not None else secrets.randbits(63))
        return generator

    def _merge(self, batch: _Batch, joined: _Batch) -> _Batch:
        """Stack two batches (one copy of both caches, right-aligned: see `SlotCache.merge`)."""
        spare = min(max(row.request.sampling.max_tokens for row in batch.rows + joined.rows), _SPARE) + 1
        return _Batch(rows=batch.rows + joined.rows, cache=SlotCache.merge(batch.cache, joined.cache, spare))

    def _compact(self, batch: _Batch) -> _Batch | None:
        """Keep finished rows' prefixes, then drop finished and cancelled rows (and columns nobody uses)."""
        keep = [i for i, row in enumerate(batch.rows) if row.finish is None and not row.request.cancelled]
        self._stats.cancelled += sum(1 for row in batch.rows if row.finish is None and row.request.cancelled)
        if len(keep) == len(batch.rows):
            return batch
        if self._prefixes.budget_bytes:
            for i, row in enumerate(batch.rows):
                if row.finish is not None:
                    self._keep_prefix(batch.cache, i, row)
        if not keep:
            return None
        if self._slots:
            batch.cache.select(keep)
        else:
            assert batch.mask is not None
            index = torch.tensor(keep, device=self.device)
            batch.cache.batch_select_indices(index)
            batch.mask = batch.mask[index]
        batch.rows = [batch.rows[i] for i in keep]
        return batch

    def _keep_prefix(self, cache: SlotCache, index: int, row: _Row) -> None:
        """Store what row `index` has in the cache: its prompt and every generated token but the last
        (sampled, never run). The count of real slots must match the ids, or nothing is stored."""
        ids = row.request.prompt_ids + row.token_ids[:-1]
        keys, values = cache.row_kv(index)
        if keys[0].shape[1] != len(ids):
            log.warning("LocalEngine: %s slots for %s ids; prefix not kept", keys[0].shape[1], len(ids))
            return
        self._prefixes.put(row.request.request_id, Prefix(ids=ids, keys=keys, values=values))

    def _fail_rows(self, rows: list[_Row], exc: Exception, extra: Iterable[_Request] = ()) -> None:
        log.warning("LocalEngine step failed: %r", exc)
        requests = [row.request for row in rows if row.finish is None] + list(extra)
        for request in requests:
            self._stats.failed += 1
            error = EngineError(
                f"LocalEngine failed while generating request {request.request_id!r}: {exc!r}"
            )
            error.__cause__ = exc
            _settle(request, error)

    def _fail_all(self, batch: _Batch | None, error: EngineError) -> None:
        with self._cond:
            pending = list(self._pending)
            self._pending.clear()
        rows = [row.request for row in batch.rows if row.finish is None] if batch is not None else []
        for request in rows + pending:
            self._stats.failed += 1
            _settle(request, EngineError(f"request {request.request_id!r}: {error}"))


def _sample(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> int:
    """Temperature, then top-k, then top-p (nucleus), then one draw from the row's own generator."""
    scores = logits / sampling.temperature
    if 0 < sampling.top_k < scores.numel():
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = scores.sort(descending=True)
        probs = ordered.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the most likely token always stays).
        drop = (probs.cumsum(dim=-1) - probs) >= sampling.top_p
        ordered = ordered.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(0, order, ordered)
    probs = scores.softmax(dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _emit(request: _Request, token: int, logprob: float) -> None:
    """Stream one token to the request's event loop (queued before its settle, so it arrives first)."""
    callback = request.on_token
    assert callback is not None

    def emit() -> None:
        if not request.future.done():
            callback(token, logprob)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed
        request.loop.call_soon_threadsafe(emit)


def _settle(request: _Request, outcome: Generation | BaseException) -> None:
    """Hand a result to the request's event loop; the worker must never touch the future directly."""

    def settle() -> None:
        if request.future.done():  # cancelled by the caller meanwhile
            return
        if isinstance(outcome, BaseException):
            request.future.set_exception(outcome)
        else:
            request.future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is waiting any more
        request.loop.call_soon_threadsafe(settle)


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
    return await LocalEngine.create(
        arg or None,
        max_batch_size=config.max_batch_size,
        device=config.device,
        prefix_cache_bytes=config.prefix_cache_bytes,
    )


async def _doctor(arg: str, config: ModelConfig, quick: bool) -> list[tuple[str, bool | None, str]]:
    return await doctor_check(arg or None, generate=not quick)


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
