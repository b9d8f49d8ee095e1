"""Key/value storage for `LocalEngine`: a batch cache written in place, and the per-episode prefix store.

Why it is built this way (measured with py-spy on 2 CPU cores, SmolLM2-135M, 2,000-token prompts):

- transformers' `DynamicCache` appends with `torch.cat`: every decode step copies every layer's whole
  cache (~17% of a 4-row decode step at 2K tokens). `SlotCache` preallocates one
  `[rows, kv_heads, capacity, head_dim]` buffer per layer, grows it in chunks, writes each step's keys
  and values in place and hands attention a view.
- transformers' `sdpa` attention repeats the key/value heads of a grouped-query model (SmolLM2: 9 query
  heads over 3 kv heads) whenever a mask is given, i.e. whenever rows of a batch are padded: it copies
  the cache 3x per layer per step (a 8x3,000-token step: 205 ms per layer instead of 31 ms). torch's CPU
  SDPA accepts `enable_gqa=True` together with a mask, so `gqa_sdpa_attention` passes the heads through
  unrepeated; it is registered with transformers as the attention implementation `"uniagent_sdpa"`.
- `PrefixStore` (models/kv_prefix.py) keeps, per sticky request id (one episode), the exact token
  ids whose keys/values it holds, bounded by a byte budget with least-recently-used eviction. A new
  prompt reuses only the longest common prefix of those ids, so a changed history is never reused; an
  entry is taken out while its request runs, so a request that fails or is cancelled leaves nothing
  behind.
- It also holds one shared entry: the prompt start that fresh requests prefilled together had in
  common (a GRPO group's prompt, the system prompt and tool schemas of every task). A request with
  no longer entry of its own reuses it and leaves it in place. On a 2-core CPU the turn-1 prompt
  (~400 tokens) was most of a lookup training step's engine time; every episode ran it again.

Rows of a batch are aligned on the right; each row's real slots are marked in `mask` (a boolean per
column). Columns a row does not use (left padding, or the gap between a reused prefix and its new
tokens) are masked for every query, and rotary positions are per row (the engine passes them), so a
row's numbers do not depend on its neighbours beyond float noise.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

import uniagent.models.attention as attention

ATTENTION = "uniagent_sdpa"
MAPPED_MIN_BYTES = 1 << 20  # keys/values from this size up get a mapping of their own
_CHUNK = 256  # columns a buffer grows by when a decode step would overflow it
_EMPTY = torch.empty(0)  # a buffer already handed over (merge) or not yet allocated


def gqa_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, except that on CPU grouped kv heads are never repeated (see above).

    A decode step (one query per row) runs the kernel `models/attention.py` chose for this CPU and dtype,
    a bf16 prefill the prefill kernel it chose.
    Elsewhere (CUDA: SDPA with a mask and `enable_gqa` falls back to its math kernel) it is the stock one.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.device.type != "cpu" or not hasattr(module, "num_key_value_groups"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if query.shape[2] == 1:  # decode: the kernel chosen for decode, else SDPA
        out = attention.single_query(query, key, value, attention_mask, scale)
        if out is not None:
            return out.transpose(1, 2).contiguous(), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)  # SDPA's is_causal, one meaning
    if query.shape[2] > 1 and not dropout:  # prefill: the kernel chosen for prefill, else SDPA
        out = attention.multi_query(query, key, value, attention_mask, scale, causal)
        if out is not None:
            return out, None
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def mapped_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed CPU tensor in an anonymous mapping of its own: its memory goes back to the system when
    the tensor is freed (the mapping is unmapped with it), and pages are only touched as they are
    written. Small tensors and other devices are allocated as usual."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < MAPPED_MIN_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)


def use_gqa_attention(model: torch.nn.Module) -> None:
    """Register `gqa_sdpa_attention` with transformers and switch `model` to it (only `sdpa` models)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    attention.choice()  # the decode kernel's probe (a child, once per CPU) runs here, not mid-step
    AttentionInterface.register(ATTENTION, gqa_sdpa_attention)
    if ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(ATTENTION)


def supports_slots(model: torch.nn.Module) -> bool:
    """`SlotCache` is valid for decoders whose every layer is plain full attention (no sliding window)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    sliding = getattr(config, "sliding_window", None)
    return not sliding or getattr(config, "use_sliding_window", True) is False


@dataclass
class Dims:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, model: torch.nn.Module) -> Dims:
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = config.num_attention_heads
        param = next(model.parameters())
        return cls(
            layers=config.num_hidden_layers,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            dtype=param.dtype,
            device=param.device,
        )

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8


class _Layer(CacheLayerMixin):
    """One model layer's view of a `SlotCache`; transformers calls `update` from the attention module."""

    is_sliding = False
    is_compileable = False

    def __init__(self, owner: SlotCache, index: int) -> None:
        super().__init__()
        self.owner, self.index, self.is_initialized = owner, index, True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return self.owner.write(self.index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_cache_shape(self) -> int:
        return -1


class SlotCache(Cache):
    """Preallocated keys/values for the rows of one batch; the live columns are `[start, start+length)`.

    A forward pass writes its `q` new columns after the live ones (`write`); the engine then calls
    `advance(q)`. Rows leave with `select`, batches join with `merge`: both copy once, never per step.
    """

    def __init__(self, dims: Dims, rows: int, capacity: int, allocate: bool = True) -> None:
        super().__init__(layers=[_Layer(self, i) for i in range(dims.layers)])
        self.dims = dims
        self.k = [self._buffer(rows, capacity) if allocate else _EMPTY for _ in range(dims.layers)]
        self.v = [self._buffer(rows, capacity) if allocate else _EMPTY for _ in range(dims.layers)]
        self.mask = torch.zeros((rows, capacity), dtype=torch.bool, device=dims.device)
        self.start = 0
        self.length = 0

    def _buffer(self, rows: int, capacity: int) -> torch.Tensor:
        shape = (rows, self.dims.kv_heads, capacity, self.dims.head_dim)
        return mapped_zeros(shape, self.dims.dtype, self.dims.device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def capacity(self) -> int:
        return self.mask.shape[1]

    @property
    def end(self) -> int:
        return self.start + self.length

    def write(self, index: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[Any, Any]:
        end = self.end + keys.shape[2]
        self.k[index][:, :, self.end : end] = keys
        self.v[index][:, :, self.end : end] = values
        return self.k[index][:, :, self.start : end], self.v[index][:, :, self.start : end]

    def attention_mask(self, new: torch.Tensor) -> torch.Tensor:
        """Mark the next `new.shape[1]` columns (`new`: which of them are real per row); the live mask."""
        self.reserve(new.shape[1])
        self.mask[:, self.end : self.end + new.shape[1]] = new
        return self.mask[:, self.start : self.end + new.shape[1]]

    def advance(self, columns: int) -> None:
        self.length += columns

    def reserve(self, columns: int) -> None:
        """Make room for `columns` more; a full buffer is copied once into one a chunk larger."""
        if self.end + columns <= self.capacity:
            return
        self._relayout(list(range(self.rows)), 0, self.length + columns + _CHUNK)

    def select(self, keep: list[int]) -> None:
        """Keep only rows `keep` (in that order), then drop leading columns no remaining row uses."""
        live = self.mask[keep, self.start : self.end].any(dim=0)
        first = int(live.int().argmax()) if bool(live.any()) else self.length
        if first == 0 and keep == list(range(self.rows)):
            return
        self._relayout(keep, first, self.capacity - self.start - first)

    @classmethod
    def merge(cls, first: SlotCache, second: SlotCache, spare: int) -> SlotCache:
        """The rows of both, right-aligned (shorter rows get masked columns on the left).

        Both parts are consumed: layer by layer the merged buffer is allocated, filled and the parts'
        buffers of that layer freed, so a merge holds one layer more than the parts, not twice them."""
        width = max(first.length, second.length)
        rows = first.rows + second.rows
        merged = cls(first.dims, rows, width + spare, allocate=False)
        merged.length = width
        for store, parts in ((merged.k, (first.k, second.k)), (merged.v, (first.v, second.v))):
            for i in range(len(store)):
                store[i] = merged._buffer(rows, width + spare)
                row = 0
                for part, buffers in zip((first, second), parts, strict=True):
                    shift = width - part.length
                    store[i][row : row + part.rows, :, shift:width] = buffers[i][:, :, part.start : part.end]
                    buffers[i] = _EMPTY
                    row += part.rows
        row = 0
        for part in (first, second):
            shift = width - part.length
            merged.mask[row : row + part.rows, shift:width] = part.mask[:, part.start : part.end]
            row += part.rows
        return merged

    def _relayout(self, keep: list[int], drop: int, capacity: int) -> None:
        """Copy rows `keep`, without their first `drop` live columns, into fresh buffers of `capacity`."""
        length = self.length - drop
        index = torch.tensor(keep, device=self.mask.device)
        columns = slice(self.start + drop, self.end)
        shape = (len(keep), self.dims.kv_heads, capacity, self.dims.head_dim)
        for i in range(len(self.k)):
            for store in (self.k, self.v):
                fresh = mapped_zeros(shape, store[i].dtype, store[i].device)
                fresh[:, :, :length] = store[i].index_select(0, index)[:, :, columns]
                store[i] = fresh
        mask = self.mask.new_zeros((len(keep), capacity))
        mask[:, :length] = self.mask.index_select(0, index)[:, columns]
        self.mask, self.start, self.length = mask, 0, length

    def row_kv(self, row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Row `row`'s real slots, in order, as contiguous `[kv_heads, n, head_dim]` copies per layer."""
        columns = self.mask[row, self.start : self.end].nonzero().squeeze(1) + self.start
        shape = (self.dims.kv_heads, len(columns), self.dims.head_dim)

        def kept(buffer: torch.Tensor) -> torch.Tensor:
            out = mapped_zeros(shape, buffer.dtype, buffer.device)  # kept for long: mapped apart
            return torch.index_select(buffer[row], 1, columns, out=out)

        return [kept(k) for k in self.k], [kept(v) for v in self.v]

    def place(self, row: int, keys: list[torch.Tensor], values: list[torch.Tensor], end: int) -> None:
        """Write a stored prefix into row `row` so that it ends at live column `end` (exclusive)."""
        n = keys[0].shape[1]
        begin = self.start + end - n
        for i in range(len(self.k)):
            self.k[i][row, :, begin : begin + n] = keys[i]
            self.v[i][row, :, begin : begin + n] = values[i]
        self.mask[row, begin : begin + n] = True
