"""The batch mechanics of `LocalEngine`: prefill, decode, sampling, merge, compaction, prefix keeping.

`LocalEngine` (models/local.py) queues requests and admits them; a `BatchRunner` it owns runs the
admitted rows on the model, only ever from the engine's worker thread. Why it is built this way:

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
- Shared prefill: fresh requests prefilled together run the prompt start they share once (a batch-1
  pass) and every row takes it as a reused prefix; the store keeps it as its shared entry for fresh
  requests that come later. A group of 4 samples of one task then runs ~1 turn-1 prompt, not 4. A fresh
  request prefilled alone while the store has no shared entry leaves its prompt as that entry: a run's
  first episode is often admitted alone, and the next ones reuse its start.
- The logprob of a token is the raw model log-softmax (temperature 1, before top-k/top-p) in fp32:
  that is what a trainer recomputes with one teacher-forced pass. Trainers that recompute with the
  logits divided by the sampling temperature (verl: `logits / rollout.temperature`, its vLLM servers
  run `logprobs_mode="processed_logprobs"`) get that instead from an engine built with
  `logprobs_mode="scaled"`: log-softmax of logits / temperature (greedy rows: temperature 1), still
  before top-k/top-p, which verl's recompute does not apply either.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any

import torch

import uniagent.models.kv as kv  # the module: tests patch its buffer growth (kv._CHUNK)
from uniagent.errors import EngineError
from uniagent.models.base import FinishReason, SamplingParams
from uniagent.models.kv import Dims, SlotCache, supports_slots
from uniagent.models.kv_prefix import MIN_SHARED, Prefix, PrefixStore, common_prefix
from uniagent.models.local_memory import MemoryPlan, Running
from uniagent.models.local_rows import Batch, EngineStats, Request, Row, emit, settle

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

_PAD_ID = 0  # any valid id: padded slots are masked out and never read back
_SPARE = 256  # decode columns reserved past a prefill or merge; the cache grows by chunks after that


class BatchRunner:
    """Runs admitted requests on one model, one step at a time, and settles them as they finish.

    `forward` is how the model is called (the engine's `_forward`, which tests replace to inject
    failures); `stats` and `prefixes` are the engine's own, updated in place. `max_model_len` ends a
    row at the model's context. `version` tags every token sampled (the engine sets it when it applies a
    weight update). Models with sliding-window layers (`slots` False) keep the plain
    transformers cache: no prefix reuse, and a running batch does not take in new requests.
    `prefill_tokens` caps the padded tokens of one prefill forward: longer prefills run in column
    chunks. `budget_bytes` is the engine's memory budget: after rows finish, kept prefixes are cut
    to what the running batch leaves of it (models/local_memory.py).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        forward: Callable[..., Any],
        stats: EngineStats,
        prefixes: PrefixStore,
        max_model_len: int | None,
        version: int = 0,
        prefill_tokens: int = 16384,
        budget_bytes: int | None = None,
        scaled_logprobs: bool = False,
    ) -> None:
        self.model = model
        self.version = version
        self.slots = supports_slots(model)
        self.dims = Dims.of(model) if self.slots else None
        self.device = next(model.parameters()).device
        self.max_model_len = max_model_len
        self._forward = forward
        self._stats = stats
        self._prefixes = prefixes
        self.prefill_tokens = prefill_tokens
        self.budget_bytes = budget_bytes
        self.plan = MemoryPlan.of(self.dims, model.config, _SPARE, kv._CHUNK) if self.dims else None
        self.scaled_logprobs = scaled_logprobs  # the engine's logprobs_mode == "scaled" (module docstring)

    def running(self, batch: Batch | None) -> Running | None:
        """The running batch as admission sees it (None: nothing runs, or no slot cache)."""
        if batch is None or not self.slots:
            return None
        left = max(row.request.sampling.max_tokens - len(row.token_ids) for row in batch.rows)
        return Running(len(batch.rows), batch.cache.capacity, batch.cache.length, left)

    def _run_columns(
        self, cache: SlotCache, ids: list[list[int]], positions: list[list[int]], new: Any
    ) -> Any:
        """Run a prefill's columns into `cache` in chunks of at most `prefill_tokens` padded tokens (an
        attention mask and activations of [rows, chunk] instead of [rows, width]); the last chunk's
        logits. Each chunk attends to the columns before it, so the result is the unchunked one up to
        float noise."""
        rows, width = len(ids), len(ids[0])
        step = self.plan.chunk_columns(rows, self.prefill_tokens) if self.plan else width
        input_ids = torch.tensor(ids, device=self.device)
        position_ids = torch.tensor(positions, device=self.device)
        out = None
        for a in range(0, width, step):
            b = min(width, a + step)
            out = self._forward(
                input_ids=input_ids[:, a:b],
                attention_mask=cache.attention_mask(new[:, a:b]),
                position_ids=position_ids[:, a:b],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache.advance(b - a)
        assert out is not None
        return out.logits[:, -1, :]

    def step(self, batch: Batch | None, admitted: list[Request]) -> Batch | None:
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

    def _prefill(self, requests: list[Request]) -> Batch:
        """Run the prompts' new tokens (after any reused prefix) together, in one forward pass.

        Layout of the cache: reused prefixes end at column `past` (right-aligned), new tokens fill the
        `width` columns after it (right-aligned, left-padded); columns a row does not use are masked.
        """
        if self.slots and self._prefixes.budget_bytes:
            self._share_prefix(requests)
        past = max(r.reused for r in requests)
        width = max(len(r.prompt_ids) - r.reused for r in requests)
        ids, new, positions = [], [], []
        for r in requests:
            n, pad = len(r.prompt_ids) - r.reused, width - len(r.prompt_ids) + r.reused
            ids.append([_PAD_ID] * pad + r.prompt_ids[r.reused :])
            new.append([0] * pad + [1] * n)
            positions.append([0] * pad + list(range(r.reused, len(r.prompt_ids))))
        new_mask = torch.tensor(new, dtype=torch.bool, device=self.device)
        if self.slots:
            assert self.dims is not None
            spare = min(max(r.sampling.max_tokens for r in requests), _SPARE) + 1
            cache = SlotCache(self.dims, len(requests), past + width + spare)
            cache.advance(past)
            for i, r in enumerate(requests):
                if r.prefix is not None and r.reused:
                    keys = [k[:, : r.reused] for k in r.prefix.keys]
                    values = [v[:, : r.reused] for v in r.prefix.values]
                    cache.place(i, keys, values, end=past)
                r.prefix = None  # placed (or not reusable): the store's copy is no longer needed
            logits = self._run_columns(cache, ids, positions, new_mask)
            self._share_fresh_prompt(cache, requests)
        else:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.model.config)
            out = self._forward(
                input_ids=torch.tensor(ids, device=self.device),
                attention_mask=new_mask,
                position_ids=torch.tensor(positions, device=self.device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1, :]
        self._stats.prefill_batches += 1
        self._stats.prefill_tokens += sum(new_row.count(1) for new_row in new)
        hits = [r for r in requests if r.reused]
        self._stats.prefix_hits += len(hits)
        self._stats.prefix_reused_tokens += sum(r.reused for r in hits)
        rows = [
            Row(request=r, generator=r.generator if r.generator is not None else self._generator(r.sampling))
            for r in requests
        ]
        self._accept(rows, logits)
        if self.slots:
            return Batch(rows=rows, cache=cache)
        return Batch(rows=rows, cache=out.past_key_values, mask=new_mask.long())

    def _share_prefix(self, requests: list[Request]) -> None:
        """Requests with (next to) nothing reused that start with the same tokens: run those tokens
        once, give every such request the result as its reused prefix, and keep it as the store's
        shared entry. The keys/values are the same as each row's own up to float noise (as for any
        reused prefix: one pass at batch 1 instead of padded rows)."""
        fresh = [r for r in requests if r.reused < MIN_SHARED]
        if len(fresh) < 2:
            return
        ids = fresh[0].prompt_ids
        n = len(ids) - 1
        for r in fresh[1:]:
            n = min(n, len(r.prompt_ids) - 1, common_prefix(ids, r.prompt_ids))
        if n < MIN_SHARED:
            return
        assert self.dims is not None
        cache = SlotCache(self.dims, 1, n)
        new = torch.ones((1, n), dtype=torch.bool, device=self.device)
        self._run_columns(cache, [list(ids[:n])], [list(range(n))], new)
        keys, values = cache.row_kv(0)
        shared = Prefix(ids=list(ids[:n]), keys=keys, values=values)
        self._stats.prefill_batches += 1
        self._stats.prefill_tokens += n
        for r in fresh:
            r.prefix, r.reused = shared, n
        self._prefixes.share(shared)

    def _share_fresh_prompt(self, cache: SlotCache, requests: list[Request]) -> None:
        """With no shared entry in the store, keep a fresh request's prompt as one: the first episode of
        a run is often admitted alone (its sandbox was ready first), and the ones that follow a moment
        later reuse its start (system prompt, instructions) instead of running it again. One copy of
        the row's keys/values; the store's budget and eviction apply as to any shared entry."""
        if not self._prefixes.budget_bytes or self._prefixes.shared is not None:
            return
        fresh = [i for i, r in enumerate(requests) if r.reused == 0 and len(r.prompt_ids) > MIN_SHARED]
        if not fresh:
            return
        prefix = _row_prefix(cache, fresh[0], list(requests[fresh[0]].prompt_ids))
        if prefix is not None:
            self._prefixes.share(prefix)

    def _decode(self, batch: Batch) -> None:
        n = len(batch.rows)
        ids = torch.tensor([[row.token_ids[-1]] for row in batch.rows], device=self.device)
        positions = torch.tensor(
            [[len(row.request.prompt_ids) + len(row.token_ids) - 1] for row in batch.rows], device=self.device
        )
        if self.slots:
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
        if self.slots:
            batch.cache.advance(1)
        else:
            batch.cache = out.past_key_values
        self._stats.decode_steps += 1
        self._stats.max_rows = max(self._stats.max_rows, n)
        self._accept(batch.rows, out.logits[:, -1, :])

    def _accept(self, rows: list[Row], logits: torch.Tensor) -> None:
        """Pick each row's next token, record it with its raw logprob, and settle finished rows."""
        logits = logits.float()
        if self.scaled_logprobs:  # the sampling distribution's own logprob (verl's "processed_logprobs")
            temps = [r.request.sampling.temperature or 1.0 for r in rows]
            logprobs = torch.log_softmax(logits / torch.tensor(temps, device=logits.device)[:, None], dim=-1)
        else:
            logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logits.argmax(dim=-1).tolist()
        for i, row in enumerate(rows):
            if row.request.sampling.temperature > 0:
                chosen[i] = _sample(logits[i], row.request.sampling, row.generator)
        picked = logprobs.gather(1, torch.tensor(chosen, device=logits.device)[:, None]).squeeze(1).tolist()
        for row, token, logprob in zip(rows, chosen, picked, strict=True):
            row.token_ids.append(token)
            row.logprobs.append(logprob)
            row.versions.append(self.version)
            self._stats.generated_tokens += 1
            if row.request.on_token is not None:
                emit(row.request, token, logprob)
            row.finish = self._finish_reason(row, token)
            if row.finish is not None:
                self._stats.completed += 1
                settle(row.request, row.result(row.finish))

    def interrupt(self, batch: Batch | None) -> list[Request]:
        """Take every unfinished row out of `batch` as a continuation to queue again; the batch (and its
        cache) must then be dropped. A continuation is the same `Request` (future, callback, cancellation
        flag), its prompt extended by the tokens so far, `max_tokens` reduced by them, its tokens carried
        and its sampling stream kept. A row already at `max_model_len` ends "length" instead."""
        out: list[Request] = []
        for row in batch.rows if batch is not None else []:
            r = row.request
            if row.finish is not None:
                continue
            if r.cancelled:
                self._stats.cancelled += 1
                continue
            r.prompt_ids = r.prompt_ids + row.token_ids
            left = r.sampling.max_tokens - len(row.token_ids)
            r.sampling = r.sampling.model_copy(update={"max_tokens": left})
            r.generator, r.prefix, r.reused = row.generator, None, 0
            if self.max_model_len is not None and len(r.prompt_ids) >= self.max_model_len:
                self._stats.completed += 1
                settle(r, row.result("length"))
                continue
            r.carried_ids += row.token_ids
            r.carried_logprobs += row.logprobs
            r.carried_versions += row.versions
            out.append(r)
        return out

    def _finish_reason(self, row: Row, token: int) -> FinishReason | None:
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

    def _merge(self, batch: Batch, joined: Batch) -> Batch:
        """Stack two batches (one copy of both caches, right-aligned: see `SlotCache.merge`)."""
        spare = min(max(row.request.sampling.max_tokens for row in batch.rows + joined.rows), _SPARE) + 1
        # Consumes both caches (layer by layer: see `SlotCache.merge`).
        return Batch(rows=batch.rows + joined.rows, cache=SlotCache.merge(batch.cache, joined.cache, spare))

    def _compact(self, batch: Batch) -> Batch | None:
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
            self._fit_prefixes(None)
            return None
        if self.slots:
            batch.cache.select(keep)
        else:
            assert batch.mask is not None
            index = torch.tensor(keep, device=self.device)
            batch.cache.batch_select_indices(index)
            batch.mask = batch.mask[index]
        batch.rows = [batch.rows[i] for i in keep]
        self._fit_prefixes(batch)
        return batch

    def _fit_prefixes(self, batch: Batch | None) -> None:
        """Kept prefixes get what the running batch, at its widest, leaves of the memory budget."""
        if self.budget_bytes is None or self.plan is None or not self._prefixes.nbytes:
            return
        self._prefixes.fit(self.budget_bytes - self.plan.admission_peak(self.running(batch), [], 0))

    def _keep_prefix(self, cache: SlotCache, index: int, row: Row) -> None:
        """Store what row `index` has in the cache: its prompt and every generated token but the last
        (sampled, never run). The count of real slots must match the ids, or nothing is stored."""
        prefix = _row_prefix(cache, index, row.request.prompt_ids + row.token_ids[:-1])
        if prefix is not None:
            self._prefixes.put(row.request.request_id, prefix)

    def _fail_rows(self, rows: list[Row], exc: Exception, extra: Iterable[Request] = ()) -> None:
        log.warning("LocalEngine step failed: %r", exc)
        requests = [row.request for row in rows if row.finish is None] + list(extra)
        for request in requests:
            self._stats.failed += 1
            error = EngineError(
                f"LocalEngine failed while generating request {request.request_id!r}: {exc!r}"
            )
            error.__cause__ = exc
            settle(request, error)


def _row_prefix(cache: SlotCache, index: int, ids: list[int]) -> Prefix | None:
    """Row `index`'s keys/values (a copy) as the prefix of `ids`; None, said in the log, where the row's
    real slots do not count exactly `ids` (a prefix kept under the wrong ids would be reused wrongly)."""
    keys, values = cache.row_kv(index)
    if keys[0].shape[1] != len(ids):
        log.warning("LocalEngine: %s slots for %s ids; prefix not kept", keys[0].shape[1], len(ids))
        return None
    return Prefix(ids=ids, keys=keys, values=values)


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
    # One draw by the inverse of the cumulative distribution (fp64, so no token's share is lost to
    # rounding): one uniform number from the row's generator. `torch.multinomial` draws one exponential
    # per vocabulary entry for a single sample: 1.1 ms a row over SmolLM2's 49,152 entries against
    # 0.16 ms here, 8.6 ms of a 43 ms decode step at 8 rows.
    cdf = scores.softmax(dim=-1, dtype=torch.float64).cumsum(dim=-1)
    u = torch.rand((), dtype=torch.float64, device=cdf.device, generator=generator) * cdf[-1]
    return int(torch.searchsorted(cdf, u, right=True).clamp_max(cdf.numel() - 1).item())
